"""The brain: drives one slice of a run, step by step, with everything in the event log.

A slice claims the run's lease, rebuilds the current session's conversation from the log, closes
any tool call a dead worker left open, and then repeats: ask the provider for a turn, record it,
run its tools through the sandbox, record their results. It returns when the session ends, the run
suspends (pause, budget, approval), the slice's time is up, the worker is shutting down, or the
lease is lost. Nothing it needs lives only in memory.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents import (
    checkpoints,
    checks,
    eventlog,
    lifecycle,
    notifications,
    policy,
    providers,
    sandbox,
    verification,
)
from agents.blobstore import BlobStore
from agents.eventlog import LeaseLost, NewEvent
from agents.lifecycle import IllegalTransition
from agents.models import (
    Approval,
    ApprovalStatus,
    Artifact,
    ArtifactKind,
    Checkpoint,
    CheckpointKind,
    EndReason,
    Event,
    EventKind,
    Run,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.providers.base import ProviderError, Turn, TurnRequest, Usage
from agents.providers.pricing import cost_usd
from agents.runtime import prompts
from agents.runtime.conversation import INTERRUPTED, Conversation
from agents.tasks import enqueue
from agents.worker import shutdown_requested

log = logging.getLogger(__name__)


# Turns the agent gets after being asked for a handoff before the harness writes one itself.
HANDOFF_GRACE_TURNS = 2
BUDGET_WARNING_AT = 0.8
HEARTBEAT_SECONDS = 1.0


@dataclass
class Outcome:
    result: str  # what ended the slice: see Driver.run
    status: str = ""

    def __str__(self) -> str:
        return self.result


class _SliceOver(Exception):
    def __init__(self, result: str):
        self.result = result


def drive(run_id: int, *, owner: str | None = None, max_seconds: float | None = None) -> Outcome:
    """Drive one slice of a run. Safe to call from any worker, any number of times."""
    from agents import leases

    owner = owner or leases.worker_id()
    if not leases.claim(run_id, owner):
        return Outcome("not-claimed")
    started = time.monotonic()
    driver = Driver(run_id, owner, max_seconds)
    try:
        result = driver.run()
    except LeaseLost:
        log.warning("run %s: lease lost by %s; stopping", run_id, owner)
        result = "lease-lost"
    finally:
        Run.objects.filter(pk=run_id).update(
            active_seconds=F("active_seconds") + (time.monotonic() - started)
        )
        leases.release(run_id, owner)
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or ""
    if result in {"handoff", "slice-ended", "shutdown"} and status == RunStatus.RUNNING:
        enqueue(run_id)
    return Outcome(result, status)


class Driver:
    def __init__(self, run_id: int, owner: str, max_seconds: float | None):
        self.run_id = run_id
        self.owner = owner
        self.deadline = time.monotonic() + (max_seconds or settings.SHIFTLOG["SLICE_SECONDS"])
        self.slice_started = time.monotonic()
        self.status = RunStatus.RUNNING
        self.known_seq = 0
        self.last_heartbeat = 0.0
        self.previous_meta: dict[str, Any] = {}
        self.file_changes = 0

    # --- the slice ----------------------------------------------------------------------
    def run(self) -> str:
        """Returns one of: succeeded, handoff, paused, cancelled, failed, awaiting,
        slice-ended, shutdown, not-drivable."""
        run = Run.objects.get(pk=self.run_id)
        self.known_seq = run.last_seq
        if run.status == RunStatus.QUEUED:
            try:
                self._transition(RunStatus.RUNNING, expect={RunStatus.QUEUED})
            except IllegalTransition:
                return "not-drivable"
            run.refresh_from_db()
        elif run.status == RunStatus.VERIFYING:
            # The worker that ran the checks died: back to running; _recover then closes its
            # finish call as interrupted and the agent calls finish again.
            try:
                self._transition(
                    RunStatus.RUNNING,
                    reason="a worker stopped while the done-conditions ran; the agent continues",
                    expect={RunStatus.VERIFYING},
                )
            except IllegalTransition:
                return "not-drivable"
            run.refresh_from_db()
        elif run.status != RunStatus.RUNNING:
            return "not-drivable"
        self.run_obj = run
        self.workspace = sandbox.Workspace(run.workspace_path)
        if not run.isolation:
            run.isolation = self._isolation()
            Run.objects.filter(pk=run.pk).update(isolation=run.isolation)
        self.provider = providers.for_run(run)
        self.rules = [*run.tool_policy, *settings.SHIFTLOG["TOOL_POLICY"]]
        self.approvals: dict[str, Approval] = {}
        try:
            self.session = self._current_session() or self._start_session()
            self._rebuild()
            self._recover()
            while True:
                self._step()
        except _SliceOver as over:
            return over.result
        except IllegalTransition as e:
            # Someone else (a person) moved the run meanwhile; their word wins.
            log.info("run %s: %s; ending the slice", self.run_id, e)
            return self._status_result(e.current)

    def _step(self) -> None:
        if shutdown_requested.is_set():
            raise _SliceOver("shutdown")
        if time.monotonic() >= self.deadline:
            raise _SliceOver("slice-ended")
        self._check_budgets()
        self._check_session_limits()
        turn = self._next_turn()
        tool_uses = turn.tool_uses
        plans = [self._plan(block) for block in tool_uses]
        # The first call's tool.call goes in with the turn when nothing stands in its way.
        first_ready = bool(plans) and plans[0] == "allow"
        self._record_turn(turn, call_first=first_ready)
        if not tool_uses:
            self._harness_message(
                prompts.NUDGE_MAX_TOKENS if turn.stop_reason == "max_tokens" else prompts.NUDGE,
                reason="nudge",
            )
        # Every call of the turn that needs a person is asked about at once, so people can
        # decide them side by side; they still run in the model's order.
        self.approvals = {}
        asks = [block for block, plan in zip(tool_uses, plans, strict=True) if plan == "ask"]
        if asks:
            self._request_approvals(asks)
        for i, block in enumerate(tool_uses):
            self._run_tool(block, already_called=(i == 0 and first_ready))
        self._stop_unless_running()

    # --- sessions -----------------------------------------------------------------------
    def _current_session(self) -> Session | None:
        return (
            Session.objects.filter(run_id=self.run_id)
            .exclude(status=SessionStatus.ENDED)
            .order_by("-index")
            .first()
        )

    def _start_session(self) -> Session:
        run = self.run_obj
        previous = Session.objects.filter(run_id=self.run_id).order_by("-index").first()
        index = previous.index + 1 if previous else 1
        if run.max_sessions and index > run.max_sessions:
            self._exceed(f"max sessions ({run.max_sessions}) reached")
        self._warn_if_near("sessions", index, run.max_sessions)
        last_checks = checks.latest_results(self.run_id)
        # Notes that came in after the previous session ended go into this one's first message.
        ended_at_seq = (
            Event.objects.filter(run_id=self.run_id, kind=EventKind.SESSION_ENDED, session=previous)
            .values_list("seq", flat=True)
            .first()
            if previous
            else 0
        ) or 0
        notes = [
            f"{p.get('author', 'a person')}: {p['text']}"
            for p in Event.objects.filter(
                run_id=self.run_id, kind=EventKind.HUMAN_NOTE, seq__gt=ended_at_seq
            ).values_list("payload", flat=True)
        ]
        handoff = previous.handoff if previous else None
        resume = run.resume_state or {}
        fresh_resume = bool(resume) and not resume.get("consumed")
        if fresh_resume:
            # After a rewind or a fork: start from the checkpoint's state plus the person's note.
            handoff = resume.get("handoff")
            if resume.get("note"):
                notes.insert(
                    0,
                    f"(with the rewind to checkpoint {resume.get('checkpoint_id')}) {resume['note']}",
                )
        message = prompts.first_message(
            goal=run.goal,
            checks=run.checks,
            rubric=run.rubric,
            session_index=index,
            max_sessions=run.max_sessions,
            max_turns=run.max_turns_per_session,
            handoff=handoff,
            check_results=last_checks,
            listing=self.workspace.listing(),
            notes=notes,
            acceptance=run.acceptance,
        )
        with transaction.atomic():
            session = Session.objects.create(run_id=self.run_id, index=index)
            appended = eventlog.append_many(
                self.run_id,
                [
                    NewEvent(
                        EventKind.SESSION_STARTED,
                        {"index": index, "first_message": message},
                        session_id=session.pk,
                        actor=self.owner,
                    )
                ],
                lease_owner=self.owner,
            )
            Session.objects.filter(pk=session.pk).update(first_seq=appended.events[0].seq)
            if fresh_resume:
                run.resume_state = {**resume, "consumed": True}
                Run.objects.filter(pk=run.pk).update(resume_state=run.resume_state)
            # _rebuild reads first_seq from this object: it must not stay at the default 0.
            session.first_seq = appended.events[0].seq
        self._absorb(appended)
        if index == 1 and not Checkpoint.objects.filter(run_id=self.run_id).exists():
            self.session = session
            kind = CheckpointKind.FORK if run.forked_from_id else CheckpointKind.RUN_START
            self._checkpoint(kind, "the workspace the run started from")
        return session

    def _checkpoint(self, kind: str, label: str = "") -> None:
        checkpoints.create(
            self.run_id,
            kind=kind,
            label=label,
            session_id=self.session.pk,
            actor=self.owner,
            lease_owner=self.owner,
        )
        self.file_changes = 0

    def _end_session(self, reason: str, extra: list[NewEvent] | None = None) -> None:
        if reason == EndReason.HANDOFF and settings.SHIFTLOG["CHECKS_AT_SESSION_END"]:
            # The ratchet's reading at this checkpoint: progress that slipped shows here, even
            # if the agent never calls finish.
            self._verify(at="session_end")
        events = list(extra or [])
        events.append(
            NewEvent(
                EventKind.SESSION_ENDED,
                {"index": self.session.index, "reason": reason},
                session_id=self.session.pk,
                actor=self.owner,
            )
        )
        with transaction.atomic():
            appended = eventlog.append_many(self.run_id, events, lease_owner=self.owner)
            Session.objects.filter(pk=self.session.pk).update(
                status=SessionStatus.ENDED, end_reason=reason, ended_at=timezone.now()
            )
        self._absorb(appended)
        if reason in {EndReason.HANDOFF, EndReason.FINISHED}:
            self._checkpoint(
                CheckpointKind.SESSION_END, f"end of session {self.session.index} ({reason})"
            )

    def _transition(self, target: str, *, reason: str = "", expect: set[str] | None = None) -> None:
        """A status change caused by this worker, checked against its lease."""
        session = getattr(self, "session", None)
        lifecycle.transition(
            self.run_id,
            target,
            actor=self.owner,
            reason=reason,
            expect=expect,
            session_id=session.pk if session else None,
            lease_owner=self.owner,
        )

    def _suspend_session(self) -> None:
        Session.objects.filter(pk=self.session.pk, status=SessionStatus.ACTIVE).update(
            status=SessionStatus.SUSPENDED
        )

    def _rebuild(self) -> None:
        if self.session.status == SessionStatus.SUSPENDED:
            Session.objects.filter(pk=self.session.pk).update(status=SessionStatus.ACTIVE)
        # seq__gte keeps SQLite on the (run, seq) index range of this session; without it the
        # planner walks every event of the run to satisfy ORDER BY seq (O(history) per slice).
        rows = list(
            Event.objects.filter(
                run_id=self.run_id, session_id=self.session.pk, seq__gte=self.session.first_seq
            )
            .order_by("seq")
            .values_list("seq", "kind", "payload")
        )
        # Notes that arrived while no session was open are delivered to this one.
        orphans = list(
            Event.objects.filter(
                run_id=self.run_id,
                session__isnull=True,
                kind=EventKind.HUMAN_NOTE,
                seq__gt=self.session.first_seq,
            ).values_list("seq", "kind", "payload")
        )
        events = sorted(rows + orphans, key=lambda row: row[0])
        if events:
            self.known_seq = max(self.known_seq, events[-1][0])
        self.conv = Conversation.from_events(events)
        # The provider's place on the live branch (a rewind or fork moves it back).
        self.previous_meta = checkpoints._provider_meta(self.run_obj)
        self.file_changes = Event.objects.filter(
            run_id=self.run_id,
            kind=EventKind.TOOL_CALL,
            payload__name__in=list(checkpoints.FILE_TOOLS),
            seq__gt=Checkpoint.objects.filter(run_id=self.run_id)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
            or 0,
        ).count()
        self.session.refresh_from_db()
        open_ids = [b["id"] for b in self.conv.open_tool_uses]
        self.approvals = {
            a.tool_use_id: a
            for a in Approval.objects.filter(
                run_id=self.run_id, tool_use_id__in=open_ids
            ).select_related("decided_by")
        }

    def _recover(self) -> None:
        """Close what a dead worker left open, so tools run at most once."""
        interrupted, not_started = self.conv.unfinished_tool_uses()
        for block in interrupted:
            self._record_result(
                block,
                sandbox.ToolResult(output=INTERRUPTED, is_error=True, data={"interrupted": True}),
            )
        if interrupted:
            self._append(
                NewEvent(
                    EventKind.ERROR,
                    {
                        "source": "recovery",
                        "message": f"a worker stopped mid-tool; closed "
                        f"{len(interrupted)} tool call(s) as interrupted without running them again",
                    },
                    session_id=self.session.pk,
                    actor=self.owner,
                )
            )
        for block in not_started:
            self._run_tool(block, already_called=False)
        if interrupted or not_started:
            self._stop_unless_running()

    # --- limits and budgets -------------------------------------------------------------
    def _check_session_limits(self) -> None:
        run, session = self.run_obj, self.session
        why = None
        if session.turns >= run.max_turns_per_session:
            why = f"{session.turns} turns of {run.max_turns_per_session}"
        elif session.last_input_tokens >= run.max_input_tokens_per_session:
            why = f"{session.last_input_tokens} input tokens of {run.max_input_tokens_per_session}"
        if why is None:
            return
        if not self.conv.handoff_requested:
            self._harness_message(
                prompts.HANDOFF_REQUEST.format(why=why), reason="handoff_requested"
            )
            self.conv.handoff_requested = True
            self.handoff_asked_at = session.turns
            return
        asked_at = getattr(self, "handoff_asked_at", run.max_turns_per_session)
        if session.turns >= asked_at + HANDOFF_GRACE_TURNS:
            handoff = {
                "summary": "The session reached its limit and the agent did not write a handoff; "
                "the harness wrote this one. The agent's last words follow.",
                "done": [],
                "next_steps": [],
                "open_questions": [],
                "last_text": self.conv.last_text[-4000:],
                "forced": True,
            }
            self._save_handoff(handoff)
            self._check_drift(handoff)  # measured like the agent's own (see handoff_text)
            self._end_session(EndReason.HANDOFF)
            raise _SliceOver("handoff")

    def _check_budgets(self) -> None:
        run = self.run_obj
        active = run.active_seconds + (time.monotonic() - self.slice_started)
        limits = [
            ("tokens", run.total_tokens, run.max_tokens, "max tokens ({limit}) reached"),
            ("cost", run.cost_usd, run.max_cost_usd, "max cost (${limit}) reached"),
            ("wall time", active, run.max_wall_seconds, "max wall time ({limit} s) reached"),
        ]
        for name, used, limit, message in limits:
            if limit:
                if used >= limit:
                    self._exceed(message.format(limit=limit))
                self._warn_if_near(name, used, limit)

    def _warn_if_near(self, name: str, used: Any, limit: Any) -> None:
        run = self.run_obj
        if (
            not limit
            or name in run.budget_warnings
            or used < Decimal(str(limit)) * Decimal(str(BUDGET_WARNING_AT))
        ):
            return
        run.budget_warnings = [*run.budget_warnings, name]
        Run.objects.filter(pk=run.pk).update(budget_warnings=run.budget_warnings)
        self._append(
            NewEvent(
                EventKind.BUDGET_WARNING,
                {"budget": name, "used": str(used), "limit": str(limit)},
                actor=self.owner,
            )
        )

    def _exceed(self, reason: str) -> None:
        self._append(NewEvent(EventKind.BUDGET_EXCEEDED, {"reason": reason}, actor=self.owner))
        self._transition(RunStatus.PAUSED, reason=f"budget: {reason}; raise it and resume")
        if hasattr(self, "session"):
            self._suspend_session()
        raise _SliceOver("paused")

    # --- model turns --------------------------------------------------------------------
    def _next_turn(self) -> Turn:
        run = self.run_obj
        request = TurnRequest(
            model=run.model,
            system=prompts.SYSTEM_PROMPT,
            messages=self.conv.request_messages(),
            tools=sandbox.TOOL_SCHEMAS,
            previous_meta=self.previous_meta,
            handoff_requested=self.conv.handoff_requested,
            input_chars=self.conv.chars + _STATIC_CHARS,
            branch=run.branch_seq,
        )
        self.context_seq = self.known_seq
        try:
            return self.provider.next_turn(request)
        except ProviderError as e:
            self._provider_failed(e)

    def _provider_failed(self, e: ProviderError) -> None:
        """A model call failed for good: record it, then pause (resumable) or fail the run."""
        self._append(
            NewEvent(
                EventKind.ERROR,
                {
                    "source": "provider",
                    "error": type(e).__name__,
                    "message": e.message,
                    "status_code": e.status_code,
                },
                session_id=self.session.pk,
                actor=self.owner,
            )
        )
        target = RunStatus.FAILED if e.action == "fail" else RunStatus.PAUSED
        self._transition(target, reason=e.message)
        if target == RunStatus.FAILED:
            self._end_session(EndReason.FAILED)
        else:
            self._suspend_session()
        raise _SliceOver("failed" if target == RunStatus.FAILED else "paused") from e

    def _record_turn(self, turn: Turn, *, call_first: bool) -> None:
        usage = turn.usage
        cost = cost_usd(turn.model, usage)
        payload = {
            "content": turn.content,
            "text": turn.text,
            "stop_reason": turn.stop_reason,
            "usage": usage.as_dict(),
            "cost_usd": str(cost),
            "model": turn.model,
            "latency_ms": round(turn.latency_ms, 2),
            "context_seq": self.context_seq,
            "meta": turn.meta,
        }
        new = [NewEvent(EventKind.MODEL_TURN, payload, session_id=self.session.pk, actor="agent")]
        first_tool = turn.tool_uses[:1] if call_first else []
        if first_tool:
            new.append(self._tool_call_event(first_tool[0]))
        increments = {
            "turns": 1,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_input_tokens,
            "cache_write_tokens": usage.cache_creation_input_tokens,
            "cost_usd": cost,
        }
        context_tokens = (
            usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        )
        with transaction.atomic():
            appended = eventlog.append_many(
                self.run_id, new, lease_owner=self.owner, increments=increments
            )
            eventlog.add_to_session(self.session.pk, increments, last_input_tokens=context_tokens)
        run, session = self.run_obj, self.session
        for name, value in increments.items():
            setattr(run, name, getattr(run, name) + value)
            setattr(session, name, getattr(session, name) + value)
        session.last_input_tokens = context_tokens
        self.previous_meta = turn.meta
        self.conv.add_assistant(turn.content, context_seq=self.context_seq)
        if first_tool:
            self.conv.add_tool_call(first_tool[0]["id"])
        self._absorb(appended)

    # --- tools --------------------------------------------------------------------------
    def _tool_call_event(
        self,
        block: dict[str, Any],
        tool_input: dict[str, Any] | None = None,
        approval: Approval | None = None,
    ) -> NewEvent:
        payload = {
            "tool_use_id": block["id"],
            "name": block["name"],
            "input": block.get("input") if tool_input is None else tool_input,
        }
        if approval is not None:
            payload["approval_id"] = approval.pk
        return NewEvent(EventKind.TOOL_CALL, payload, session_id=self.session.pk, actor="agent")

    # --- approvals ----------------------------------------------------------------------
    def _gate(
        self, block: dict[str, Any], tool_input: dict[str, Any]
    ) -> tuple[dict[str, Any], Approval | None, str] | None:
        """(input to run, approval, note for the agent), or None when the call must not run."""
        approval = self.approvals.get(block["id"])
        if approval is None:
            decision = self._decide(block["name"], tool_input)
            if decision.action == "allow":
                return tool_input, None, ""
            if decision.action == "deny":
                self._record_result(
                    block,
                    sandbox.ToolResult(
                        output=f"Denied by the tool policy ({decision.reason}): this call is not "
                        "allowed in this run. Find another way, or ask for it in your reply.",
                        is_error=True,
                        data={"policy": "deny", "rule": decision.rule},
                    ),
                )
                return None
            approval = self._request_approvals([block])[block["id"]]
        if approval.status == ApprovalStatus.PENDING:
            approval = self._await_approval(approval)
        if approval.status == ApprovalStatus.APPROVED:
            note = ""
            if approval.edited_input is not None:
                note = (
                    f"A person ({approval.decided_by}) edited this call before approving it. "
                    f"What ran: {json.dumps(approval.edited_input)}"
                )
            if approval.comment:
                note += ("\n" if note else "") + f"Their comment: {approval.comment}"
            return (approval.edited_input or tool_input), approval, note
        reason = (
            "nobody decided in time (expired)"
            if approval.status == ApprovalStatus.EXPIRED
            else approval.comment
        )
        self._record_result(
            block,
            sandbox.ToolResult(
                output=f"A person denied this call: {reason}. It did not run; carry on without it.",
                is_error=True,
                data={"approval_id": approval.pk, "decision": approval.status},
            ),
        )
        return None

    def _request_approvals(self, blocks: list[dict[str, Any]]) -> dict[str, Approval]:
        timeout = (
            self.run_obj.approval_timeout_seconds or settings.SHIFTLOG["APPROVAL_TIMEOUT_SECONDS"]
        )
        expires = timezone.now() + timedelta(seconds=timeout) if timeout else None
        with transaction.atomic():
            created = []
            for block in blocks:
                tool_input = sandbox.validate_input(block["name"], block.get("input"))
                approval, _ = Approval.objects.get_or_create(
                    run_id=self.run_id,
                    tool_use_id=block["id"],
                    defaults={
                        "session": self.session,
                        "seq": self.known_seq,
                        "tool_name": block["name"],
                        "tool_input": tool_input,
                        "expires_at": expires,
                    },
                )
                self.approvals[block["id"]] = approval
                created.append(approval)
            self._append(
                *[
                    NewEvent(
                        EventKind.APPROVAL_REQUESTED,
                        {
                            "approval_id": a.pk,
                            "tool_use_id": a.tool_use_id,
                            "tool": a.tool_name,
                            "input": a.tool_input,
                            "reason": self._decide(a.tool_name, a.tool_input).reason,
                            "expires_at": a.expires_at.isoformat() if a.expires_at else None,
                        },
                        session_id=self.session.pk,
                        actor=self.owner,
                    )
                    for a in created
                ]
            )
            notifications.notify(
                self.run_obj,
                "approval.requested",
                approvals=[
                    {"id": a.pk, "tool": a.tool_name, "input": a.tool_input} for a in created
                ],
            )
        return self.approvals

    def _await_approval(self, approval: Approval) -> Approval:
        """Suspend the run until a person decides; returns at once if one already has."""
        if not Checkpoint.objects.filter(
            run_id=self.run_id, seq__gt=approval.seq, kind=CheckpointKind.PRE_APPROVAL
        ).exists():
            self._checkpoint(
                CheckpointKind.PRE_APPROVAL,
                f"before {approval.tool_name} waited for approval {approval.pk}",
            )
        with transaction.atomic():
            # Lock the run row before the last look, as deciding does (see agents.approvals).
            Run.objects.select_for_update().filter(pk=self.run_id).first()
            approval.refresh_from_db()
            if approval.status != ApprovalStatus.PENDING:
                return approval
            waiting = Approval.objects.filter(
                run_id=self.run_id, status=ApprovalStatus.PENDING
            ).count()
            self._transition(
                RunStatus.AWAITING_APPROVAL,
                reason=f"waiting for a person to decide {waiting} tool call(s)",
                expect={RunStatus.RUNNING},
            )
        self._suspend_session()
        raise _SliceOver("awaiting")

    def _plan(self, block: dict[str, Any]) -> str:
        """What the policy says of a call: allow, ask, deny, or invalid (bad input)."""
        try:
            tool_input = sandbox.validate_input(block["name"], block.get("input"))
        except sandbox.ToolInputError:
            return "invalid"
        return self._decide(block["name"], tool_input).action

    def _decide(self, name: str, tool_input: dict[str, Any]) -> policy.Decision:
        """The policy's decision, with protected files first: the checks depend on them."""
        if name in ("write_file", "edit_file") and self.run_obj.protected:
            try:
                rel = str(
                    self.workspace.resolve(tool_input["path"]).relative_to(self.workspace.path)
                )
            except (sandbox.ToolInputError, ValueError):
                rel = None
            if rel is not None and verification.is_protected(self.run_obj.protected, rel):
                return policy.Decision(
                    self.run_obj.protected_action,
                    f"{rel} is protected: the done-conditions depend on it",
                )
        return policy.decide(self.rules, name, tool_input)

    def _run_tool(self, block: dict[str, Any], *, already_called: bool) -> None:
        name = block["name"]
        try:
            tool_input = sandbox.validate_input(name, block.get("input"))
        except sandbox.ToolInputError as e:
            self._record_result(block, sandbox.ToolResult(output=str(e), is_error=True))
            return
        gate = self._gate(block, tool_input)
        if gate is None:
            return  # denied: the reason is the tool's result
        tool_input, approval, note = gate
        if not already_called:
            self._append(self._tool_call_event(block, tool_input, approval))
            self.conv.add_tool_call(block["id"])
        self._execute(block, name, tool_input, note)

    def _execute(
        self, block: dict[str, Any], name: str, tool_input: dict[str, Any], note: str = ""
    ) -> None:
        if name in sandbox.WORKSPACE_TOOLS:
            result = sandbox.execute(
                self.workspace,
                name,
                tool_input,
                should_stop=self._heartbeat,
                bash_timeout=settings.SHIFTLOG["BASH_TIMEOUT_SECONDS"],
                output_limit=settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"],
                isolation=settings.SHIFTLOG["ISOLATION"] or None,
            )
            if note:
                result.output = f"{note}\n\n{result.output}"
            self._record_result(block, result)
            if name in checkpoints.FILE_TOOLS:
                self.file_changes += 1
                every = settings.SHIFTLOG["CHECKPOINT_EVERY"]
                if every and self.file_changes >= every:
                    self._checkpoint(
                        CheckpointKind.PERIODIC,
                        f"after {self.file_changes} file-changing tool calls",
                    )
        elif name == "save_artifact":
            self._record_result(block, self._save_artifact(tool_input))
        elif name == "handoff":
            self._handoff(block, tool_input)
        elif name == "finish":
            self._finish(block, tool_input)

    def _record_result(
        self, block: dict[str, Any], result: sandbox.ToolResult, extra: list[NewEvent] | None = None
    ) -> None:
        event = NewEvent(
            EventKind.TOOL_RESULT,
            {
                "tool_use_id": block["id"],
                "name": block["name"],
                "output": result.output,
                "is_error": result.is_error,
                "data": result.data,
            },
            session_id=self.session.pk,
            actor=self.owner,
        )
        appended = self._append(event, *(extra or []))
        self.conv.add_tool_result(
            appended.events[0].seq,
            block["id"],
            appended.events[0].payload["output"],
            result.is_error,
        )

    def _heartbeat(self) -> bool:
        """Called while a tool runs: renews the lease; True means stop the tool now."""
        now = time.monotonic()
        if now - self.last_heartbeat < HEARTBEAT_SECONDS:
            return False
        self.last_heartbeat = now
        from agents import leases

        status = leases.renew(self.run_id, self.owner)
        return status is None or status == RunStatus.CANCELLED

    def _save_artifact(self, tool_input: dict[str, Any]) -> sandbox.ToolResult:
        try:
            path = self.workspace.resolve(tool_input["path"])
            data = path.read_bytes()
        except sandbox.ToolInputError as e:
            return sandbox.ToolResult(output=str(e), is_error=True)
        except OSError as e:
            return sandbox.ToolResult(
                output=f"cannot read {tool_input['path']}: {e.strerror}", is_error=True
            )
        name = tool_input.get("name") or tool_input["path"]
        artifact = self._store_artifact(name, tool_input.get("kind", ArtifactKind.FILE), data)
        return sandbox.ToolResult(
            output=f"Saved artifact {name!r} ({artifact.size} bytes).",
            data={"artifact_id": artifact.pk, "blob": artifact.blob_hash},
        )

    def _store_artifact(
        self, name: str, kind: str, data: bytes, mime: str | None = None
    ) -> Artifact:
        import mimetypes

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
        self._append(
            NewEvent(
                EventKind.ARTIFACT_SAVED,
                {"artifact_id": artifact.pk, "name": name, "kind": kind, "size": len(data)},
                session_id=self.session.pk,
                actor=self.owner,
            )
        )
        return artifact

    def _save_handoff(self, handoff: dict[str, Any]) -> None:
        Session.objects.filter(pk=self.session.pk).update(handoff=handoff)
        self.session.handoff = handoff
        text = f"# Handoff from session {self.session.index}\n\n{prompts.format_handoff(handoff)}\n"
        self._store_artifact(
            f"handoff-session-{self.session.index}.md",
            ArtifactKind.HANDOFF,
            text.encode(),
            "text/markdown",
        )

    def _handoff(self, block: dict[str, Any], handoff: dict[str, Any]) -> None:
        handoff = {
            "summary": handoff["summary"],
            "done": handoff.get("done", []),
            "next_steps": handoff.get("next_steps", []),
            "open_questions": handoff.get("open_questions", []),
        }
        self._save_handoff(handoff)
        self._record_result(
            block, sandbox.ToolResult(output="Handoff saved. This session ends now.")
        )
        self._check_drift(handoff)
        self._end_session(EndReason.HANDOFF)
        raise _SliceOver("handoff")

    def _check_drift(self, handoff: dict[str, Any]) -> None:
        """Record drift.warning when a handoff, the agent's or the harness's, left the goal."""
        warning = verification.drift(self.run_obj.goal, handoff)
        if warning is not None:
            self._append(
                NewEvent(
                    EventKind.DRIFT_WARNING,
                    warning,
                    session_id=self.session.pk,
                    actor=self.owner,
                )
            )

    def _finish(self, block: dict[str, Any], tool_input: dict[str, Any]) -> None:
        self._transition(
            RunStatus.VERIFYING,
            reason="the agent called finish; running the done-conditions",
            expect={RunStatus.RUNNING},
        )
        outcome = self._verify(at="finish")
        passed, notes = outcome["passed"], outcome["notes"]
        if passed and verification.criteria_of(self.run_obj):
            verdict = self._judge(outcome["results"])
            passed = verdict.passed
            if not verdict.passed:
                notes.append(
                    "The judge did not accept the work:\n"
                    + "\n".join(f"- {c['criterion']}: {c['reason']}" for c in verdict.failures())
                )
        summary = "\n\n".join([checks.summary(outcome["required"]), *notes])
        self._store_artifact(
            f"checks-session-{self.session.index}-turn-{self.session.turns}.md",
            ArtifactKind.REPORT,
            f"# Done-conditions\n\n{summary}\n".encode(),
            "text/markdown",
        )
        if passed:
            self._record_result(block, sandbox.ToolResult(output=summary))
            self._end_session(EndReason.FINISHED)
            self._transition(
                RunStatus.SUCCEEDED,
                reason="every done-condition passed",
                expect={RunStatus.VERIFYING},
            )
            raise _SliceOver("succeeded")
        self._transition(
            RunStatus.RUNNING,
            reason="done-conditions not met; the agent continues",
            expect={RunStatus.VERIFYING},
        )
        self._record_result(block, sandbox.ToolResult(output=summary, is_error=True))

    def _verify(self, *, at: str) -> dict[str, Any]:
        """Run the checks (and acceptance checks) as the harness: protected originals first, then
        record results, regressions and acceptance changes. Returns what _finish needs."""
        run = self.run_obj
        notes: list[str] = []
        if run.protected:
            changed = verification.tampered(self.workspace, run.protected)
            if changed:
                self._append(
                    NewEvent(
                        EventKind.CHECK_TAMPERED,
                        {"files": changed, "at": at},
                        session_id=self.session.pk,
                        actor=self.owner,
                    )
                )
                moved = verification.restore_originals(self.workspace, run.protected, changed)
                for rel, data in moved.items():  # taken out of the workspace, not lost
                    self._store_artifact(f"moved-aside/{rel}", ArtifactKind.FILE, data)
                notes.append(
                    "Protected files were changed and have been put back to their originals before "
                    "the checks ran (files added under a protected folder are kept as moved-aside/ "
                    "artifacts): " + ", ".join(f"{c['path']} ({c['change']})" for c in changed)
                )
            verification.clear_caches(self.workspace, run.protected)
        extra = [
            c["check"] for c in run.acceptance if c.get("check") and c["check"] not in run.checks
        ]
        results = checks.run_checks(
            [*run.checks, *extra],
            self.workspace,
            should_stop=self._heartbeat,
            timeout=settings.SHIFTLOG["CHECK_TIMEOUT_SECONDS"],
            output_limit=settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"],
            isolation=settings.SHIFTLOG["ISOLATION"] or None,
        )
        for r in results:
            r["at"] = at
            r["required"] = r["command"] in run.checks
        live = checkpoints.live_filter(self.run_id)
        regressed = verification.regressions(self.run_id, results, live)
        self._append(
            *[
                NewEvent(EventKind.CHECK_RESULT, r, session_id=self.session.pk, actor=self.owner)
                for r in results
            ],
            *[
                NewEvent(
                    EventKind.CHECK_REGRESSED,
                    {**g, "at": at},
                    session_id=self.session.pk,
                    actor=self.owner,
                )
                for g in regressed
            ],
        )
        if regressed:
            notes.append(
                "REGRESSION: these checks passed earlier and fail now: "
                + ", ".join(f"`{g['command']}`" for g in regressed)
            )
        by_command = {r["command"]: r["passed"] for r in results}
        self._update_acceptance(
            {
                c["name"]: by_command[c["check"]]
                for c in run.acceptance
                if c.get("check") in by_command
            }
        )
        required = [r for r in results if r["required"]]
        failing = [
            c["name"] for c in run.acceptance if c.get("check") and not by_command.get(c["check"])
        ]
        if failing:
            notes.append("Acceptance criteria not met yet: " + ", ".join(failing))
        passed = bool(required) and all(r["passed"] for r in required) and not failing
        return {"passed": passed, "results": results, "required": required, "notes": notes}

    def _update_acceptance(self, states: dict[str, bool]) -> None:
        run = self.run_obj
        changed = [
            c["name"]
            for c in run.acceptance
            if c["name"] in states and c["passing"] != states[c["name"]]
        ]
        if not changed:
            return
        run.acceptance = [
            {**c, "passing": states.get(c["name"], c["passing"])} for c in run.acceptance
        ]
        Run.objects.filter(pk=run.pk).update(acceptance=run.acceptance)
        passing = sum(c["passing"] for c in run.acceptance)
        self._append(
            NewEvent(
                EventKind.ACCEPTANCE_UPDATED,
                {
                    "changed": changed,
                    "passing": passing,
                    "total": len(run.acceptance),
                    "criteria": run.acceptance,
                },
                session_id=self.session.pk,
                actor=self.owner,
            )
        )

    def _judge(self, results: list[dict[str, Any]]) -> verification.Verdict:
        run = self.run_obj
        start = (
            Checkpoint.objects.filter(
                run=run, kind__in=[CheckpointKind.RUN_START, CheckpointKind.FORK]
            )
            .order_by("seq")
            .first()
        )
        changes = checkpoints.snapshots().diff(
            start.tree if start else None,
            self.workspace.path,
            cache_path=checkpoints.cache_path(run),
        )
        diff_text = "\n".join(
            c.diff or f"{c.status}: {c.path}" + (" (binary)" if c.binary else "") for c in changes
        )
        so_far = (
            Event.objects.filter(run=run, kind=EventKind.JUDGE_VERDICT)
            .filter(checkpoints.live_filter(run.pk))
            .count()
        )
        try:
            verdict = verification.run_judge(
                run,
                self.provider,
                diff_text=diff_text,
                check_results=results,
                verdicts_so_far=so_far,
            )
        except ProviderError as e:
            self._provider_failed(e)
        cost = cost_usd(verdict.model or run.judge_model or run.model, Usage(**verdict.usage))
        self._append(
            NewEvent(
                EventKind.JUDGE_VERDICT,
                {
                    "criteria": verdict.criteria,
                    "passed": verdict.passed,
                    "model": verdict.model,
                    "error": verdict.error,
                    "usage": verdict.usage,
                    "cost_usd": str(cost),
                },
                session_id=self.session.pk,
                actor="judge",
            )
        )
        if cost:
            Run.objects.filter(pk=run.pk).update(cost_usd=F("cost_usd") + cost)
            run.cost_usd += cost
        judged = {c["criterion"]: c["passed"] for c in verdict.criteria}
        self._update_acceptance(
            {
                c["name"]: judged[c["name"]]
                for c in run.acceptance
                if not c.get("check") and c["name"] in judged
            }
        )
        return verdict

    # --- events -------------------------------------------------------------------------
    def _append(self, *new: NewEvent) -> eventlog.Appended:
        appended = eventlog.append_many(self.run_id, list(new), lease_owner=self.owner)
        self._absorb(appended)
        return appended

    def _harness_message(self, text: str, *, reason: str) -> None:
        appended = self._append(
            NewEvent(
                EventKind.HARNESS_MESSAGE,
                {"text": text, "reason": reason},
                session_id=self.session.pk,
                actor=self.owner,
            )
        )
        self.conv.add_text(appended.events[0].seq, text)

    def _absorb(self, appended: eventlog.Appended) -> None:
        """Take in events others appended since our last one (notes, status changes)."""
        first = appended.events[0].seq
        if first > self.known_seq + 1:
            foreign = (
                Event.objects.filter(run_id=self.run_id, seq__gt=self.known_seq, seq__lt=first)
                .order_by("seq")
                .values_list("seq", "kind", "payload")
            )
            for seq, kind, payload in foreign:
                if kind == EventKind.HUMAN_NOTE:
                    self.conv.apply(seq, kind, payload)
                elif kind == EventKind.RUN_UPDATED and "tool_policy" in payload:
                    self.rules = [*payload["tool_policy"], *settings.SHIFTLOG["TOOL_POLICY"]]
        self.known_seq = appended.events[-1].seq
        self.status = appended.status

    def _stop_unless_running(self) -> None:
        if self.status != RunStatus.RUNNING:
            self._suspend_session()
            if self.status == RunStatus.CANCELLED:
                self._end_session(EndReason.CANCELLED)
            raise _SliceOver(self._status_result(self.status))

    @staticmethod
    def _status_result(status: str) -> str:
        return {
            RunStatus.PAUSED: "paused",
            RunStatus.CANCELLED: "cancelled",
            RunStatus.FAILED: "failed",
            RunStatus.SUCCEEDED: "succeeded",
            RunStatus.AWAITING_APPROVAL: "awaiting",
        }.get(status, "not-drivable")

    def _isolation(self) -> str:
        forced = settings.SHIFTLOG["ISOLATION"]
        return forced or sandbox.isolation_available()


_STATIC_CHARS = len(prompts.SYSTEM_PROMPT) + sum(len(str(t)) for t in sandbox.TOOL_SCHEMAS)
