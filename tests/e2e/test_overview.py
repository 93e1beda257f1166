"""The Overview and Compare in a real browser against a real `serve`: a person lands on the
Overview, sees the counts and the waiting approval with its age, a count opens the runs list
filtered to exactly those runs; a fork of the demo opens Compare with the run it came from.

Set SHIFTLOG_SCREENSHOTS=DIR to keep the screenshots (the README's come from here).
"""

from __future__ import annotations

import os
import re

import pytest

from agents import services
from agents.models import Approval, Run, RunStatus
from tests.e2e.helpers import CHROMIUM, log_in, serving, start_demo, status_of, wait_js
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def listed(page) -> set[int]:
    ids = page.eval_on_selector_all("#run-rows tr[id^=run-]", "els => els.map(e => e.id)")
    return {int(i.removeprefix("run-")) for i in ids}


def test_the_overview_counts_link_to_the_runs_and_a_fork_compares_with_its_origin(
    pages, eve, tmp_path, shots
):
    # Slow turns: the fork must still be at its first checkpoint when it is compared.
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="1") as base:
        page = pages()
        log_in(page, base)  # lands on the Overview
        assert page.inner_text("h1") == "Overview"
        demo = start_demo(page, base)
        other = services.create_demo_run(created_by=eve)
        services.pause_run(other.pk, actor="user:eve")
        wait_for(lambda: status_of(other.pk) == RunStatus.PAUSED, timeout=30, what="the pause")
        wait_for(
            lambda: status_of(demo) == RunStatus.AWAITING_APPROVAL,
            timeout=90,
            what="the demo's approval",
        )
        approval = Approval.objects.get(run_id=demo, status="pending")

        page.goto(f"{base}/overview/")
        page.wait_for_selector(f"#waiting-{approval.pk}")
        assert page.inner_text("#count-awaiting_approval b") == "1"
        assert page.inner_text("#count-paused b") == "1"
        assert page.inner_text("#count-all") == "2 in all"
        waiting = page.inner_text(f"#waiting-{approval.pk}")
        assert "bash waiting" in waiting and f"run {demo}" in waiting
        print("the approval's age on the page:", page.inner_text(f"#waiting-{approval.pk} .age"))
        assert page.inner_text("#approvals-waiting b") == "1"
        # The figures refresh in place (htmx polls every 5 s): a new run is counted.
        third = services.create_demo_run(created_by=eve)
        services.cancel_run(third.pk, actor="user:eve")
        wait_js(page, "document.querySelector('#count-all').textContent === '3 in all'", 15_000)
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        page.click("#count-awaiting_approval")
        page.wait_for_url(f"{base}/?status=awaiting_approval")
        assert listed(page) == {demo}
        page.goto(f"{base}/overview/")
        page.click("#approvals-waiting")
        page.wait_for_url(f"{base}/?approvals=waiting")
        assert listed(page) == {demo}
        page.goto(f"{base}/overview/")
        page.click("#count-paused")
        page.wait_for_url(f"{base}/?status=paused")
        assert listed(page) == {other.pk}

        # Fork the demo from session 1's checkpoint, then compare the fork with its origin.
        start = Run.objects.get(pk=demo).checkpoints.get(kind="session_end")
        page.goto(f"{base}/runs/{demo}/")
        page.click(f"#checkpoint-{start.number} a:has-text('Fork')")
        page.wait_for_selector("#checkpoint-action #confirm-panel", timeout=10_000)
        page.click("#confirm-panel button.confirm-fork")
        page.wait_for_url(re.compile(rf".*/runs/(?!{demo}/)\d+/$"), timeout=20_000)
        fork = int(page.url.rstrip("/").rsplit("/", 1)[1])
        services.pause_run(fork, actor="user:eve")  # it stays where it was forked
        page.click("#compare-origin")
        page.wait_for_url(f"{base}/runs/compare/?fork={fork}")
        assert page.inner_text("h1") == f"Run {demo} and run {fork}"
        assert page.inner_text("#col-a") == f"Run {demo}"
        assert page.inner_text("#col-b") == f"Run {fork}"
        table = page.inner_text("#compare-table")
        assert "Awaiting approval" in table and f"run {demo}" in table  # b's "forked from"
        page.wait_for_selector("#diff-summary")
        changed = page.eval_on_selector_all(".file-diff", "els => els.length")
        print("files differing between the demo's latest checkpoint and the fork's:", changed)
        assert changed >= 1 and "textstats.py" in page.inner_text("#diff-summary")
        checks = page.inner_text("#compare-checks")
        assert "python3 -m unittest -q" in checks and "fail" in checks and "not run" in checks
        page.screenshot(path=str(shots / "compare.png"), full_page=True)
