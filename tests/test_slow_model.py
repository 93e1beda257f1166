"""A model that takes longer to answer than a worker's lease lasts.

A real Messages API call can take minutes. The worker keeps its lease while it waits (the call
runs on a thread of its own: Slice.call_model), so the reaper never hands the run to a second
worker that would make the same call again; a run cancelled while the model thinks ends its
slice at once instead of after the answer. The worker tests run real `run_huey` consumers
against a local fake Messages API over real HTTP."""

from __future__ import annotations

import time

import pytest

from agents import services
from agents.models import EndReason, Event, EventKind, Run, RunStatus, Session
from tests.fake_anthropic import FakeAnthropic
from tests.helpers import FAKE_API_KEY, call, drive_until_idle, finish_turn, make_run, script
from tests.procs import dump_events, wait_for

LEASE = {"SHIFTLOG_LEASE_SECONDS": "1"}


def api_env(fake: FakeAnthropic) -> dict[str, str]:
    return {
        **LEASE,
        "ANTHROPIC_API_KEY": FAKE_API_KEY,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "SHIFTLOG_ANTHROPIC_MAX_RETRIES": "0",
    }


def tool_use(id_: str, name: str, **tool_input: str) -> dict:
    return {"type": "tool_use", "id": id_, "name": name, "input": tool_input}


def thinking(fake: FakeAnthropic, procs, delay: float, *, workers: int, **run_kwargs) -> Run:
    """A run of the anthropic provider on real consumers, whose first model call (a write) the
    fake API answers after `delay` seconds: returned once that call has reached the API (push
    the answers to later calls then; the fake serves them in order)."""
    fake.push(
        fake.message_body(
            [tool_use("toolu_1", "write_file", path="a.txt", content="hi")], stop_reason="tool_use"
        ),
        delay=delay,
    )
    run = make_run(provider="anthropic", **run_kwargs)
    procs.consumer(workers=workers, **api_env(fake))
    procs.enqueue(run.pk)
    wait_for(lambda: fake.requests, timeout=30, what="the first model call")
    return run


@pytest.mark.django_db
def test_a_scripted_model_with_latency_renews_the_lease_while_it_answers(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "LEASE_SECONDS": 1.0}
    slow = script({"tool_calls": [call("write_file", path="a", content="1")]}, finish_turn())
    run = drive_until_idle(make_run(script={**slow, "turn_delay_seconds": 1.6}))
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    # Two turns of 1.6 s each: the slice renewed the lease once a second while it waited.
    assert run.lease_renewals >= 2, run.lease_renewals


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_model_call_longer_than_the_lease_keeps_it_and_is_made_once(procs):
    with FakeAnthropic() as fake:
        # Its first answer comes after five leases' length; the second is queued meanwhile.
        run = thinking(fake, procs, 5.0, workers=2, checks=["test -f a.txt"])
        fake.push_message([tool_use("toolu_2", "finish", summary="done")], stop_reason="tool_use")
        time.sleep(1.5)  # past the lease's length, had nothing renewed it
        reaped = procs.manage("reap_runs", **LEASE)
        assert reaped.strip() == "requeued 0 run(s)", reaped
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "paused"},
            timeout=60,
            what="the run to end",
            details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
        )
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{dump_events(run.pk)}"
        assert len(fake.requests) == 2, "a model call was made again by another worker"
        assert run.lease_expiries == 0
        assert run.lease_renewals >= 3, run.lease_renewals
        turns = Event.objects.filter(run=run, kind=EventKind.MODEL_TURN)
        assert turns.count() == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_run_cancelled_while_the_model_thinks_lets_go_at_once(procs):
    with FakeAnthropic() as fake:
        run = thinking(fake, procs, 30.0, workers=1)
        cancelled_at = time.monotonic()
        services.cancel_run(run.pk, actor="user:eve", reason="taking too long")
        wait_for(
            lambda: not Run.objects.get(pk=run.pk).lease_owner,
            timeout=10,
            what="the worker to let the cancelled run go",
            details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
        )
        assert time.monotonic() - cancelled_at < 10  # long before the model's answer at 30 s
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED
        session = Session.objects.get(run=run)
        assert session.end_reason == EndReason.CANCELLED, dump_events(run.pk)
        assert not Event.objects.filter(run=run, kind=EventKind.MODEL_TURN).exists()
        assert len(fake.requests) == 1
