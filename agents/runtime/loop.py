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

import logging
import time

from django.conf import settings
from django.db.models import F

from agents import isolation, leases
from agents.eventlog import LeaseLost, NewEvent
from agents.isolation import MIB
from agents.jobs import enqueue
from agents.lifecycle import IllegalTransition
from agents.models import EventKind, Run, RunStatus
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

__all__ = ["Driver", "Outcome", "SliceResult", "drive"]


def drive(run_id: int, *, owner: str | None = None, max_seconds: float | None = None) -> Outcome:
    """Drive one slice of a run. Safe to call from any worker, any number of times."""
    owner = owner or leases.worker_id()
    if not leases.claim(run_id, owner):
        return Outcome(SliceResult.NOT_CLAIMED)
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
        s = self.slice = Slice(self.run_obj, owner, deadline, started=started)
        self.budgets = Budgets(s)
        # The ratchet (Finish) runs at handoffs (Sessions), and finishing ends the session.
        self.sessions = Sessions(s, self.budgets, ratchet=lambda: self.finish.ratchet())
        self.turns = Turns(s, self.sessions)
        self.finish = Finish(s, self.sessions, self.turns)
        self.gate = Gate(s)
        self.network = Network(s, s.isolation)
        self.calls = Calls(s, self.gate, self.sessions, self.finish, self.network)

    def run(self) -> SliceResult:
        if not self._take():
            return SliceResult.NOT_DRIVABLE
        try:
            self._contain()
            self.network.start()
            self.sessions.open()
            self.network.tell_decisions()
            self.calls.recover()
            while True:
                self._step()
        except SliceOver as over:
            return over.result
        except IllegalTransition as e:
            # Someone else (a person) moved the run meanwhile; their word wins.
            log.info("run %s: %s; ending the slice", self.run_id, e)
            return SliceResult.of_status(e.current)
        finally:
            self.network.stop()

    def _contain(self) -> None:
        """Refuse to run commands this worker cannot isolate (unless the operator allowed it),
        and record how the run's commands are contained whenever that changes."""
        s, run = self.slice, self.run_obj
        refusal = isolation.refusal()
        if refusal:
            s.transition(RunStatus.PAUSED, reason=refusal)
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

    def _take(self) -> bool:
        """Move the run to running: from queued, or from verifying when the worker that ran its
        checks died (its finish call is then closed as interrupted and the agent calls finish
        again). False when it is in no state to drive."""
        run = self.run_obj
        moves = {
            RunStatus.QUEUED: "",
            RunStatus.VERIFYING: "a worker stopped while the done-conditions ran; "
            "the agent continues",
        }
        if run.status in moves:
            try:
                self.slice.transition(
                    RunStatus.RUNNING, reason=moves[run.status], expect={run.status}
                )
            except IllegalTransition:
                return False
            run.refresh_from_db()
            self.slice.status = run.status
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
        # The first call's tool.call goes in with the turn when nothing stands in its way.
        first_ready = bool(calls) and calls[0].action == "allow"
        self.turns.record(
            turn,
            first_call=call_event(s, calls[0].block) if first_ready else None,
        )
        if not calls:
            s.harness_message(
                prompts.NUDGE_MAX_TOKENS if turn.stop_reason == "max_tokens" else prompts.NUDGE,
                reason="nudge",
            )
        # Decisions of the previous turn's calls are of no use to this one's.
        s.approvals = {}
        self.calls.run(calls, first_called=first_ready)
        self.sessions.stop_unless_running()
