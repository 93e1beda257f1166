"""A session change in one slice, with the session-end checks run beside the next session's
start (Slice.defer): the change itself costs a checkpoint and a first message, and the checks
still read the workspace exactly as the ended session left it, because the next session's first
tool call waits for them. Transactional: the checks' thread has a database connection of its
own."""

from __future__ import annotations

import pytest

from agents.models import Checkpoint, Event, Run, RunStatus, Session
from agents.runtime.loop import drive
from tests.helpers import call, make_run

pytestmark = pytest.mark.django_db(transaction=True)

# Slow enough that, were the next session's write not held back, it would land first.
CHECK = "sleep 0.4 && test -f s1.txt && test ! -f s2.txt"


def two_sessions():
    return [
        {"text": "one", "tool_calls": [call("write_file", path="s1.txt", content="1")]},
        {"text": "over", "tool_calls": [call("handoff", summary="s1 written")]},
        {"text": "two", "tool_calls": [call("write_file", path="s2.txt", content="2")]},
        {"text": "stop"},
    ]


@pytest.fixture
def deferring(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "DEFER_SESSION_CHECKS": True}


def kinds_and_sessions(run):
    return list(
        Event.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "session_id")
    )


def test_the_next_session_starts_in_the_slice_and_the_checks_see_the_ended_session(deferring):
    run = make_run(turns=two_sessions(), checks=[CHECK])
    outcome = drive(run.pk)
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED  # the script ran out; both sessions in one slice
    assert outcome.result == "failed"
    first, second = Session.objects.filter(run=run).order_by("index")
    (check,) = Event.objects.filter(run=run, kind="check.result")
    assert check.payload["at"] == "session_end" and check.payload["passed"], check.payload
    assert check.session_id == first.pk  # recorded as the ended session's, though later
    ended_cp = Checkpoint.objects.get(run=run, kind="session_end", session=first)
    started = Event.objects.get(run=run, kind="session.started", session=second)
    wrote_s2 = Event.objects.get(
        run=run, kind="tool.result", session=second, payload__name="write_file"
    )
    # The checkpoint and the next session come first; the checks land before s2.txt is written.
    assert ended_cp.seq < started.seq and check.seq < wrote_s2.seq
    # The checkpoint's reading is completed with the session-end result.
    ended_cp.refresh_from_db()
    assert ended_cp.state["checks"][CHECK]["at"] == "session_end"
    assert ended_cp.state["checks"][CHECK]["seq"] == check.seq


def test_inline_checks_keep_the_old_order(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "DEFER_SESSION_CHECKS": False}
    run = make_run(turns=two_sessions(), checks=[CHECK])
    drive(run.pk)
    rows = kinds_and_sessions(run)
    order = [kind for _, kind, _ in rows]
    # Checks, then the session ends, then its checkpoint: as before deferring existed.
    at = order.index("check.result")
    assert order[at + 1 : at + 3] == ["session.ended", "checkpoint.created"]


def test_a_slice_that_ends_while_the_checks_run_waits_for_them(deferring):
    # Session 2 makes no tool call: the script runs out and the slice ends with the checks
    # still running beside it; they are recorded before the worker lets the run go.
    run = make_run(turns=[*two_sessions()[:2], {"text": "nothing to do"}], checks=[CHECK])
    outcome = drive(run.pk)
    assert outcome.result == "failed"
    (check,) = Event.objects.filter(run=run, kind="check.result")
    assert check.payload["passed"] and check.payload["at"] == "session_end"
    assert check.seq < Event.objects.filter(run=run, kind="run.status").last().seq
