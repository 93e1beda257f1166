"""Supervision at a glance, in a real browser against a real `serve`: the runs list and the
approvals inbox follow the runs live, decided and discarded approvals look it, and the pages
hold at a phone's width."""

from __future__ import annotations

import os

import pytest

from agents import services
from agents.models import Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, status_of, wait_js
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def status_cell(page, run_id: int) -> str:
    return page.inner_text(f"#run-{run_id} .status").strip().lower()


def explain(page, run_id: int, tmp_path) -> None:
    """On a failure: what the database, the page and the server said (pytest shows it)."""
    run = Run.objects.get(pk=run_id)
    print("database:", run.status, run.status_reason)
    print("events:", list(run.events.order_by("seq").values_list("seq", "kind")))
    print("page row:", page.evaluate(f"document.querySelector('#run-{run_id}')?.outerHTML"))
    print("live state:", page.evaluate("document.querySelector('#live-state')?.outerHTML"))
    print("server log:", (tmp_path / "serve.log").read_text()[-6000:])


def test_the_runs_list_shows_new_runs_and_status_changes_live(pages, eve, tmp_path):
    # A slow demo, so its status changes can be watched one by one.
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.3") as base:
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        page.evaluate("window.__notReloaded = true")
        run = services.create_demo_run(created_by=eve)  # as the CLI would, another process
        wait_js(page, f"document.querySelector('#run-{run.pk}') !== null")
        # Its status follows it: queued, running, then waiting for a person. The run's own pace
        # (a worker's first sandboxed check on a cold machine) is not what is tested here: wait
        # for the database first, then the page must follow within seconds.
        try:
            wait_for(
                lambda: status_of(run.pk) == "awaiting_approval",
                timeout=150,
                what="the run to wait for a person",
            )
            wait_js(
                page,
                f"document.querySelector('#run-{run.pk} .status').textContent.trim().toLowerCase()"
                " === 'awaiting approval'",
                timeout=15_000,
            )
        except AssertionError:
            explain(page, run.pk, tmp_path)
            raise
        services.pause_run(run.pk, actor="user:eve")
        wait_js(
            page,
            f"document.querySelector('#run-{run.pk} .status').textContent.trim().toLowerCase()"
            " === 'paused'",
        )
        assert page.evaluate("window.__notReloaded") is True
        assert page.locator(f"#run-{run.pk}").count() == 1  # swapped in place, not added


def test_a_rewind_clears_the_badge_and_the_inbox_card_live(pages, eve, tmp_path):
    from agents import rewinds

    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        page = pages()
        log_in(page, base)
        run = services.create_demo_run(created_by=eve)
        page.goto(f"{base}/approvals/")
        wait_js(page, "document.querySelector('.approval.a-pending') !== null", timeout=90_000)
        assert page.inner_text("#approval-count").strip() == "1"
        target = Run.objects.get(pk=run.pk).checkpoints.get(kind="session_end")
        rewinds.rewind(run.pk, target.pk, actor="user:eve")
        wait_js(page, "document.querySelector('#approval-count').textContent.trim() === '0'")
        card = page.locator(".approval").first
        wait_js(page, "document.querySelector('.approval.a-discarded') !== null")
        assert "Discarded" in card.inner_text()
        assert card.locator("button[value=approve]").count() == 0  # nothing left to press
