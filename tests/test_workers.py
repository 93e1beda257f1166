"""Real worker processes on one database: concurrent appends, leases, crashes and graceful stops.

These tests start `manage.py run_huey` consumers (production settings, SqliteHuey in a file of the
test's own) on the test database, kill them the hard and the gentle way, and then read the event
log to see that the guarantees of the design held: seqs gap-free and unique, one worker per run at
a time, tools run at most once, a killed worker's run recovered, a stopped one handed back.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from agents import eventlog, leases, services
from agents.eventlog import LeaseLost
from agents.lifecycle import TERMINAL
from agents.models import Approval, Event, Run, RunStatus, Session
from agents.runtime.conversation import INTERRUPTED
from tests.helpers import call, drive_until_idle, finish_turn, make_run
from tests.procs import Procs, alive, dump_events, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


# --- helpers --------------------------------------------------------------------------------
def bash(command: str) -> dict:
    return {"text": f"Running {command[:40]}", "tool_calls": [call("bash", command=command)]}


def seqs_of(run: Run) -> list[int]:
    return list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


def assert_gap_free(run: Run) -> None:
    run.refresh_from_db()
    seqs = seqs_of(run)
    assert seqs == list(range(1, len(seqs) + 1)), f"seqs not 1..N: {seqs}"
    assert run.last_seq == len(seqs), f"last_seq {run.last_seq} but {len(seqs)} events"


def status_of(run: Run) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run.pk)


def wait_until_over(run: Run, procs: Procs, timeout: float = 40) -> Run:
    wait_for(
        lambda: status_of(run) in TERMINAL,
        timeout=timeout,
        what=f"run {run.pk} to end",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    run.refresh_from_db()
    return run


def tool_event(run: Run, kind: str, tool_use_id: str) -> Event | None:
    return (
        Event.objects.filter(run=run, kind=kind, payload__tool_use_id=tool_use_id)
        .order_by("seq")
        .first()
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- 1. seq allocation across processes -----------------------------------------------------
APPENDER = """
import os, sys, time
from agents import eventlog
run_id, writer, count, ready, go = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), *sys.argv[4:]
open(ready, "w").close()
while not os.path.exists(go):  # start together, so the appends really contend
    time.sleep(0.002)
for i in range(count):
    eventlog.append(
        run_id, "human.note", {"text": f"{writer} {i}", "author": writer},
        actor=f"test:{writer}",
    )
    # A breath between appends: SQLite's busy handler backs off, so without it a writer that
    # just committed takes the lock again before the other wakes up, and they barely overlap.
    time.sleep(0.001)
