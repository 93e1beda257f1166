"""External agents: a run driven by a process outside Shiftlog, through the API.

The agent runs its own model and its own tools; Shiftlog stays its harness. Each of its calls is
done here the way a worker does a step, with the same parts: the call takes the run's lease for
its length (`_driving`), opens the session (`Sessions`), and asks the `Gate` about a tool call,
`Turns` records a model turn against the budgets, `Finish` runs the done-conditions in the
sandbox, `Sessions.hand_off` ends a session. So the event log, the approvals inbox, checkpoints
and budgets are those of any run. A worker never claims an external run (`leases.claim`).
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agents import (
    approvals,
    eventlog,
    hooks,
    inputs,
    isolation,
    leases,
    lifecycle,
    policy,
    reach,
    sandbox,
    workspaces,
)
from agents.decision_words import refusal
from agents.lifecycle import TERMINAL, IllegalTransition
from agents.models import (
    DRIVABLE_STATUSES,
    Approval,
    ApprovalStatus,
    CheckpointKind,
    Event,
    EventKind,
    ExternalCall,
    ExternalCallDecision,
    ExternalDriver,
    PauseCause,
    Run,
    RunStatus,
)
from agents.protected_paths import protected_decision
from agents.providers import pricing
from agents.providers.base import Turn, Usage
from agents.runtime.budgets import Budgets
from agents.runtime.calls import call_event
from agents.runtime.external_driver import (  # noqa: F401 (external.X are the public names)
    AGENT_ID,
    ExternalError,
    RewoundError,
    _drive_as,
    agent_id,
    rewind_reason,
    rewound,
    valid_root,
)
from agents.runtime.finish import Finish
from agents.runtime.gate import Gate, GatedCall, approval_note
from agents.runtime.loop import complete_success, finished_session
from agents.runtime.sessions import Sessions
from agents.runtime.slice import Slice, SliceOver
from agents.runtime.turns import Turns

# How long a call waits for the lease another call of the same agent holds.
LEASE_WAIT_SECONDS = 10.0


@dataclass
class Harness:
    s: Slice
    budgets: Budgets
    sessions: Sessions
    turns: Turns
    finish: Finish
    gate: Gate


def touch(run_id: int, agent: str | None = None) -> None:
    """The agent called: it is alive. One agent drives a run at a time (`agent`, when given,
    must be its driver, or the driver must have been silent for the run's heartbeat window).
    Its working time counts as the run's wall time: the time since its last call while the run
    was running (at most one heartbeat window: a silent agent is not working)."""
    now = timezone.now()
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return
    if agent is not None:
        _drive_as(run, agent, now)
    gap = 0.0
    if run.status == RunStatus.RUNNING and run.last_contact_at is not None:
        gap = max(0.0, min((now - run.last_contact_at).total_seconds(), run.heartbeat_window))
    Run.objects.filter(pk=run_id).update(
        last_contact_at=now, active_seconds=F("active_seconds") + gap
    )


def _external(run_id: int) -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ExternalError(f"no run with id {run_id}", 404)
    if not run.is_external:
        raise ExternalError(
            f"run {run_id} is driven by Shiftlog's {run.provider} provider, not by an external "
            "agent: create it with provider external"
        )
    return run


@contextmanager
def _driving(
    run_id: int, actor: str, agent: str = "agent", *, knows_rewinds: bool = False
) -> Iterator[Harness]:
    """Do one call of the agent as a worker does one step: under the run's lease, with the
    session open. Raises ExternalError when the run is in no state to be driven, and, with
    `knows_rewinds` (what would carry the agent's stale work over a rewind: an upload, a
    handoff, a finish), RewoundError while the agent has not read its context since a rewind.
    Asked under the lease, so no rewind can come between the question and the call."""
    run = _external(run_id)
    touch(run_id, agent)
    owner = f"external:{actor}:{agent}"
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    while not leases.claim(run_id, owner, external=True):
        run.refresh_from_db()
        if run.status not in DRIVABLE_STATUSES:
            raise ExternalError(f"run {run_id} is {run.status.replace('_', ' ')}")
        if time.monotonic() > deadline:
            raise ExternalError(f"run {run_id} is busy with another call of its agent; retry")
        time.sleep(0.05)
    try:
        run.refresh_from_db()
        if knows_rewinds and (rewind := rewound(run_id)) is not None:
            raise RewoundError(rewind)
        started = time.monotonic()
        s = Slice(run, owner, started + 24 * 3600, started=started)
        # Where workspaces are each host's cache, this web process's copy (uploads, checks).
        if (restored := workspaces.ensure_local(run)) is not None:
            s.append(s.event(EventKind.WORKSPACE_RESTORED, restored))
        budgets = Budgets(s)
        sessions = Sessions(s, budgets)
        turns = Turns(s, sessions)
        finish = Finish(s, sessions, turns)
        sessions.ratchet_with(finish.ratchet, baseline=finish.baseline)
        if (finished := finished_session(run)) is not None:
            # Its checks had passed and its session ended as finished, but the run was paused
            # meanwhile (or the worker died before marking it): done, not sent back to work.
            if run.status == RunStatus.QUEUED:
                s.transition(
                    RunStatus.RUNNING, reason="its external agent called", expect={run.status}
                )
            complete_success(s, sessions, finished)
            raise ExternalError(f"run {run_id} is {status_of(run_id).replace('_', ' ')}")
        if run.status in (RunStatus.QUEUED, RunStatus.VERIFYING):
            s.transition(
                RunStatus.RUNNING,
                reason="its external agent called"
                if run.status == RunStatus.QUEUED
                else "the checks were interrupted; the agent continues",
                expect={run.status},
            )
        try:
            sessions.open()
        except SliceOver:
            raise ExternalError(f"run {run_id} is {status_of(run_id).replace('_', ' ')}") from None
        yield Harness(s, budgets, sessions, turns, finish, Gate(s, sessions))
    except IllegalTransition as e:
        raise ExternalError(str(e)) from None
    finally:
        leases.release(run_id, owner)


def status_of(run_id: int) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or ""


# --- the session ----------------------------------------------------------------------------
def context(run_id: int, *, actor: str, agent: str = "agent") -> dict[str, Any]:
    """What the agent starts (or restarts) from: the session's first message and what people
    and the harness said since (after a fleet's children ended: how each did)."""
    told = rewound(run_id)
    with _driving(run_id, actor, agent) as h:
        with suppress(SliceOver):  # resumed before its children ended: it waits again
            for part in hooks.slice_part.collect(h.s, h.gate):
                part.at_start()
        answer = _context(h)
    # Read from the rewound state: the agent has taken the rewind in.
    ExternalDriver.objects.filter(run_id=run_id).update(
        seen_branch_seq=Run.objects.filter(pk=run_id).values_list("branch_seq", flat=True)[0]
    )
    return {**answer, "rewound": told}


def _context(h: Harness) -> dict[str, Any]:
    s = h.s
    first = (
        Event.objects.filter(
            run_id=s.run_id, session_id=s.session.pk, kind=EventKind.SESSION_STARTED
        )
        .values_list("payload", flat=True)
        .first()
    ) or {}
    said = [
        {"seq": seq, "kind": kind, "text": payload.get("text", "")}
        for seq, kind, payload in Event.objects.filter(
            run_id=s.run_id,
            session_id=s.session.pk,
            kind__in=[EventKind.HUMAN_NOTE, EventKind.HARNESS_MESSAGE],
        )
        .order_by("seq")
        .values_list("seq", "kind", "payload")
    ]
    return {
        "session": s.session.index,
        "first_message": first.get("first_message", ""),
        "messages": said,
        "handoff_requested": s.conv.handoff_requested,
        "run_status": status_of(s.run_id),
    }


def heartbeat(run_id: int, agent: str = "agent") -> str:
    _external(run_id)
    touch(run_id, agent)
    return status_of(run_id)


def turn(
    run_id: int,
    *,
    actor: str,
    agent: str = "agent",
    text: str,
    model: str,
    usage: Usage,
) -> dict[str, Any]:
    """A model turn of the agent, with its usage: it counts against the run's budgets; past a
    cap the run pauses, and the answer says so."""
    priced = pricing.cost(model or _external(run_id).model, usage)
    with _driving(run_id, actor, agent) as h:
        s = h.s
        if s.run.cost_usd + priced.usd > inputs.MAX_DOLLARS:
            raise ExternalError(
                f"this turn would take the run's cost past ${inputs.MAX_DOLLARS}, more than "
                "can be recorded",
                422,
            )
        if model and model != s.run.model:  # the agent's model is whatever it says it uses
            Run.objects.filter(pk=run_id).update(model=model)
            s.run.model = model
        content = [{"type": "text", "text": text}] if text else []
        h.turns.record(
            Turn(content=content, stop_reason="external", usage=usage, model=model or s.run.model),
            context_seq=s.known_seq,
        )
        seq = s.known_seq
        # Paused at a cap, or the harness wrote the handoff: the run's status says which.
        with suppress(SliceOver):
            h.budgets.check()
            h.sessions.check_limits()
        run = Run.objects.get(pk=run_id)
        return {
            "seq": seq,
            "run_status": run.status,
            "cost_usd": str(run.cost_usd),
            "handoff_requested": s.conv.handoff_requested,
            "rewound": rewound(run_id),
        }


def hand_off(
    run_id: int, *, actor: str, agent: str = "agent", handoff: dict[str, Any]
) -> dict[str, Any]:
    """End the session with the agent's handoff; the next one starts from goal + handoff."""
    try:
        handoff = sandbox.validate_input("handoff", handoff)
    except sandbox.ToolInputError as e:
        raise ExternalError(str(e), 422) from None
    with _driving(run_id, actor, agent, knows_rewinds=True) as h, suppress(SliceOver):
        h.sessions.hand_off(handoff)
    if status_of(run_id) not in DRIVABLE_STATUSES:
        return {
            "session": None,
            "first_message": "",
            "messages": [],
            "run_status": status_of(run_id),
        }
    return context(run_id, actor=actor, agent=agent)


# --- tool calls -----------------------------------------------------------------------------
def _answer(call: ExternalCall, decision: str) -> dict[str, Any]:
    approval = call.approval
    # What the agent is told of an approval, as Shiftlog's own agent is: an edit, a comment.
    note = (
        approval_note(approval) if approval and approval.status == ApprovalStatus.APPROVED else ""
    )
    run_to = (approval.edited_input if approval and approval.edited_input else None) or call.input
    reason = call.reason
    if approval is not None and approval.status != ApprovalStatus.PENDING:
        reason = refusal(approval)
    return {
        "id": call.tool_use_id,
        "decision": decision,
        "reason": reason,
        "input": run_to,
        "approval": approval.pk if approval else None,
        "note": note,
        "run_status": status_of(call.run_id),
        "rewound": rewound(call.run_id),
    }


def _refusal(run_id: int, tool_input: Any, reason: str, status: str) -> dict[str, Any]:
    return {
        "id": None,
        "decision": "deny",
        "reason": reason,
        "input": tool_input,
        "approval": None,
        "note": "",
        "run_status": status,
        "rewound": rewound(run_id),
    }


def _decide(h: Harness, call: policy.AgentCall, root: str | None) -> policy.Decision:
    """Protected paths first (by either spelling of the path), then the rules and the rest."""
    s = h.s
    found = protected_decision(
        call.tool, call.input, s.workspace, s.run.protected, s.run.protected_action
    )
    if found is not None:
        return found
    return policy.decide_agent(s.rules, call, root=root, workspace=s.workspace.path)


def propose(
    run_id: int,
    *,
    actor: str,
    agent: str = "agent",
    tool: str,
    tool_input: Any,
    call_id: str | None = None,
    root: str | None = None,
) -> dict[str, Any]:
    """The agent is about to run a tool: the run's policy and risk classifier decide, as for
    Shiftlog's own agent. `ask` puts an approval in the inbox and the run waits (no compute).

    `call_id` is the agent's own id of the call (Claude Code's tool_use_id): asked again with
    it (a retried hook), the same call answers, and no second approval is made. `root` is the
    agent's folder as it sees it: absolute paths under it are paths in the workspace."""
    if not isinstance(tool, str) or not tool.strip() or len(tool) > 100:
        raise ExternalError("tool must be a name of 1 to 100 characters", 422)
    if not isinstance(tool_input, dict):
        raise ExternalError("input must be a JSON object", 422)
    if call_id is not None and not AGENT_ID.fullmatch(call_id):
        raise ExternalError(
            "call_id must be 1 to 100 letters, digits or ._:@+- (the agent's id of the call)",
            422,
        )
    root = valid_root(root)
    run = _external(run_id)
    if call_id is not None:
        known = (
            ExternalCall.objects.filter(tool_use_id=call_id)
            .select_related("approval", "approval__decided_by")
            .first()
        )
        if known is not None:
            if known.run_id != run_id or known.tool != tool or known.input != tool_input:
                raise ExternalError(
                    f"call {call_id} was already proposed with another tool or input"
                )
            touch(run_id, agent)
            return _answer(known, known.decision)
    if run.status not in DRIVABLE_STATUSES:
        touch(run_id, agent)
        return _refusal(
            run_id,
            tool_input,
            f"the run is {run.status.replace('_', ' ')}: {run.status_reason}".rstrip(": "),
            run.status,
        )
    if (rewind := rewound(run_id)) is not None:
        touch(run_id, agent)
        return _refusal(run_id, tool_input, rewind_reason(rewind), status_of(run_id))
    block = {"id": call_id or f"ext_{uuid.uuid4().hex}", "name": tool, "input": tool_input}
    with _driving(run_id, actor, agent) as h:
        s, gate = h.s, h.gate
        try:  # past a budget (its wall time, too) the run pauses and the call does not run
            h.budgets.check()
        except SliceOver:
            run.refresh_from_db()
            return _refusal(
                run_id, tool_input, f"the run is paused: {run.status_reason}", run.status
            )
        decision = _decide(h, policy.agent_call(tool, tool_input, root=root), root)
        try:
            with transaction.atomic():
                call = ExternalCall.objects.create(
                    run_id=run_id,
                    tool_use_id=block["id"],
                    tool=tool,
                    input=tool_input,
                    root=root or "",
                    decision=decision.action,
                    reason=decision.reason,
                )
        except IntegrityError:
            raise ExternalError(f"call {call_id} was already proposed; ask again") from None
        gated = GatedCall(block, tool_input, decision=decision)
        try:
            cleared = gate.clear(gated)
        except SliceOver:
            cleared = None  # waiting for a person: the run is awaiting approval
        if gated.action == "deny" and decision.action != ExternalCallDecision.DENY:
            # Refused as a flood of approvals (agents/approvals.py): denied, and the run pauses.
            decision = gated.decision
            call.decision, call.reason = decision.action, decision.reason
            ExternalCall.objects.filter(pk=call.pk).update(
                decision=call.decision, reason=call.reason
            )
            with suppress(SliceOver):
                gate.pause_if_flooded()
        if gated.approval is not None:
            call.approval = gated.approval
            ExternalCall.objects.filter(pk=call.pk).update(approval=gated.approval)
        if decision.action == ExternalCallDecision.DENY:
            call.result_seq = s.known_seq
            ExternalCall.objects.filter(pk=call.pk).update(result_seq=call.result_seq)
        elif cleared is not None:
            _called(h, call, cleared.tool_input)
    return _answer(call, decision.action)


def withdraw(call_id: str, *, run_ids, actor: str, agent: str = "agent") -> dict[str, Any]:
    """The agent takes a call back (its hook gave up waiting, it was interrupted): a pending
    approval leaves the inbox, marked withdrawn (discarded, when a rewind is under way:
    `_withdrawn_as`), and the call can no longer run or be approved. A call that already has its
    result cannot be withdrawn."""
    call = _get_call(call_id, run_ids)
    touch(call.run_id, agent)
    taken_back = (ApprovalStatus.WITHDRAWN, ApprovalStatus.DISCARDED)
    if (call.approval is not None and call.approval.status in taken_back) or rewound(
        call.run_id
    ) is not None:
        # Withdrawn already (asked again: the same answer), discarded by a rewind or the run's
        # end, or made before a rewind its agent has not taken in yet (the branch it was on is
        # abandoned): nothing more is written, on no branch.
        return _answer(call, "denied")
    if call.result_seq is not None:
        raise ExternalError(f"tool call {call_id} already has its result: it cannot be withdrawn")
    why = f"withdrawn by its agent ({agent})"
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=call.run_id)
        if call.approval is not None and call.approval.status == ApprovalStatus.PENDING:
            ending, comment = _withdrawn_as(run, why)
            if (
                not Approval.objects.filter(pk=call.approval.pk)
                .pending()
                .update(status=ending, decided_at=timezone.now(), comment=comment)
            ):
                raise ExternalError(f"tool call {call_id} was decided meanwhile; ask again")
            reach.approval_settled([call.approval.pk])
            eventlog.append(
                call.run_id,
                EventKind.APPROVAL_DECIDED,
                approvals.decided_payload(call.approval, ending, comment),
                actor=f"external:{actor}:{agent}",
                session_id=call.approval.session_id,
            )
            approvals.resume_if_all_decided(run, f"external:{actor}:{agent}")
        # Its tool.result says it never ran; no result can follow.
        event = eventlog.append(
            call.run_id,
            EventKind.TOOL_RESULT,
            {
                "tool_use_id": call.tool_use_id,
                "name": call.tool,
                "output": f"The call was {why}: it did not run.",
                "is_error": True,
                "data": {"withdrawn": True},
            },
            session_id=call.approval.session_id if call.approval else None,
            actor=f"external:{actor}:{agent}",
        )
        ExternalCall.objects.filter(pk=call.pk).update(result_seq=event.seq)
    call = _get_call(call_id, run_ids)
    return _answer(call, "denied")


def _withdrawn_as(run: Run, why: str) -> tuple[str, str]:
    """How a pending approval ends when its agent takes the call back: withdrawn, unless the
    run is paused for a rewind, which is why the agent stopped waiting (its hook sees the pause
    and gives up): then it is discarded by that rewind, as it would have been had the rewind
    reached it first, whichever of the two the clock favoured."""
    if run.status == RunStatus.PAUSED and run.pause_cause == PauseCause.REWIND:
        return ApprovalStatus.DISCARDED, f"discarded: the run was {run.status_reason} ({why})"
    return ApprovalStatus.WITHDRAWN, why


def _called(h: Harness, call: ExternalCall, tool_input: dict[str, Any]) -> None:
    """The call is cleared to run: its tool.call event, before the agent runs it."""
    s = h.s
    block = {"id": call.tool_use_id, "name": call.tool, "input": call.input}
    s.append(call_event(s, block, tool_input, call.approval))
    call.called_seq = s.known_seq
    ExternalCall.objects.filter(pk=call.pk).update(called_seq=call.called_seq)


def _get_call(call_id: str, run_ids) -> ExternalCall:
    call = (
        ExternalCall.objects.filter(tool_use_id=str(call_id)[:100], run_id__in=run_ids)
        .select_related("approval", "approval__decided_by")
        .first()
    )
    if call is None:
        raise ExternalError(f"no tool call {call_id}", 404)
    return call


def decision(call_id: str, *, run_ids, actor: str, agent: str = "agent") -> dict[str, Any]:
    """Where a call stands: pending while a person has not decided; once they have, the call is
    cleared (its tool.call recorded, with a person's edit) or its denial recorded."""
    call = _get_call(call_id, run_ids)
    touch(call.run_id, agent)
    if call.decision != ExternalCallDecision.ASK:
        return _answer(call, call.decision)
    approval = call.approval
    # A run's end discards what it asked (agents/approval_endings.py): said as the run's end.
    waiting = (ApprovalStatus.PENDING, ApprovalStatus.DISCARDED)
    if approval is None or approval.status in waiting:
        status = status_of(call.run_id)
        if status in TERMINAL:  # nobody will decide it now: the call must not run
            answer = _answer(call, "denied")
            return {**answer, "reason": f"the run is {status}"}
        if approval is None or approval.status == ApprovalStatus.PENDING:
            return _answer(call, "pending")
    approved = approval.status == ApprovalStatus.APPROVED
    settled = call.called_seq is not None or call.result_seq is not None
    if settled:
        # Settled by the decision itself (agents/runtime/external_settle.py): the agent's
        # reading it takes the run up again, as its next call would, without a session.
        _take_up(call.run_id, actor, agent)
    elif status_of(call.run_id) in DRIVABLE_STATUSES:
        with _driving(call.run_id, actor, agent) as h:
            call = _get_call(call_id, run_ids)
            if call.called_seq is None and call.result_seq is None:
                block = {"id": call.tool_use_id, "name": call.tool, "input": call.input}
                gated = GatedCall(block, call.input, decision=None, approval=call.approval)
                cleared = h.gate.clear(gated)
                if cleared is not None:
                    _called(h, call, cleared.tool_input)
                else:
                    call.result_seq = h.s.known_seq
                    ExternalCall.objects.filter(pk=call.pk).update(result_seq=call.result_seq)
    return _answer(call, "approved" if approved else "denied")


def _take_up(run_id: int, actor: str, agent: str) -> None:
    """A queued run goes on running once its agent has read a decision: the status change its
    next call would make (under the lease, briefly; a call of the agent holding it makes it)."""
    if status_of(run_id) != RunStatus.QUEUED:
        return
    owner = f"external:{actor}:{agent}"
    with transaction.atomic():  # one commit: nobody sees the lease taken or the run half moved
        if not leases.claim(run_id, owner, external=True):
            return
        with suppress(IllegalTransition):
            lifecycle.transition(
                run_id,
                RunStatus.RUNNING,
                actor=owner,
                reason="its external agent called",
                expect={RunStatus.QUEUED},
                lease_owner=owner,
            )
        leases.release(run_id, owner)


def result(
    call_id: str, *, run_ids, actor: str, agent: str = "agent", output: Any, is_error: bool
) -> dict[str, Any]:
    """What the tool did, once per call, only for a call that was cleared to run."""
    if not isinstance(output, str):
        raise ExternalError("output must be text", 422)
    call = _get_call(call_id, run_ids)
    if call.decision == ExternalCallDecision.DENY:
        raise ExternalError(f"tool call {call_id} was denied ({call.reason}): it must not run")
    if call.result_seq is not None:
        raise ExternalError(f"tool call {call_id} already has its result")
    if call.decision == ExternalCallDecision.ASK and (
        call.approval is None or call.approval.status != ApprovalStatus.APPROVED
    ):
        raise ExternalError(f"tool call {call_id} was not approved: it must not run")
    limit = settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"]
    if len(output) > limit:
        output = output[:limit] + f"\n[… {len(output) - limit} characters cut]"
    with _driving(call.run_id, actor, agent) as h:
        call = _get_call(call_id, run_ids)
        if call.result_seq is not None:
            raise ExternalError(f"tool call {call_id} already has its result")
        run_input = (
            call.approval.edited_input if call.approval and call.approval.edited_input else None
        ) or call.input
        if call.called_seq is None:
            _called(h, call, run_input)
        block = {"id": call.tool_use_id, "name": call.tool, "input": run_input}
        h.s.record_result(block, sandbox.ToolResult(output=output, is_error=bool(is_error)))
        call.result_seq = h.s.known_seq
        ExternalCall.objects.filter(pk=call.pk).update(result_seq=call.result_seq)
    return {
        "seq": call.result_seq,
        "run_status": status_of(call.run_id),
        "rewound": rewound(call.run_id),
    }


# --- the workspace and finishing --------------------------------------------------------------
def upload_workspace(
    run_id: int, *, actor: str, agent: str = "agent", archive: IO[bytes]
) -> dict[str, Any]:
    """The agent's workspace, as a .tar.gz, becomes the run's workspace and a checkpoint. Its
    files may hold no more than the run's workspace cap (`--max-workspace-mb`), as a worker's
    workspace may not."""
    run = _external(run_id)
    cap = settings.SHIFTLOG["API_MAX_UPLOAD_MB"] * 1024 * 1024
    run_cap = isolation.workspace_cap(run)
    if run_cap:
        cap = min(cap, run_cap)
    root = Path(settings.SHIFTLOG["WORKSPACE_ROOT"])
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".upload-{run_id}-", dir=root))
    try:
        _unpack(archive, staging, cap)
        with _driving(run_id, actor, agent, knows_rewinds=True) as h:
            workspace = h.s.run.workspace_path
            old = workspace.with_name(f".{workspace.name}-old-{uuid.uuid4().hex[:8]}")
            if workspace.exists():
                workspace.rename(old)
            staging.rename(workspace)
            shutil.rmtree(old, ignore_errors=True)
            h.s.checkpoint(CheckpointKind.UPLOAD, "the workspace as its agent uploaded it")
            checkpoint = h.s.run.checkpoints.order_by("-number").first()
            return {
                "checkpoint": checkpoint.number,
                "files": checkpoint.files,
                "bytes_total": checkpoint.bytes_total,
            }
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpack(archive: IO[bytes], into: Path, cap: int) -> None:
    """Unpack a .tar.gz safely: only files, folders and links that stay inside; at most `cap`
    bytes. Anything else is refused with the member's name."""
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            total = 0
            members = []
            for member in tar:
                if not (member.isfile() or member.isdir() or member.issym()):
                    raise ExternalError(f"{member.name}: only files, folders and links", 422)
                total += member.size
                if total > cap:
                    raise ExternalError(f"the workspace is over {cap / (1024 * 1024):g} MB", 413)
                members.append(member)
            tar.extractall(into, members=members, filter="data")
    except ExternalError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise ExternalError(f"not a usable .tar.gz: {e}", 422) from None
