from __future__ import annotations

import pytest

from agents import lifecycle
from agents.lifecycle import TRANSITIONS, IllegalTransition
from agents.models import Event, RunStatus
from tests.helpers import make_run


@pytest.fixture
def run(db):
    return make_run(turns=[{"text": "hi"}])


def test_a_legal_transition_changes_status_and_is_an_event_naming_the_actor(run):
    lifecycle.transition(run.pk, RunStatus.PAUSED, actor="user:olivia", reason="lunch")
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    assert run.status_reason == "lunch"
    event = Event.objects.filter(run=run, kind="run.status").latest("seq")
    assert event.actor == "user:olivia"
    # A pause says its cause (the harness's, when the caller names none).
    assert event.payload == {
        "from": "queued",
        "to": "paused",
        "reason": "lunch",
        "cause": "harness",
    }


def test_an_illegal_transition_raises_and_changes_nothing(run):
    before = run.last_seq
    with pytest.raises(IllegalTransition, match="is queued; it cannot become succeeded"):
        lifecycle.transition(run.pk, RunStatus.SUCCEEDED, actor="harness")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert run.last_seq == before


def test_terminal_states_have_no_way_out(run):
    lifecycle.transition(run.pk, RunStatus.CANCELLED, actor="user:olivia")
    for target in RunStatus.values:
        with pytest.raises(IllegalTransition):
            lifecycle.transition(run.pk, target, actor="user:olivia")


def test_expect_guards_against_a_concurrent_change(run):
    lifecycle.transition(run.pk, RunStatus.RUNNING, actor="worker")
    lifecycle.transition(run.pk, RunStatus.CANCELLED, actor="user:olivia")
    with pytest.raises(IllegalTransition):
        lifecycle.transition(run.pk, RunStatus.PAUSED, actor="worker", expect={RunStatus.RUNNING})


def test_only_a_worker_path_leads_to_succeeded():
    sources = {s for s, targets in TRANSITIONS.items() if RunStatus.SUCCEEDED in targets}
    assert sources == {RunStatus.VERIFYING}


def test_timestamps_follow_the_status(run):
    lifecycle.transition(run.pk, RunStatus.RUNNING, actor="worker")
    run.refresh_from_db()
    assert run.started_at is not None and run.finished_at is None
    lifecycle.transition(run.pk, RunStatus.FAILED, actor="worker", reason="boom")
    run.refresh_from_db()
    assert run.finished_at is not None
