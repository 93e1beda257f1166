"""One transaction per step when the turn's first call only reads (agents/runtime/calls.py).

The read runs before the turn is recorded and its result commits with the turn; a call with an
effect keeps its tool.call committed before it runs. A worker killed between the read and the
commit leaves nothing of that turn: the next worker asks the model again and records the step
once, and nothing is marked interrupted.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from django.utils import timezone

from agents import eventlog
from agents.models import Event, Run, RunStatus
from agents.runtime.conversation import INTERRUPTED
from tests.helpers import call, drive_until_idle, finish_turn, make_run
from tests.procs import dump_events

NOTES = "one\ntwo\nthree\n"


def reading(i: int) -> dict:
    return {"text": f"Reading {i}", "tool_calls": [call("read_file", path="notes.txt")]}


def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "notes.txt").write_text(NOTES)
    return folder


@pytest.mark.django_db(transaction=True)
def test_a_read_step_is_one_transaction_and_a_write_step_commits_its_call_first(tmp_path):
    committed: list[list[str]] = []

    def listener(sender, events, **kwargs):
        committed.append([e.kind for e in events])

    run = make_run(
        turns=[
            reading(1),
            {"tool_calls": [call("write_file", path="out.txt", content="x")]},
            finish_turn(),
        ],
        workspace_from=source(tmp_path),
    )
    eventlog.events_committed.connect(listener)
    try:
        run = drive_until_idle(run)
    finally:
        eventlog.events_committed.disconnect(listener)
    assert run.status == RunStatus.SUCCEEDED, dump_events(run.pk)
    # The read: turn, call and result in one commit. The write: turn and call, then the result.
    assert ["model.turn", "tool.call", "tool.result"] in committed, committed
    turns = [c for c in committed if c[0] == "model.turn"]
    assert turns[1] == ["model.turn", "tool.call"], committed
    after_write = committed[committed.index(turns[1]) + 1]
    assert after_write == ["tool.result"], committed
    read = Event.objects.filter(run=run, payload__tool_use_id="toolu_scripted_0_0")
    assert sorted(e.kind for e in read) == ["tool.call", "tool.result"]
    assert read.get(kind="tool.result").payload["output"].startswith("one")
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


# The worker: its read tool kills the process (SIGKILL, as the OOM killer would) right after the
# third read has run, before the step is committed.
KILLED_AFTER_THIRD_READ = """
import os, signal, sys
from agents.runtime.loop import drive
from agents.sandbox import tools
run_id, log = int(sys.argv[1]), sys.argv[2]
original = tools._read_file
def read_then_die(*args, **kwargs):
    result = original(*args, **kwargs)
    with open(log, "a") as f:
        f.write("read\\n")
    with open(log) as f:
        if len(f.readlines()) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    return result
tools._read_file = read_then_die
drive(run_id)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_between_a_read_and_its_commit_leaves_no_trace_of_the_step(procs, tmp_path):
    run = make_run(
        turns=[*(reading(i) for i in range(5)), finish_turn()], workspace_from=source(tmp_path)
    )
    log = tmp_path / "reads.log"
    worker = procs.python("reader", KILLED_AFTER_THIRD_READ, str(run.pk), str(log))
    assert worker.wait(timeout=60) == -signal.SIGKILL, procs.logs()
    assert log.read_text().count("read") == 3
    # Two steps committed; the third read ran, but nothing of its turn reached the log.
    turns = Event.objects.filter(run=run, kind="model.turn").count()
    assert turns == 2, dump_events(run.pk)
    assert not Event.objects.filter(run=run, payload__tool_use_id="toolu_scripted_2_0").exists()

    # The lease of the dead worker runs out (the reaper's part); the next worker carries on.
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now())
    time.sleep(0.01)
    run = drive_until_idle(run)
    events = dump_events(run.pk)
    assert run.status == RunStatus.SUCCEEDED, events
    per_call = Counter(
        (kind, tool_use_id)
        for kind, tool_use_id in Event.objects.filter(
            run=run, kind__in=["tool.call", "tool.result"]
        ).values_list("kind", "payload__tool_use_id")
    )
    for i in range(5):
        for kind in ("tool.call", "tool.result"):
            assert per_call[(kind, f"toolu_scripted_{i}_0")] == 1, events
    assert not Event.objects.filter(run=run, payload__output=INTERRUPTED).exists(), events
    assert not Event.objects.filter(run=run, kind="error", payload__source="recovery").exists()
    assert Event.objects.filter(run=run, kind="model.turn").count() == 6, events
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