"""


@pytest.mark.django_db(transaction=True)
def test_two_processes_appending_at_once_get_gap_free_unique_seqs(procs, tmp_path):
    run = make_run(turns=[finish_turn()])
    before = run.last_seq
    per_writer = 300
    go = tmp_path / "go"
    writers = {
        name: procs.python(
            f"appender-{name}",
            APPENDER,
            str(run.pk),
            name,
            str(per_writer),
            str(tmp_path / f"ready-{name}"),
            str(go),
        )
        for name in ("a", "b")
    }
    # Django start-up takes most of a second; wait until both are ready, then fire the gun.
    wait_for(
        lambda: all((tmp_path / f"ready-{n}").exists() for n in writers),
        timeout=30,
        what="both appenders to start",
        details=procs.logs,
    )
    go.touch()
    for proc in writers.values():
        assert proc.wait(timeout=60) == 0, procs.logs()

    assert_gap_free(run)
    notes = [
        (writer, int(text.split()[-1]))
        for writer, text in Event.objects.filter(run=run, kind="human.note")
        .order_by("seq")
        .values_list("payload__author", "payload__text")
    ]
    assert len(notes) == 2 * per_writer
    assert run.last_seq == before + 2 * per_writer
    for name in writers:
        # Each writer's own appends keep their order: seq order is commit order.
        assert [i for w, i in notes if w == name] == list(range(per_writer))
    # The writers really interleaved; otherwise this test proved nothing about concurrency.
    switches = sum(1 for x, y in pairwise(notes) if x[0] != y[0])
    assert switches >= 50, f"the two writers barely overlapped ({switches} switches)"


# --- 2. one worker per run at a time --------------------------------------------------------
@pytest.mark.django_db
def test_a_lease_is_held_by_one_worker_until_it_expires_and_a_lost_lease_cannot_write(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "LEASE_SECONDS": 0.3}
    run = make_run(turns=[finish_turn()])

    assert leases.claim(run.pk, "worker:a")
    assert not leases.claim(run.pk, "worker:b"), "a held lease was claimed again"
    # Appending as the holder works and renews the lease.
    eventlog.append(run.pk, "human.note", {"text": "from a"}, lease_owner="worker:a")

    # Nobody renews it now; once it expires the other worker may take the run.
    wait_for(lambda: leases.claim(run.pk, "worker:b"), timeout=5, what="the lease to expire")
    run.refresh_from_db()
    assert run.lease_owner == "worker:b"

    last_seq = run.last_seq
    with pytest.raises(LeaseLost):
        eventlog.append(run.pk, "human.note", {"text": "late a"}, lease_owner="worker:a")
    run.refresh_from_db()
    assert run.last_seq == last_seq, "a refused append still used up a seq"
    assert not Event.objects.filter(run=run, payload__text="late a").exists()
    # The old holder can neither renew nor release what the new one holds.
    assert leases.renew(run.pk, "worker:a") is None
    assert not leases.release(run.pk, "worker:a")
    run.refresh_from_db()
    assert run.lease_owner == "worker:b"


def timed_step(label: str, seconds: float = 0.15) -> dict:
    # The command notes when it starts and ends: two workers driving the run at once would
    # show as overlapping intervals in steps.log, whatever the event log says.
    stamp = 'echo "$(date +%s.%N) {} ' + label + '" >> steps.log'
    return bash(f"{stamp.format('start')}; sleep {seconds}; {stamp.format('end')}")


def assert_played_once_by_one_worker_at_a_time(run: Run, labels: list[str]) -> set[str]:
    """The run's script was played once, in order; its tool calls were made once each; one step
    was one worker's; its timed commands (steps.log) never overlapped. Returns the workers."""
    log = dump_events(run.pk)
    all_events = list(Event.objects.filter(run=run).order_by("seq"))
    calls = [e for e in all_events if e.kind == "tool.call"]
    ids = [e.payload["tool_use_id"] for e in calls]
    assert len(ids) == len(set(ids)), f"a tool call was made twice: {Counter(ids)}\n{log}"
    # Every script turn was played once, in order (a second driver would replay one).
    played = [
        e.payload["meta"]["script_index"]
        for e in all_events
        if e.kind == "model.turn" and not e.payload["meta"].get("synthesized")
    ]
    assert played == list(range(len(labels) + 1)), log

    # Tool events strictly alternate call, result, call, result, each pair about one tool use;
    # and all results of one step (one model turn) come from one worker.
    open_call, step_workers = None, set()
    workers = set()
    for e in all_events:
        if e.kind == "model.turn":
            assert open_call is None, f"a turn began while #{open_call.seq} was open\n{log}"
            assert len(step_workers) <= 1, f"one step, several workers {step_workers}\n{log}"
            step_workers = set()
        elif e.kind == "tool.call":
            assert open_call is None, f"#{e.seq} called while #{open_call.seq} was open\n{log}"
            open_call = e
        elif e.kind == "tool.result":
            assert open_call is not None, f"#{e.seq}: a result without a call\n{log}"
            assert e.payload["tool_use_id"] == open_call.payload["tool_use_id"], log
            assert e.actor.startswith("worker:"), log
            step_workers.add(e.actor)
            workers.add(e.actor)
            open_call = None
    assert open_call is None, log

    # The commands themselves never overlapped in time, and each ran once.
    stamps = [line.split() for line in lines(run.workspace_path / "steps.log")]
    assert Counter((what, label) for _, what, label in stamps) == Counter(
        {(what, label): 1 for label in labels for what in ("start", "end")}
    ), stamps
    intervals = sorted((float(t), label) for t, what, label in stamps if what == "start")
    ends = {label: float(t) for t, what, label in stamps if what == "end"}
    for (_, earlier), (start, later) in pairwise(intervals):
        assert ends[earlier] <= start, f"{earlier} and {later} ran at the same time: {stamps}"
    return workers


