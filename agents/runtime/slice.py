"""What one slice of a run holds while it drives the run, and how a slice ends.

A `Slice` is the state the runtime's parts share (the run, the open session, the conversation,
the worker's lease, what it has read of the log) plus the few acts every part needs: append
events under the lease, change the run's status, write a harness message, suspend or stop.
Everything in it is rebuilt from the database when a slice starts: nothing lives only here.
"""

from __future__ import annotations

import mimetypes
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.conf import settings

from agents import checkpoints, eventlog, isolation, leases, lifecycle, providers, sandbox
from agents.blobstore import BlobStore
from agents.eventlog import NewEvent
from agents.models import (
    Approval,
    Artifact,
    Event,
    EventKind,
    Run,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.runtime.conversation import Conversation

HEARTBEAT_SECONDS = 1.0


class SliceResult(StrEnum):
    """What ended a slice."""

    SUCCEEDED = "succeeded"
    HANDOFF = "handoff"  # the session ended with a handoff; the next one is queued
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FAILED = "failed"
    AWAITING = "awaiting"  # waiting for a person's decision, holding no worker
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


class Slice:
    def __init__(self, run: Run, owner: str, deadline: float, *, started: float) -> None:
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
        self.workspace = sandbox.Workspace(run.workspace_path)
        self.provider = providers.for_run(run)
        self.rules: list[dict[str, Any]] = [*run.tool_policy, *settings.SHIFTLOG["TOOL_POLICY"]]
        self.status: str = run.status
        self.known_seq: int = run.last_seq
        self.session: Session | None = None  # set by Sessions.open before any step
        # Rebuilt from the log when the session opens (Sessions.open); until then an empty one.
        self.conv = Conversation(first_message="")
        # The provider's place on the live branch (a rewind or fork moves it back).
        self.previous_meta: dict[str, Any] = {}
        # The log's seq when the current turn's request was built.
        self.context_seq = 0
        # File-changing tool calls since the last checkpoint (a periodic one after N).
        self.file_changes = 0
        # The session turn at which the harness asked for a handoff.
        self.handoff_asked_at: int | None = None
        # The approvals of the calls still open in this session, by tool_use_id.
        self.approvals: dict[str, Approval] = {}
        self.last_heartbeat = 0.0

    @property
    def session_id(self) -> int | None:
        return self.session.pk if self.session is not None else None

    # --- the log ------------------------------------------------------------------------
    def append(self, *new: NewEvent) -> eventlog.Appended:
        """Append under this worker's lease and take in what others appended meanwhile."""
        appended = eventlog.append_many(self.run_id, list(new), lease_owner=self.owner)
        self.absorb(appended)
        return appended

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
        self.known_seq = appended.events[-1].seq
        self.status = appended.status

    def record_result(
        self, block: dict[str, Any], result: sandbox.ToolResult, *extra: NewEvent
    ) -> None:
        """A tool call's result: in the log (with any events that go with it) and in the
        conversation."""
        appended = self.append(
            self.event(
                EventKind.TOOL_RESULT,
                {
                    "tool_use_id": block["id"],
                    "name": block["name"],
                    "output": result.output,
                    "is_error": result.is_error,
                    "data": result.data,
                },
            ),
            *extra,
        )
        self.conv.add_tool_result(
            appended.events[0].seq,
            block["id"],
            appended.events[0].payload["output"],  # as stored: secrets redacted
            result.is_error,
        )

    def harness_message(self, text: str, *, reason: str) -> None:
        """A message from the harness that the agent reads in its next request."""
        appended = self.append(
            self.event(EventKind.HARNESS_MESSAGE, {"text": text, "reason": reason})
        )
        self.conv.add_text(appended.events[0].seq, text)

    # --- status -------------------------------------------------------------------------
    def transition(self, target: str, *, reason: str = "", expect: set[str] | None = None) -> None:
        """A status change caused by this worker, checked against its lease."""
        lifecycle.transition(
            self.run_id,
            target,
            actor=self.owner,
            reason=reason,
            expect=expect,
            session_id=self.session_id,
            lease_owner=self.owner,
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
        return status is None or status == RunStatus.CANCELLED

    # --- checkpoints and artifacts ------------------------------------------------------
    def checkpoint(self, kind: str, label: str = "") -> None:
        checkpoint = checkpoints.create(
            self.run_id,
            kind=kind,
            label=label,
            session_id=self.session_id,
            actor=self.owner,
            lease_owner=self.owner,
        )
        self.file_changes = 0
        self.workspace_bytes = checkpoint.bytes_total

    def store_artifact(
        self, name: str, kind: str, data: bytes, mime: str | None = None
    ) -> Artifact:
        digest = BlobStore().put(data)
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
