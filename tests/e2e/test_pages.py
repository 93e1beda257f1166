"""Long lists in a real browser on a real `serve`: paging through the runs list by its links, and
loading a run's earlier sessions and older checkpoints a page at a time (htmx swaps)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from agents import checkpoints as cps
from agents import services
from agents.models import Run, Session
from tests.e2e.helpers import CHROMIUM, log_in, serving, wait_js
from tests.helpers import make_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def row_ids(page) -> list[int]:
    return page.eval_on_selector_all(
        "#run-rows tr[id^=run-]", "els => els.map(e => parseInt(e.id.slice(4), 10))"
    )


def test_paging_through_the_runs_list_and_a_runs_sessions(pages, eve, tmp_path, shots):
    made = Run.objects.bulk_create(
        Run(
            goal=f"bulk run {i}",
            model="m",
            created_by=eve,
            status="succeeded",
            created_at=T0 + timedelta(seconds=i // 4),
        )
        for i in range(59)
    )
    long_run = make_run(goal="the long one", created_by=eve)
    services.pause_run(long_run.pk, actor="test")
    Session.objects.bulk_create(Session(run=long_run, index=i) for i in range(1, 61))
    for i in range(30):
        cps.create(long_run.pk, kind="manual", label=f"cp-{i}")
    newest_first = [long_run.pk] + [r.pk for r in sorted(made, key=lambda r: (r.created_at, r.pk),
                                                         reverse=True)]  # fmt: skip

    with serving(tmp_path) as base:
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/")
        seen = [row_ids(page)]
        assert len(seen[0]) == 25 and "25 shown · 60 runs" in page.inner_text(".pager")
        page.get_by_role("link", name="Older →").click()
        page.wait_for_url("**/?after=*")
        seen.append(row_ids(page))
        page.screenshot(path=str(shots / "runs-list-older-page.png"))
        page.get_by_role("link", name="Older →").click()
        page.wait_for_load_state()
        seen.append(row_ids(page))
        assert [len(p) for p in seen] == [25, 25, 10]
        assert [pk for p in seen for pk in p] == newest_first
        assert page.get_by_role("link", name="Older →").count() == 0
        page.get_by_role("link", name="← Newer").click()
        page.wait_for_url("**/?before=*")
        assert row_ids(page) == seen[1]
        page.get_by_role("link", name="⇤ Newest").click()
        page.wait_for_load_state()
        assert row_ids(page) == seen[0]

        # The run page: the newest 25 sessions, earlier ones a page at a time above them.
        page.goto(f"{base}/runs/{long_run.pk}/")
        sessions = "#sessions li[id^=session-]"

        def shown() -> list[int]:
            return page.eval_on_selector_all(
                sessions, "els => els.map(e => parseInt(e.id.slice(8), 10))"
            )

        assert shown() == list(range(36, 61))
        page.get_by_role("link", name="Earlier sessions… (35 more)").click()
        wait_js(page, f"document.querySelectorAll('{sessions}').length === 50")
        assert shown() == list(range(11, 61))
        page.get_by_role("link", name="Earlier sessions… (10 more)").click()
        wait_js(page, f"document.querySelectorAll('{sessions}').length === 60")
        assert shown() == list(range(1, 61))
        assert page.locator("#sessions .older-items").count() == 0

        checkpoints = "#checkpoints li[id^=checkpoint-]"
        assert page.locator(checkpoints).count() == 25
        page.get_by_role("link", name="Older checkpoints… (5 more)").click()
        wait_js(page, f"document.querySelectorAll('{checkpoints}').length === 30")
        numbers = page.eval_on_selector_all(
            checkpoints, "els => els.map(e => parseInt(e.id.slice(11), 10))"
        )
        assert numbers == list(range(30, 0, -1))
        page.screenshot(path=str(shots / "run-page-older-sessions.png"), full_page=True)
