"""The brain: drives one slice of a run, step by step, with everything in the event log.

A slice claims the run's lease, opens the session (rebuilding its conversation from the log),
closes any tool call a dead worker left open, and then repeats: ask the provider for a turn, record
it, run its tools through the gate and the sandbox, record their results. It returns when the
session ends, the run suspends (pause, budget, approval), the slice's time is up, the worker is
shutting down, or the lease is lost. Nothing it needs lives only in memory.

The parts, one owner each: `Slice` (the shared state and its acts), `Sessions` (opening, limits,
handoffs, ending), `Gate` (validate once, decide once, the wait for a person), `Calls` (running
tools at most once), `Turns` (the model), `Finish` (done-conditions and the judge), `Budgets`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import random
import time

from django.conf import settings
from django.db import DatabaseError
from django.db.models import F

from agents import dbconn, isolation, leases, lifecycle, logcontext, workspaces
from agents.blobstore import BlobStoreUnavailable
from agents.eventlog import LeaseLost, NewEvent
from agents.isolation import MIB
from agents.jobs import enqueue
from agents.lifecycle import IllegalTransition
from agents.models import (
    Checkpoint,
    CheckpointKind,
    EndReason,
    Event,
    EventKind,
    PauseCause,
    Run,
    RunStatus,
    Session,
)
from agents.runtime import prompts
from agents.runtime.budgets import Budgets
from agents.runtime.calls import Calls, call_event
from agents.runtime.finish import Finish
from agents.runtime.gate import Gate
from agents.runtime.network import Network
from agents.runtime.sessions import Sessions
from agents.runtime.slice import REQUEUE, Outcome, Slice, SliceOver, SliceResult
from agents.runtime.turns import Turns
from agents.worker import shutdown_requested

log = logging.getLogger(__name__)
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# A slice that met a busy database is tried again after 0.5 s, 1 s, 2 s ... up to 15 s (jittered).
DB_BACKOFF_FIRST = 0.5
DB_BACKOFF_MAX = 15.0

__all__ = ["Driver", "Outcome", "SliceResult", "drive"]


def drive(run_id: int, *, owner: str | None = None, max_seconds: float | None = None) -> Outcome:
    """Drive one slice of a run. Safe to call from any worker, any number of times.

    A busy or unreachable database (too many clients, no pooled connection free in time, the
    server restarting: dbconn.transient) never fails the run: the slice is tried again with
    backoff, from what the log holds (as after a worker's crash), for up to
    SHIFTLOG["DB_RETRY_SECONDS"]; then the run is paused with the reason (PauseCause.DATABASE),
    which the reaper resumes. Other errors pass as before."""
    owner = owner or leases.worker_id()
    give_up = time.monotonic() + settings.SHIFTLOG["DB_RETRY_SECONDS"]
    for attempt in itertools.count():
        try:
            # Every log line written while this slice runs names the run (and its session).
            with logcontext.bound_run(run_id):
                return _drive_once(run_id, owner, max_seconds)
        except DatabaseError as e:
            if not dbconn.transient(e):
                raise
            dbconn.discard()
            if time.monotonic() >= give_up:
                return _pause_for_database(run_id, owner, e)
            wait = min(DB_BACKOFF_MAX, DB_BACKOFF_FIRST * 2**attempt) * random.uniform(0.5, 1.0)
            log.warning(
                "run %s: the database is busy or away (%s); trying the slice again in %.1f s",
                run_id,
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


def _pause_for_database(run_id: int, owner: str, error: DatabaseError) -> Outcome:
    """The database stayed busy past the retries: pause the run with the reason, if the
    database takes even that; else leave it to the reaper (the lease expires)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reason = (
        f"the database stayed busy or unreachable for "
        f"{settings.SHIFTLOG['DB_RETRY_SECONDS']:g} s ({first}); it resumes once it answers"
    )
    log.error("run %s: %s", run_id, reason)
    try:
        lifecycle.transition(
            run_id,
            RunStatus.PAUSED,
            actor="harness",
            reason=reason,
            expect={RunStatus.RUNNING},
            lease_owner=owner,
            cause=PauseCause.DATABASE,
        )
        leases.release(run_id, owner)
    except (DatabaseError, IllegalTransition, LeaseLost) as e:
        log.warning("run %s: could not pause it (%s); the reaper will see to it", run_id, e)
        dbconn.discard()
        return Outcome(SliceResult.LEASE_LOST)
    return Outcome(SliceResult.PAUSED, RunStatus.PAUSED)


def _drive_once(run_id: int, owner: str, max_seconds: float | None) -> Outcome:
    if not leases.claim(run_id, owner):
        return Outcome(SliceResult.NOT_CLAIMED)
    log.info("run %s: slice started by %s", run_id, owner)
    started = time.monotonic()
    try:
        result = Driver(run_id, owner, max_seconds).run()
    except LeaseLost:
        log.warning("run %s: lease lost by %s; stopping", run_id, owner)
        result = SliceResult.LEASE_LOST
    finally:
        # Time inside slices counts against the wall-time budget; waiting for people does not.
        Run.objects.filter(pk=run_id).update(
            active_seconds=F("active_seconds") + (time.monotonic() - started)
        )
        leases.release(run_id, owner)
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or ""
    log.info("run %s: slice ended (%s); the run is %s", run_id, result, status)
    if result in REQUEUE and status == RunStatus.RUNNING:
        enqueue(run_id)
    return Outcome(result, status)


class Driver:
    """One slice: take the run, open its session, step until something ends the slice."""

    def __init__(self, run_id: int, owner: str, max_seconds: float | None) -> None:
        self.run_id = run_id
        self.owner = owner
        started = time.monotonic()
        deadline = started + (max_seconds or settings.SHIFTLOG["SLICE_SECONDS"])
        self.run_obj = Run.objects.get(pk=run_id)
        # This slice joins its deferred work before it ends (run).
        s = self.slice = Slice(self.run_obj, owner, deadline, started=started, may_defer=True)
        self.budgets = Budgets(s)
        self.sessions = Sessions(s, self.budgets)
        self.turns = Turns(s, self.sessions)
        self.finish = Finish(s, self.sessions, self.turns)
        # The ratchet (Finish) runs at handoffs (Sessions), and finishing ends the session.
        self.sessions.ratchet_with(self.finish.ratchet, baseline=self.finish.baseline)
        self.gate = Gate(s, self.sessions)
        self.network = Network(s, s.isolation)
        self.calls = Calls(s, self.gate, self.sessions, self.finish, self.network)

    def run(self) -> SliceResult:
        finished = self._finished_before_it_died()
        # A resumed run whose success was left to complete is taken as any queued run is.
        taking = finished is None or self.run_obj.status == RunStatus.QUEUED
        if taking and not self._take():
            return SliceResult.NOT_DRIVABLE
        watching = None
        try:
            self._bring_workspace()
            if finished is not None:
                return self._complete_success(finished)
            # The change feed of the workspace while this worker drives the run (checkpoints).
            watching = workspaces.watch(self.run_obj)
            self._contain()
            self.network.start()
            self.sessions.open()
            for part in self.calls.parts:
                part.at_start()
            self.network.tell_decisions()
            self.finish.config.tell_decisions()
            self.calls.recover()
            while True:
                try:
                    self._step()
                except SliceOver as over:
                    if not self._next_session_here(over.result):
                        raise
        except SliceOver as over:
            return over.result
        except IllegalTransition as e:
            # Someone else (a person) moved the run meanwhile; their word wins.
            log.info("run %s: %s; ending the slice", self.run_id, e)
            return SliceResult.of_status(e.current)
        except BlobStoreUnavailable as e:
            return self._pause(str(e), PauseCause.STORE_DOWN)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            return self._pause_for_space(e)
        finally:
            try:
                self.slice.join_deferred()
            finally:
                self.network.stop()
                workspaces.unwatch(watching)
            if workspaces.cached():
                workspaces.evict(keep=self.run_id)

    def _next_session_here(self, result: SliceResult) -> bool:
        """After a handoff, start the next session in this slice when it has time left: a
        context reset costs a new session, not a new slice (no release, queue, claim or
        rebuild from the log)."""
        s = self.slice
        if (
            result != SliceResult.HANDOFF
            or not settings.SHIFTLOG["NEXT_SESSION_IN_SLICE"]
            or s.status != RunStatus.RUNNING
            or shutdown_requested.is_set()
            or time.monotonic() >= s.deadline
        ):
            return False
        self.sessions.open_next()
        return True

    def _bring_workspace(self) -> None:
        """Where workspaces are each host's cache: restore the run's last committed workspace
        here when this host lacks it or holds an older state, before the first step."""
        restored = workspaces.ensure_local(self.run_obj)
        if restored is not None:
            self.slice.append(
                NewEvent(EventKind.WORKSPACE_RESTORED, restored, actor=self.slice.owner)
            )

    def _contain(self) -> None:
        """Refuse to run commands this worker cannot isolate (unless the operator allowed it),
        and record how the run's commands are contained whenever that changes."""
        s, run = self.slice, self.run_obj
        refusal = isolation.refusal()
        if refusal:
            s.transition(RunStatus.PAUSED, reason=refusal, cause=PauseCause.UNISOLATED)
            raise SliceOver(SliceResult.PAUSED)
        if run.isolation != s.isolation:
            run.isolation = s.isolation
            Run.objects.filter(pk=run.pk).update(isolation=s.isolation)
            s.append(
                NewEvent(
                    EventKind.RUN_ISOLATION,
                    {
                        "isolation": s.isolation,
                        "unisolated": s.isolation != "bwrap",
                        "worker": s.owner,
                        "limits": {
                            "memory_mb": s.limits.memory_bytes // MIB,
                            "processes": s.limits.processes,
                            "cpu_seconds": s.limits.cpu_seconds,
                        },
                        "toolchain": s.toolchain or [],
                    },
                    actor=s.owner,
                )
            )

    def _pause(self, reason: str, cause: str) -> SliceResult:
        """Pause the run for what a person or the reaper must see to (the store is down)."""
        log.warning("run %s: %s", self.run_id, reason)
        try:
            self.slice.transition(
                RunStatus.PAUSED,
                reason=reason,
                expect={RunStatus.RUNNING, RunStatus.VERIFYING},  # checks stopped: run again
                cause=cause,
            )
        except IllegalTransition as e:
            return SliceResult.of_status(e.current)
        return SliceResult.PAUSED

    def _pause_for_space(self, error: OSError) -> SliceResult:
        """The disk under the workspaces or the store is full: what was being written (a blob,
        a checkpoint) was never named by an event, so nothing is half-written. The run waits
        for a person, who resumes it once there is room (found by bench/chaos.py)."""
        where = f" ({error.filename})" if error.filename else ""
        reason = f"the disk is full{where}: {error.strerror}; resume the run once there is room"
        return self._pause(reason, PauseCause.DISK_FULL)

    def _finished_before_it_died(self) -> Session | None:
        return finished_session(self.run_obj)

    def _complete_success(self, session: Session) -> SliceResult:
        complete_success(self.slice, self.sessions, session)
        return SliceResult.SUCCEEDED

    def _take(self) -> bool:
        """Move the run to running: from queued, or from verifying when the worker that ran its
        checks died (its finish call is then done again: the checks run again). False when it
        is in no state to drive."""
        run = self.run_obj
        moves = {
            RunStatus.QUEUED: "",
            RunStatus.VERIFYING: "a worker stopped while the done-conditions ran; they run again",
        }
        if run.status in moves:
            try:
                moved = self.slice.transition(
                    RunStatus.RUNNING, reason=moves[run.status], expect={run.status}
                )
            except IllegalTransition:
                return False
            # The row as the transition read it under its lock, not read again.
            for field in ("status", "status_reason", "pause_cause", "started_at", "updated_at"):
                setattr(run, field, getattr(moved, field))
        return run.status == RunStatus.RUNNING

    def _step(self) -> None:
        s = self.slice
        if shutdown_requested.is_set():
            raise SliceOver(SliceResult.SHUTDOWN)
        if time.monotonic() >= s.deadline:
            raise SliceOver(SliceResult.SLICE_ENDED)
        self.budgets.check()
        self.sessions.check_limits()
        turn = self.turns.next()
        calls = self.gate.plan(turn.tool_uses)
        # The first call's tool.call goes in with the turn when nothing stands in its way, and
        # its result too when it only reads (then the whole step is one transaction).
        first_ready = bool(calls) and calls[0].action == "allow"
        read = self.calls.read_first(calls) if first_ready else None
        self.turns.record(
            turn,
            first_call=call_event(s, calls[0].block) if first_ready else None,
            first_result=(calls[0].block, read) if read is not None else None,
        )
        if not calls:
            s.harness_message(
                prompts.NUDGE_MAX_TOKENS if turn.stop_reason == "max_tokens" else prompts.NUDGE,
                reason="nudge",
            )
        # Decisions of the previous turn's calls are of no use to this one's.
        self.sessions.forget_approvals()
        self.calls.run(calls, first_called=first_ready, first_done=read is not None)
        self.sessions.stop_unless_running()


def finished_session(run: Run) -> Session | None:
    """The session that ended as finished when the checks passed, where the run was never
    marked succeeded: its worker died first (the run is still verifying), or a person paused
    the run while its checks ran (it comes back queued when resumed). Both found by
    bench/chaos.py: the agent used to be sent back to work it had finished. For the harness's
    own runs (Driver.run) and external agents' (agents/runtime/external.py) alike."""
    status = run.status
    if status not in (RunStatus.VERIFYING, RunStatus.QUEUED):
        return None
    last = Session.objects.filter(run_id=run.pk).order_by("-index").first()
    if last is None or last.end_reason != EndReason.FINISHED:
        return None
    if status == RunStatus.QUEUED:
        # Rewound since? Then that session is on an abandoned branch and the run goes on.
        latest = (
            Event.objects.on_live_branch(run.pk, Event.objects.ranges_of(run))
            .filter(kind__in=[EventKind.SESSION_STARTED, EventKind.SESSION_ENDED])
            .order_by("-seq")
            .values_list("kind", "payload")
            .first()
        )
        if latest is None or latest[0] != EventKind.SESSION_ENDED:
            return None
        if latest[1].get("index") != last.index or latest[1].get("reason") != "finished":
            return None
    return last


def complete_success(s: Slice, sessions: Sessions, session: Session) -> None:
    """Mark the run a finished session left succeeded (finished_session). Its final checkpoint
    is of the workspace brought to this host first (the caller's): this host's copy may be an
    older state (found by bench/chaos.py: a worker on another host recorded its stale copy, and
    the last session's committed write was gone)."""
    sessions.adopt(session)
    resumed = s.status == RunStatus.RUNNING  # after a pause that came as the checks ran
    if resumed:
        s.transition(
            RunStatus.VERIFYING,
            reason="the done-conditions had passed when the run was paused; completing it",
            expect={RunStatus.RUNNING},
        )
    ended = (
        Event.objects.filter(run_id=s.run_id, kind=EventKind.SESSION_ENDED)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if not Checkpoint.objects.filter(run_id=s.run_id, seq__gt=ended or 0).exists():
        s.checkpoint(CheckpointKind.SESSION_END, f"end of session {s.session.index} (finished)")
    s.transition(
        RunStatus.SUCCEEDED,
        reason="every done-condition passed (marked "
        + ("when the run was resumed)" if resumed else "after its worker stopped)"),
        expect={RunStatus.VERIFYING},
    )
