"""The approvals inbox, live, in a real browser: a run's next waiting call pushed to an open inbox
joins that run's section, and a new run's call arrives in a block of its own; one run's calls do
not push another's down the page (issue 31); a change to how the checks run is a card with its
diff, approved there (issue 29)."""

from __future__ import annotations

from agents import approvals
from agents.models import Run, RunStatus
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.scenes import waiting_demo
from tests.helpers import call, finish_turn, make_run
from tests.procs import wait_for

pytestmark = BROWSER_TEST


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

        # A change to how the checks run (a protected file, changed with bash) arrives as a card
        # with its diff shown as text; approving it there lets the run's next check use it.
        spec = tmp_path / "spec"
        (spec / "docs").mkdir(parents=True)
        (spec / "docs" / "SPEC.md").write_text("v1\n")
        edit = {"tool_calls": [call("bash", command="echo '<b>v2</b>' > docs/SPEC.md")]}
        held = make_run(
            created_by=eve,
            turns=[edit, finish_turn(), finish_turn(), finish_turn()],
            checks=["grep -q v2 docs/SPEC.md"],
            workspace_from=str(spec),
            protected_paths=["docs/"],
        )
        (change,) = waiting(held, 1)
        card = page.locator(f"#approval-{change.pk}")
        card.wait_for()
        assert (
            "+<b>v2</b>" in card.inner_text() and card.locator("b").count() == 1
        )  # <b>config_change</b>
        card.locator("button[value=approve]").click()
        wait_for(
            lambda: Run.objects.get(pk=held.pk).status == RunStatus.SUCCEEDED,
            timeout=120,
            what="the run to pass with the approved file",
            interval=0.2,
        )