RIVAL = """
import sys, time
from agents.models import Run
from agents.jobs import enqueue
from agents.runtime.loop import drive
run_id = int(sys.argv[1])
deadline = time.monotonic() + 60
last_enqueue = 0.0
while time.monotonic() < deadline and Run.objects.filter(
    pk=run_id, status__in=["queued", "running", "verifying"]
).exists():
    # Flood the queue with duplicate slices, so idle consumer threads keep trying to claim the
    # run, also while another one is in the middle of a step ...
    if time.monotonic() - last_enqueue > 0.05:
        enqueue(run_id)
        last_enqueue = time.monotonic()
    # ... and be a worker without a queue that grabs the run whenever its lease is free, so the
    # run changes hands between processes at every slice (huey alone tends to give the next
    # slice to the thread that just queued it).
    drive(run_id, max_seconds=0.3)
    time.sleep(0.005)
"""


@pytest.mark.django_db(transaction=True)
def test_two_consumers_flooded_with_duplicate_slices_never_drive_one_run_at_once(procs):
    labels = [f"s{i}" for i in range(9)]
    run = make_run(
        turns=[*(timed_step(label) for label in labels), finish_turn()],
        checks=["test -f steps.log"],
        max_turns_per_session=3,
    )
    # Short slices: the run changes hands between steps many times, not only at handoffs.
    timing = {"SHIFTLOG_SLICE_SECONDS": 0.3, "SHIFTLOG_LEASE_SECONDS": 5}
    procs.consumer(workers=2, name="consumer-a", **timing)
    procs.consumer(workers=2, name="consumer-b", **timing)
    procs.enqueue(run.pk, times=4)
    procs.python("rival", RIVAL, str(run.pk))
    run = wait_until_over(run, procs, timeout=60)
    log = dump_events(run.pk)
    assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{log}"
    assert_gap_free(run)
    assert Session.objects.filter(run=run).count() >= 3, log

    workers = assert_played_once_by_one_worker_at_a_time(run, labels)

    # Otherwise the test would prove nothing: the run really changed hands, across processes.
    pids = {actor.split(":")[2] for actor in workers}
    assert len(pids) >= 2, f"driven by {workers} only"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_four_worker_processes_drive_twenty_runs_at_once_each_by_one_worker_at_a_time(procs):
    """Scale-out on one database: 4 consumer processes, 20 runs at once, every run changing
    hands at each session and slice. Run again on PostgreSQL + Redis by `make test`."""
    labels = {}
    for i in range(20):
        steps = [f"r{i}s{j}" for j in range(4)]
        run = make_run(
            turns=[*(timed_step(label, 0.05) for label in steps), finish_turn()],
            checks=["test -f steps.log"],
            max_turns_per_session=2,
        )
        labels[run.pk] = steps
    timing = {"SHIFTLOG_SLICE_SECONDS": 0.5, "SHIFTLOG_LEASE_SECONDS": 10}
    for n in range(4):
        procs.consumer(workers=2, name=f"consumer-{n}", **timing)
    procs.enqueue(*labels, times=2)  # more slices than runs: duplicates must be harmless

    def over() -> bool:
        return not Run.objects.filter(pk__in=labels).exclude(status__in=TERMINAL).exists()

    wait_for(
        over,
        timeout=240,
        interval=0.5,
        what="20 runs to end",
        details=lambda: f"{list(Run.objects.values_list('pk', 'status'))}\n{procs.logs()}",
    )
    workers = set()
    for run in Run.objects.filter(pk__in=labels).order_by("pk"):
        assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{dump_events(run.pk)}"
        assert_gap_free(run)
        assert Session.objects.filter(run=run).count() >= 3
        workers |= assert_played_once_by_one_worker_at_a_time(run, labels[run.pk])
    # The work really was spread over the processes (otherwise this proved nothing).
    pids = {actor.split(":")[2] for actor in workers}
    assert len(pids) >= 3, f"driven by {sorted(pids)} only"


# --- 3. a worker killed mid-tool ------------------------------------------------------------
SLOW = 'echo "slow start" >> counter.txt; sleep 3; echo "slow end" >> counter.txt'
# Short leases so a dead worker's claim runs out within the test.
SHORT_LEASES = {"SHIFTLOG_LEASE_SECONDS": 2, "SHIFTLOG_REQUEUE_AFTER_SECONDS": 2}


