"""The approvals inbox, live, in a real browser: a run's next waiting call pushed to an open inbox
joins that run's section, and a new run's call arrives in a block of its own; one run's calls do
not push another's down the page (issue 31)."""

from __future__ import annotations

import os

import pytest

from agents import approvals
from agents.models import Run, RunStatus
from tests.e2e.helpers import CHROMIUM, log_in, serving, wait_js
from tests.e2e.scenes import waiting_demo
from tests.helpers import call, finish_turn, make_run
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def waiting(run: Run, count: int) -> list:
    wait_for(
        lambda: (
            Run.objects.get(pk=run.pk).status == RunStatus.AWAITING_APPROVAL
            and run.approvals.filter(status="pending").count() == count
        ),
        timeout=120,
        what=f"run {run.pk} to wait for approval",
        interval=0.2,
    )
    return list(run.approvals.filter(status="pending").order_by("pk"))


def test_a_live_card_joins_its_runs_section_and_a_new_runs_card_stands_apart(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        turns = [{"tool_calls": [call("bash", command=f"rm -rf b{i}")]} for i in range(2)]
        twice = make_run(created_by=eve, turns=[*turns, finish_turn()])
        (first,) = waiting(twice, 1)
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/approvals/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        assert page.locator(f"#approval-run-{twice.pk}-cards #approval-{first.pk}").count() == 1

        approvals.decide(first.pk, user=eve, approve=True)
        (second,) = waiting(twice, 1)
        wait_js(
            page,
            f"document.querySelector('#approval-run-{twice.pk}-cards #approval-{second.pk}') "
            "!== null",
        )
        other = waiting_demo(eve)
        (theirs,) = other.approvals.filter(status="pending")
        wait_js(page, f"document.getElementById('approval-{theirs.pk}') !== null")
        holder = page.evaluate(
            f"document.getElementById('approval-{theirs.pk}').parentElement.className"
        )
        assert holder == "approval-arrived"
        assert page.locator(f"#approval-run-{twice.pk}-cards .approval").count() == 2
