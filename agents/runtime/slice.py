"""What one slice of a run holds while it drives the run, and how a slice ends.

A `Slice` is the state the runtime's parts share (the run, the open session, the conversation,
the worker's lease, what it has read of the log) plus the few acts every part needs: append
events under the lease, change the run's status, write a harness message, suspend or stop.
Everything in it is rebuilt from the database when a slice starts: nothing lives only here.
"""

from __future__ import annotations

import mimetypes
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, NoReturn, TypeVar

from django.conf import settings
from django.db import connections, transaction

from agents import (
    blobstore,
    checkpoints,
    dbconn,
    done_conditions,
    eventlog,
    isolation,
    leases,
    lifecycle,
    logcontext,
    providers,
    sandbox,
    workspaces,
)
from agents.eventlog import NewEvent
from agents.models import (
    Approval,
    Artifact,
    Checkpoint,
    Event,
    EventKind,
    PauseCause,
    Run,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.runtime.call_pool import CallPool
from agents.runtime.conversation import Conversation
from agents.snapshots import SnapshotResult

HEARTBEAT_SECONDS = 1.0
# While a model answers, the lease is renewed (and a cancel noticed) at least this often.
MODEL_RENEW_MAX_SECONDS = 5.0
T = TypeVar("T")


_POOL: CallPool | None = None
_POOL_LOCK = threading.Lock()


_MODEL_POOL: CallPool | None = None


def _model_pool() -> CallPool:
    """The process's threads for model calls (Slice.call_model), made on first use. A call the
    slice stopped waiting for (its run was cancelled) keeps its thread until the API answers."""
    global _MODEL_POOL
    with _POOL_LOCK:
        if _MODEL_POOL is None:
            # As many as the worker threads that may wait on one (SHIFTLOG_MODEL_THREADS): a
            # smaller pool made the 65th waiting slice wait for another's call first.
            _MODEL_POOL = CallPool(settings.SHIFTLOG["MODEL_THREADS"], "shiftlog-model")
        return _MODEL_POOL


def _deferred_pool() -> CallPool:
    """The process's threads for deferred work (Slice.defer), made on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = CallPool(16, "shiftlog-deferred")
        return _POOL


class SliceResult(StrEnum):
    """What ended a slice."""

    SUCCEEDED = "succeeded"
    HANDOFF = "handoff"  # the session ended with a handoff; the next one is queued
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FAILED = "failed"
    AWAITING = "awaiting"  # waiting for a person's decision, holding no worker
    WAITING = "waiting"  # a fleet's parent waiting for its children, holding no worker
    SLICE_ENDED = "slice-ended"  # its time was up; the run is queued again
    SHUTDOWN = "shutdown"  # the worker is stopping; the run is queued again
    NOT_DRIVABLE = "not-drivable"  # the run is in no state a worker drives
    NOT_CLAIMED = "not-claimed"  # another worker holds the run
    LEASE_LOST = "lease-lost"

    @classmethod
    def of_status(cls, status: str) -> SliceResult:
        """The result for a run a person moved meanwhile (their word wins)."""
        return {
            RunStatus.PAUSED: cls.PAUSED,
            RunStatus.CANCELLED: cls.CANCELLED,
            RunStatus.FAILED: cls.FAILED,
            RunStatus.SUCCEEDED: cls.SUCCEEDED,
            RunStatus.AWAITING_APPROVAL: cls.AWAITING,
            RunStatus.WAITING_FOR_CHILDREN: cls.WAITING,
        }.get(status, cls.NOT_DRIVABLE)


# After these, a run that is still running needs its next slice queued.
REQUEUE = frozenset({SliceResult.HANDOFF, SliceResult.SLICE_ENDED, SliceResult.SHUTDOWN})


@dataclass
class Outcome:
    result: SliceResult
    status: str = ""

    def __str__(self) -> str:
        return str(self.result)


class SliceOver(Exception):
    """Raised by any part to end the slice; the driver returns its result."""

    def __init__(self, result: SliceResult):
        super().__init__(result)
        self.result = result


# Who assigns each attribute of a Slice: the slice itself (through its methods), or the one part
# of the runtime that owns it; every other part asks that owner. The attributes set in __init__
# and never again are the slice's fixed context. tests/test_architecture.py holds the rule.
OWNERS = {
    "session": "sessions", "conv": "sessions", "handoff_asked_at": "sessions",
    "approvals": "sessions", "previous_meta": "sessions",
    "context_seq": "turns",
    "rules": "slice", "status": "slice", "known_seq": "slice", "workspace_tree": "slice",
    "workspace_bytes": "slice", "file_changes": "slice", "last_heartbeat": "slice",
    "_deferred": "slice", "_deferred_session": "slice",
    "_session": "slice",  # behind the `session` property (Sessions sets it)
}  # fmt: skip


class Slice:
    def __init__(
        self, run: Run, owner: str, deadline: float, *, started: float, may_defer: bool = False
    ) -> None:
        self.run = run
        # How this worker contains the run's commands, and with what (agents/isolation.py).
        self.isolation = isolation.isolation()
        self.limits = isolation.limits_for(run)
        self.toolchain = isolation.toolchain_for(run)
        # The workspace's size at its latest checkpoint here (its cap is checked between steps).
        self.workspace_bytes = 0
        self.run_id: int = run.pk
        self.owner = owner
        self.deadline = deadline
        self.started = started  # time.monotonic() when the slice began
        self.provider = providers.for_run(run)
        self.rules: list[dict[str, Any]] = [*run.tool_policy, *settings.SHIFTLOG["TOOL_POLICY"]]
        self.status: str = run.status
        self.known_seq: int = run.last_seq
        self._session: Session | None = None  # set by Sessions.open before any step
        # Rebuilt from the log when the session opens (Sessions.open); until then an empty one.
        self.conv = Conversation(first_message="")
        # The provider's place on the live branch (a rewind or fork moves it back).
        self.previous_meta: dict[str, Any] = {}
        # The log's seq when the current turn's request was built.
        self.context_seq = 0
        # File-changing tool calls since the last checkpoint (a periodic one after N).
        self.file_changes = 0
        # The run's last committed workspace in the store (workspaces as each host's cache).
        self.workspace_tree: str = run.workspace_tree
        # The session turn at which the harness asked for a handoff.
        self.handoff_asked_at: int | None = None
        # The approvals of the calls still open in this session, by tool_use_id.
        self.approvals: dict[str, Approval] = {}
        self.last_heartbeat = 0.0
        # Work a worker's slice may run beside its next steps (defer): off where the slice is
        # one call of an external agent, which outlives no thread.
        self.may_defer = may_defer
        self._driver = threading.current_thread()
        self._deferred: Future | None = None
        self._deferred_session: int | None = None

    @cached_property
    def workspace(self) -> sandbox.Workspace:
        """The run's workspace here, made on first use: after the worker has claimed the run and
        restored it (a folder made earlier would look like this host's copy of it)."""
        return sandbox.Workspace(self.run.workspace_path)

    @property
    def session(self) -> Session | None:
        return self._session

    @session.setter
    def session(self, value: Session | None) -> None:
        # The worker's log lines name the session it is in (agents/logcontext.py).
        self._session = value
        logcontext.set_session(value.index if value is not None else None)

    @property
    def session_id(self) -> int | None:
        """The open session's; in deferred work, the session that deferred it."""
        if self._deferred_session is not None and threading.current_thread() is not self._driver:
            return self._deferred_session
        return self.session.pk if self.session is not None else None

    # --- the log ------------------------------------------------------------------------
    def append(self, *new: NewEvent) -> eventlog.Appended:
        """Append under this worker's lease and take in what others appended meanwhile (only
        the driving thread: deferred work appends, the driver reads what is new)."""
        appended = eventlog.append_many(self.run_id, list(new), lease_owner=self.owner)
        if threading.current_thread() is self._driver:
            self.absorb(appended)
        return appended

    # --- deferred work ------------------------------------------------------------------
    def defer(self, work: Callable[[], object], what: str) -> None:
        """Run `work` on a pool thread while the slice goes on (the session-end checks
        while the next session starts and its first model call is made); anything that needs
        the workspace or the log in order calls join_deferred first. Inline unless the slice
        is `deferring` (a worker's, and SHIFTLOG["DEFER_SESSION_CHECKS"])."""
        self.join_deferred()
        if not self.deferring:
            work()
            return
        self._deferred_session = self.session_id

        def body() -> None:
            # The pool's threads keep their database connections from one job to the next (a
            # new one each time would start with a cold cache); one that broke is replaced.
            for conn in connections.all(initialized_only=True):
                conn.close_if_unusable_or_obsolete()
            try:
                work()
            finally:
                # A pooled connection goes back to the process's pool between jobs: an idle
                # pool thread must not keep one of the bounded pool's connections.
                dbconn.release()

        self._deferred = _deferred_pool().submit(body)

    @property
    def deferring(self) -> bool:
        return self.may_defer and bool(settings.SHIFTLOG["DEFER_SESSION_CHECKS"])

    def join_deferred(self) -> None:
        """Wait for deferred work (and raise what it raised)."""
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        deferred.result()  # raises what the work raised

    def event(self, kind: str, payload: dict[str, Any], *, actor: str | None = None) -> NewEvent:
        """A new event of the current session, by this worker unless `actor` says otherwise."""
        return NewEvent(kind, payload, session_id=self.session_id, actor=actor or self.owner)

    def absorb(self, appended: eventlog.Appended) -> None:
        """Take in events others appended since our last one (notes, policy changes)."""
        first = appended.events[0].seq
        if first > self.known_seq + 1:
            from_others = (
                Event.objects.filter(run_id=self.run_id, seq__gt=self.known_seq, seq__lt=first)
                .order_by("seq")
                .values_list("seq", "kind", "payload")
            )
            for seq, kind, payload in from_others:
                if kind == EventKind.HUMAN_NOTE:
                    self.conv.apply(seq, kind, payload)
                elif kind == EventKind.RUN_UPDATED and "tool_policy" in payload:
                    self.rules = [*payload["tool_policy"], *settings.SHIFTLOG["TOOL_POLICY"]]
                elif kind == EventKind.RUN_UPDATED and "rule_added" in payload:
                    self.rules = [payload["rule_added"], *self.rules]  # as services.add_rule
        self.known_seq = appended.events[-1].seq
        self.status = appended.status

    def result_event(self, block: dict[str, Any], result: sandbox.ToolResult) -> NewEvent:
        """The `tool.result` event of a call."""
        return self.event(
            EventKind.TOOL_RESULT,
            {
                "tool_use_id": block["id"],
                "name": block["name"],
                "output": result.output,
                "is_error": result.is_error,
                "data": result.data,
            },
        )

    def add_result(self, block: dict[str, Any], result: sandbox.ToolResult, event: Event) -> None:
        """A recorded result into the conversation, as stored (secrets redacted)."""
        self.conv.add_tool_result(event.seq, block["id"], event.payload["output"], result.is_error)

    def record_result(
        self,
        block: dict[str, Any],
        result: sandbox.ToolResult,
        *extra: NewEvent,
        state: SnapshotResult | None = None,
    ) -> None:
        """A tool call's result: in the log (with any events that go with it) and in the
        conversation. `state`: the workspace the call left, already in the store, committed
        as the run's with the result (workspaces as each host's cache)."""
        event = self.result_event(block, result)
        if state is None:
            appended = self.append(event, *extra)
        else:
            event.payload["workspace"] = {"tree": state.tree, "bytes_added": state.bytes_added}
            with transaction.atomic():
                appended = self.append(event, *extra)
                Run.objects.filter(pk=self.run_id).update(workspace_tree=state.tree)
            self.workspace_tree = state.tree
            workspaces.hold(self.run, state.tree, state.bytes_total)
        self.add_result(block, result, appended.events[0])

    def workspace_state(self) -> SnapshotResult | None:
        """After a call that may have changed the workspace: its new state, stored, when it did
        change and workspaces are each host's cache; else None (no scan with a change feed)."""
        if not workspaces.cached():
            return None
        state = workspaces.changed_tree(self.run, self.workspace_tree)
        if state is not None:
            self.workspace_bytes = state.bytes_total
        return state

    def harness_message(self, text: str, *, reason: str) -> None:
        """A message from the harness that the agent reads in its next request."""
        appended = self.append(
            self.event(EventKind.HARNESS_MESSAGE, {"text": text, "reason": reason})
        )
        self.conv.add_text(appended.events[0].seq, text)

    # --- status -------------------------------------------------------------------------
    def transition(
        self, target: str, *, reason: str = "", expect: set[str] | None = None, cause: str = ""
    ) -> Run:
        """A status change caused by this worker, checked against its lease: the run as it
        left it."""
        moved = lifecycle.transition(
            self.run_id,
            target,
            actor=self.owner,
            reason=reason,
            cause=cause,
            expect=expect,
            session_id=self.session_id,
            lease_owner=self.owner,
        )
        self.status = target
        if moved.last_seq == self.known_seq:
            # Its run.status event came right after what this slice had read (the row was
            # locked from before the append): nothing of others' to read back at the next append.
            self.known_seq += 1
        return moved

    def pause_at_limit(self, why: str) -> NoReturn:
        """A limit of the run was reached (what it may ask, say): it pauses with the reason, and
        the slice ends."""
        self.transition(
            RunStatus.PAUSED,
            reason=f"paused: {why}",
            expect={RunStatus.RUNNING},
            cause=PauseCause.LIMIT,
        )
        self.suspend_session()
        raise SliceOver(SliceResult.PAUSED)

    def run_checks(self, commands: list[str], **options: Any) -> list[dict[str, Any]]:
        """Run check commands as the harness does: in this slice's sandbox, with its limits and
        toolchain, stopping when the run is cancelled (done_conditions.run_checks). No
        database connection is held while they run (a check may take minutes)."""
        dbconn.release()
        return done_conditions.run_checks(
            commands,
            self.workspace,
            should_stop=self.heartbeat,
            timeout=settings.SHIFTLOG["CHECK_TIMEOUT_SECONDS"],
            output_limit=settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"],
            isolation=self.isolation,
            limits=self.limits,
            toolchain=self.toolchain,
            **options,
        )

    def suspend_session(self) -> None:
        if self.session is not None:
            Session.objects.filter(pk=self.session.pk, status=SessionStatus.ACTIVE).update(
                status=SessionStatus.SUSPENDED
            )

    def heartbeat(self) -> bool:
        """Called while a tool runs: renews the lease; True means stop the tool now."""
        now = time.monotonic()
        if now - self.last_heartbeat < HEARTBEAT_SECONDS:
            return False
        self.last_heartbeat = now
        status = leases.renew(self.run_id, self.owner)
        dbconn.release()  # the tool goes on running: no connection held meanwhile
        return status is None or status == RunStatus.CANCELLED

    def call_model(self, call: Callable[[], T], *, cancelled: Callable[[], NoReturn]) -> T:
        """Make a model call, which may take minutes, keeping the run's lease meanwhile.

        Nothing else renews the lease while the model answers: a call longer than the lease
        (30 s by default) would let the reaper hand the run to another worker, which would make
        the same call again, and again if it is as slow. So the call runs on a pool thread and
        this thread renews the lease every third of it (at most every 5 s) until it answers. A
        run cancelled meanwhile calls `cancelled` (which ends the slice) without waiting for the
        answer; a lease lost raises LeaseLost. The call must not touch the database: it is another
        thread's. The thread holds no database connection while it waits (agents/dbconn.py).
        A provider that answers at once (`instant`) is called here."""
        if getattr(self.provider, "instant", False):
            return call()
        # No database connection is held while the model answers (seconds to minutes): a
        # pooled one goes back to the pool now and after each renewal.
        dbconn.release()
        future = _model_pool().submit(call)
        # A third of the lease, at most 5 s: hundreds of slices waiting at once each renewing
        # every second cost more of the process's CPU than their steps (issue 32's 300 threads).
        every = max(0.2, min(MODEL_RENEW_MAX_SECONDS, settings.SHIFTLOG["LEASE_SECONDS"] / 3))
        while True:
            try:
                return future.result(timeout=every)
            except TimeoutError:
                if future.done():
                    raise  # the call itself timed out
            self.last_heartbeat = time.monotonic()
            status = leases.renew(self.run_id, self.owner)
            dbconn.release()
            if status is None:
                raise eventlog.LeaseLost(
                    f"run {self.run_id}: lease no longer held by {self.owner} (during a model call)"
                )
            if status == RunStatus.CANCELLED:
                self.status = status
                cancelled()

    # --- checkpoints and artifacts ------------------------------------------------------
    def checkpoint(self, kind: str, label: str = "") -> Checkpoint:
        self.join_deferred()
        checkpoint = checkpoints.create(
            self.run_id,
            kind=kind,
            label=label,
            session_id=self.session_id,
            actor=self.owner,
            lease_owner=self.owner,
            run=self.run,
        )
        self.file_changes = 0
        self.workspace_bytes = checkpoint.bytes_total
        self.workspace_tree = checkpoint.tree
        return checkpoint

    def file_changed(self) -> int:
        """A file-changing tool call ran: how many since the last checkpoint."""
        self.file_changes += 1
        return self.file_changes

    def count_file_changes(self, count: int) -> None:
        """The file-changing calls since the last checkpoint, as a session (re)opens."""
        self.file_changes = count

    def read_up_to(self, seq: int) -> None:
        """What the slice has read of the log reaches `seq` (a session rebuilt from it)."""
        self.known_seq = max(self.known_seq, seq)

    def read_tool_as(self, tool: str, ours: str) -> None:
        """Rules naming an agent's own tool (`Bash`) mean ours (`bash`) for this slice."""
        self.rules = [{**r, "tool": ours} if r["tool"] == tool else r for r in self.rules]

    def store_artifact(
        self, name: str, kind: str, data: bytes, mime: str | None = None
    ) -> Artifact:
        digest = blobstore.configured().put(data)
        artifact = Artifact.objects.create(
            run_id=self.run_id,
            session=self.session,
            seq=self.known_seq,
            name=name,
            kind=kind,
            blob_hash=digest,
            size=len(data),
            mime_type=mime or mimetypes.guess_type(name)[0] or "application/octet-stream",
        )
        self.append(
            self.event(
                EventKind.ARTIFACT_SAVED,
                {"artifact_id": artifact.pk, "name": name, "kind": kind, "size": len(data)},
            )
        )
        return artifact