def without_bwrap() -> dict[str, str]:
    # A worker finds bwrap on its PATH; with only the virtualenv there it falls back to plain
    # subprocesses, as on a machine without bubblewrap, where runs start only when the operator
    # allows unisolated runs. Tools still get their own PATH from the sandbox.
    return {"PATH": str(Path(sys.executable).parent), "SHIFTLOG_ALLOW_UNISOLATED": "1"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "isolation",
    [
        "bwrap",
        "subprocess",
    ],
)
def test_a_worker_killed_mid_tool_is_recovered_and_no_tool_runs_twice(procs, isolation):
    from agents.sandbox.bash import isolation_available

    if isolation == "bwrap" and isolation_available() != "bwrap":
        pytest.skip("bubblewrap does not work on this machine")
    run = make_run(
        turns=[
            bash('echo "fast one" >> counter.txt'),
            bash(SLOW),
            bash('echo "fast two" >> counter.txt'),
            finish_turn(),
        ],
        checks=["grep -q 'fast two' counter.txt"],
    )
    counter = run.workspace_path / "counter.txt"
    env = {**SHORT_LEASES, **(without_bwrap() if isolation == "subprocess" else {})}
    first = procs.consumer(name="doomed", **env)
    procs.enqueue(run.pk)
    slow_id = "toolu_scripted_1_0"
    wait_for(
        lambda: tool_event(run, "tool.call", slow_id) and "slow start" in lines(counter),
        timeout=30,
        what="the slow tool to start",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    orphans = procs.kill_hard(first)
    assert orphans, "the worker had no tool process running when it was killed"

    procs.consumer(name="rescuer", **env)
    procs.reap_until_requeued(run.pk, timeout=20, **SHORT_LEASES)
    run = wait_until_over(run, procs)
    log = dump_events(run.pk)
    assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{log}"
    fast = tool_event(run, "tool.result", "toolu_scripted_0_0")
    assert fast.payload["data"]["isolation"] == isolation == run.isolation, log
    assert_gap_free(run)

    results = list(Event.objects.filter(run=run, kind="tool.result", payload__tool_use_id=slow_id))
    assert len(results) == 1, log
    assert results[0].payload["output"] == INTERRUPTED and results[0].payload["is_error"]
    recovery = Event.objects.filter(run=run, kind="error", payload__source="recovery")
    assert recovery.count() == 1, log

    # Give a tool process that outlived its worker the time to finish, then read the counter:
    # every tool ran exactly once, and the interrupted one was never started again.
    wait_for(
        lambda: not any(alive(p) for p in orphans),
        timeout=10,
        what="the killed worker's tool processes to end",
    )
    seen = Counter(lines(counter))
    assert seen["fast one"] == 1 and seen["fast two"] == 1, seen
    assert seen["slow start"] == 1, f"the interrupted tool ran again: {seen}"
    # A tool must die with its worker: one that ran on would change the workspace behind the
    # back of the next worker, after its call was closed as interrupted. bwrap's
    # bwrap's --die-with-parent sees to it; for a plain subprocess, PR_SET_PDEATHSIG does.
    assert seen["slow end"] == 0, f"the killed worker's tool ran on after it died: {seen}"


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_the_checks_run_is_recovered(procs):
    run = make_run(
        # The script ends with finish: the harness runs the checks again for that call rather
        # than send the agent back to work (found by bench/chaos.py: the script had run out).
        turns=[bash("echo work > work.txt"), finish_turn()],
        checks=["echo check >> checks.log; sleep 3; test -f work.txt"],
    )
    first = procs.consumer(name="doomed", **SHORT_LEASES)
    procs.enqueue(run.pk)
    wait_for(
        lambda: "check" in lines(run.workspace_path / "checks.log"),
        timeout=30,
        what="the checks to start",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    procs.kill_hard(first)
    assert status_of(run) == RunStatus.VERIFYING

    procs.consumer(name="rescuer", **SHORT_LEASES)
    # The dead worker's lease runs out after 2 s; a reaper that sees the run finds it by then.
    procs.reap_until_requeued(run.pk, timeout=8, **SHORT_LEASES)
    run = wait_until_over(run, procs)
    assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{dump_events(run.pk)}"
    assert_gap_free(run)
    # One finish call, answered once, after the checks ran (again) to the end.
    results = Event.objects.filter(run=run, kind="tool.result", payload__name="finish")
    assert results.count() == 1 and not results.get().payload["is_error"], dump_events(run.pk)
    assert Event.objects.filter(run=run, kind="model.turn").count() == 2, dump_events(run.pk)


@pytest.mark.django_db
def test_a_forced_isolation_is_the_one_tools_and_checks_really_run_with(settings):
    from agents.sandbox.bash import isolation_available

    if isolation_available() != "bwrap":
        pytest.skip("needs bwrap, so that forcing plain subprocesses makes a difference")
    # Forcing plain subprocesses is an unisolated run: the operator must allow those.
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ISOLATION": "subprocess", "ALLOW_UNISOLATED": True}
    run = drive_until_idle(make_run(turns=[bash("true"), finish_turn()]))
    assert run.status == RunStatus.SUCCEEDED
    assert run.isolation == "subprocess"
    result = tool_event(run, "tool.result", "toolu_scripted_0_0")
    check = Event.objects.get(run=run, kind="check.result")
    assert (result.payload["data"]["isolation"], check.payload["isolation"]) == (
        "subprocess",
        "subprocess",
    )


FROZEN_SLOW = 'echo "slow start" >> counter.txt; sleep 1; echo "slow end" >> counter.txt'


def freeze_outside_a_write(proc, run: Run, attempts: int = 20) -> None:
    """SIGSTOP the worker, but not in the middle of a write: a process frozen while it holds
    SQLite's write lock (or, on PostgreSQL, the run row's lock) would freeze everyone. Thaw and
    try again if it does."""
    import sqlite3

    from django.db import DatabaseError, connection, transaction

    for _ in range(attempts):
        proc.signal(signal.SIGSTOP)
        try:
            if connection.vendor == "sqlite":
                probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.5)
                try:
                    probe.execute("BEGIN IMMEDIATE")
                    probe.execute("ROLLBACK")
                finally:
                    probe.close()
            else:
                with transaction.atomic():
                    list(Run.objects.select_for_update(nowait=True).filter(pk=run.pk))
            return
        except (sqlite3.OperationalError, DatabaseError):
            proc.signal(signal.SIGCONT)
            time.sleep(0.2)
    raise AssertionError("the worker always held the write lock when frozen")


@pytest.mark.django_db(transaction=True)
def test_a_frozen_worker_that_wakes_after_losing_its_lease_cannot_write_to_the_run(procs):
    run = make_run(
        turns=[bash(FROZEN_SLOW), bash('echo "after" >> counter.txt'), finish_turn()],
        checks=["grep -q after counter.txt"],
    )
    frozen = procs.consumer(name="frozen", **SHORT_LEASES)
    procs.enqueue(run.pk)
    slow_id = "toolu_scripted_0_0"
    wait_for(
        lambda: tool_event(run, "tool.call", slow_id),
        timeout=30,
        what="the slow tool to start",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    # A stopped process (a long GC pause, a frozen VM, a partitioned host) looks dead to the
    # others: its lease runs out and another worker takes over. (It is stopped while it waits
    # for its tool; only if SIGSTOP landed in the millisecond of a heartbeat's UPDATE would it
    # hold SQLite's write lock while frozen.)
    freeze_outside_a_write(frozen, run)
    try:
        procs.consumer(name="successor", **SHORT_LEASES)
        procs.reap_until_requeued(run.pk, timeout=20, **SHORT_LEASES)
        run = wait_until_over(run, procs)
        seen_before_wake = run.last_seq
    finally:
        frozen.signal(signal.SIGCONT)
    # Awake again, the frozen worker finds its tool done and tries to record the result: the
    # append is refused (its lease is gone), so the log stays exactly as the successor left it.
    wait_for(
        lambda: "lease lost" in frozen.log(),
        timeout=10,
        what="the woken worker to notice it lost the lease",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    log = f"{dump_events(run.pk)}\n{procs.logs()}"
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, log
    assert run.last_seq == seen_before_wake, f"the woken worker wrote to the log\n{log}"
    assert_gap_free(run)
    results = Event.objects.filter(run=run, kind="tool.result", payload__tool_use_id=slow_id)
    assert [r.payload["output"] for r in results] == [INTERRUPTED], log
    frozen_pid = f":{frozen.pid}:"
    assert not Event.objects.filter(run=run, actor__contains=frozen_pid, kind="tool.result")


# --- 4. a graceful stop ---------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_sigterm_lets_the_running_step_finish_and_hands_the_run_back(procs):
    run = make_run(
        turns=[
            bash('echo "one" >> counter.txt'),
            bash('sleep 2; echo "slept" >> counter.txt'),
            bash('echo "three" >> counter.txt'),
            finish_turn(),
        ],
        checks=["grep -q three counter.txt"],
    )
    counter = run.workspace_path / "counter.txt"
    first = procs.consumer(name="stopping", args=["-g", "TERM", "-t", "30"])
    procs.enqueue(run.pk)
    slow_id = "toolu_scripted_1_0"
    wait_for(
        lambda: tool_event(run, "tool.call", slow_id),
        timeout=30,
        what="the slow step to start",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    asked = time.monotonic()
    first.signal(signal.SIGTERM)
    code = first.wait(timeout=20)
    took = time.monotonic() - asked
    log = f"{dump_events(run.pk)}\n{procs.logs()}"
    assert took < 15, f"the consumer took {took:.1f} s to stop\n{log}"
    assert code == 0, log

    result = tool_event(run, "tool.result", slow_id)
    assert result is not None, f"the running step's result was not recorded\n{log}"
    assert not result.payload["is_error"] and INTERRUPTED not in result.payload["output"], log
    assert lines(counter) == ["one", "slept"], log
    # Stopped at the step boundary: no further turn was started, the lease was given back.
    assert not Event.objects.filter(run=run, kind="model.turn", seq__gt=result.seq).exists(), log
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING, log
    assert run.lease_owner == "" and run.lease_expires_at is None, log

    # No reaper here: the slice queued at shutdown is enough for the next worker to go on.
    procs.consumer(name="successor")
    run = wait_until_over(run, procs)
    log = dump_events(run.pk)
    assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{log}"
    assert_gap_free(run)
    assert lines(counter) == ["one", "slept", "three"], log
    assert not Event.objects.filter(run=run, kind="error").exists(), log


# --- 5. the demo, end to end ----------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_real_consumer_takes_the_demo_through_two_sessions_to_success(procs, decider):
    run = services.create_demo_run(turn_delay_seconds=0)
    first = procs.consumer(name="consumer")
    procs.enqueue(run.pk)
    # The demo's risky step waits for a person, holding no worker: the worker can die meanwhile.
    wait_for(
        lambda: status_of(run) == RunStatus.AWAITING_APPROVAL,
        timeout=60,
        what="the demo to wait for approval",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    # The slice that asked lets go of the run as it ends, a moment after the status changed.
    wait_for(
        lambda: not Run.objects.get(pk=run.pk).lease_owner,
        timeout=10,
        what="the worker to let go of the waiting run",
        details=lambda: f"{dump_events(run.pk)}\n{procs.logs()}",
    )
    procs.kill_hard(first)
    procs.consumer(name="after-the-wait")
    approval = Approval.objects.get(run=run, status="pending")
    out = procs.manage("approve", str(approval.pk), "--user", decider.username)
    assert "approved" in out
    run = wait_until_over(run, procs, timeout=60)
    log = dump_events(run.pk)
    assert run.status == RunStatus.SUCCEEDED, f"{run.status_reason}\n{log}"
    assert_gap_free(run)
    assert Session.objects.filter(run=run).count() >= 2, log

    checks = [
        e.payload
        for e in Event.objects.filter(run=run, kind="check.result", payload__at="finish").order_by(
            "seq"
        )
    ]
    # The harness ran the tests itself: the first finish was refused on a real failure.
    assert [c["passed"] for c in checks] == [False, True], log
    assert checks[0]["exit_code"] not in (0, None), log
    assert "test_extra_spaces_are_not_words" in checks[0]["output"], checks[0]["output"]
    assert checks[1]["exit_code"] == 0, log
