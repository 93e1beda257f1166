"""Approvals under abuse (issue 31): what a run asked ends with the run, a decision on an ended
run is refused with its reason (never a 500), one command or run cannot flood the inbox, the
inbox is paged and fair between runs, policy changes are recorded as changes, and policy
patterns cannot hang a worker."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from agents import approvals, checkpoints, lifecycle, reaper, services
from agents.models import Approval, Checkpoint, Event, Run, RunStatus
from agents.overview import compute
from api.models import ApiToken
from dashboard import access
from tests.conftest import (
    call,
    client_for,
    drive_until_idle,
    finish_turn,
    make_run,
    script,
    user_with,
)

pytestmark = pytest.mark.django_db

RISKY = "rm -rf build"


@pytest.fixture
def boss(db):
    """Sees every run, controls and decides."""
    return user_with("bea", "view_run", "control_run", "decide_approval")


def waiting(**kwargs) -> Run:
    turns = [{"tool_calls": [call("bash", command=RISKY)]}, finish_turn()]
    run = drive_until_idle(make_run(turns=turns, **kwargs))
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    return run


def decided(run: Run) -> list[dict]:
    return [
        e.payload for e in Event.objects.filter(run=run, kind="approval.decided").order_by("seq")
    ]


def assert_nothing_waits(run: Run, user) -> None:
    """Off the inbox, the header's count, the overview and the runs list; not decidable."""
    assert not Approval.objects.filter(run=run, status="pending").exists()
    assert access.pending_count(user) == 0
    figures = compute(access.visible_runs(user), access.pending_approvals(user))
    assert figures.approvals_waiting == 0 and figures.approvals == []
    assert Run.objects.for_list().get(pk=run.pk).pending_approvals == 0
    page = client_for(user).get("/approvals/").content.decode()
    assert f"run-{run.pk}" not in page and RISKY not in page
    for a in Approval.objects.filter(run=run):
        assert a.status == "discarded" and "the run ended" in a.comment
        with pytest.raises(approvals.ApprovalError, match="can no longer be decided"):
            approvals.decide(a.pk, user=user, approve=True)
    assert not [p for p in decided(run) if p["decision"] in ("approved", "denied")]


# --- 6: approvals end with their run ---------------------------------------------------------
def test_cancelling_a_waiting_run_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    services.cancel_run(run.pk, actor="user:bea")
    assert_nothing_waits(run, boss)
    (payload,) = decided(run)
    assert payload["decision"] == "discarded" and payload["comment"].endswith("(cancelled)")


def test_cancelling_a_run_after_pausing_it_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    services.pause_run(run.pk, actor="user:bea")
    assert Approval.objects.get(run=run).status == "pending"  # a pause keeps what waits
    services.cancel_run(run.pk, actor="user:bea")
    assert_nothing_waits(run, boss)


def test_cancelling_the_scripted_demo_from_the_cli_discards_and_approve_is_refused(boss):
    run = drive_until_idle(services.create_demo_run(created_by=boss))
    assert run.status == RunStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(run=run)
    call_command("cancel_run", str(run.pk), "--user", "bea")
    assert_nothing_waits(run, boss)
    with pytest.raises(CommandError, match="can no longer be decided") as refused:
        call_command("approve", str(approval.pk), "--user", "bea")
    assert "continues" not in str(refused.value)
    with pytest.raises(CommandError, match="can no longer be decided"):
        call_command("deny", str(approval.pk), "--user", "bea", "--reason", "no")


def test_a_run_that_fails_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    lifecycle.transition(run.pk, RunStatus.FAILED, actor="harness", reason="a crash")
    assert_nothing_waits(run, boss)


def test_a_fleet_child_cancelled_by_its_parents_rewind_discards_its_approvals(
    boss, django_capture_on_commit_callbacks
):
    kid_script = script({"tool_calls": [call("bash", command=RISKY)]}, finish_turn())
    spawn = {
        "tool_calls": [
            call(
                "spawn_runs",
                children=[{"goal": "tidy", "checks": ["true"], "script": kid_script}],
                wait="all",
            )
        ]
    }
    parent = drive_until_idle(make_run(created_by=boss, turns=[spawn, finish_turn()]))
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN, parent.status_reason
    (kid,) = Run.objects.filter(parent=parent)
    kid = drive_until_idle(kid)
    assert kid.status == RunStatus.AWAITING_APPROVAL, kid.status_reason
    assert access.pending_count(boss) == 1
    start = Checkpoint.objects.get(run=parent, kind="run_start")
    with django_capture_on_commit_callbacks(execute=True):
        checkpoints.rewind(parent.pk, start.pk, actor="user:bea")
    kid.refresh_from_db()
    assert kid.status == RunStatus.CANCELLED
    assert_nothing_waits(kid, boss)
    fleet_page = client_for(boss).get(f"/runs/{parent.pk}/").content.decode()
    assert f'id="fleet-run-{kid.pk}"' in fleet_page and " waiting</a>" not in fleet_page


def test_approvals_an_older_version_left_on_ended_runs_are_refused_and_swept(boss):
    """A pending approval on an ended run (written before the end discarded them): a decision
    is refused with the reason on every path (API 409, web a message, CLI an error), and the
    reaper's next pass discards it."""
    run = waiting(created_by=boss)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)  # as an older version left it
    approval = Approval.objects.get(run=run)
    _, token = ApiToken.issue(boss, ["read", "decide"])
    from django.test import Client

    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    r = api.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        json.dumps({"decision": "approve"}),
        content_type="application/json",
    )
    assert r.status_code == 409, r.content
    assert f"run {run.pk} is cancelled" in r.json()["detail"]
    web = client_for(boss)
    r = web.post(f"/approvals/{approval.pk}/decide", {"decision": "approve"}, follow=True)
    assert r.status_code == 200 and "can no longer be decided" in r.content.decode()
    r = web.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "deny", "comment": "no"},
        HTTP_HX_REQUEST="true",
    )
    assert r.status_code == 200 and "can no longer be decided" in r.content.decode()
    with pytest.raises(CommandError, match="can no longer be decided"):
        call_command("approve", str(approval.pk), "--user", "bea")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not decided(run)

    reaper.reap()
    assert_nothing_waits(run, boss)
