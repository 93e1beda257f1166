"""An external agent's call settled when a person decides it, not when the agent next asks.

A call that asked (agents/runtime/external.py `propose`) waits for a person while its agent
long-polls `GET /api/v1/tool-calls/ID?wait=S`. The decision's own transaction records what
follows from it, as the agent's read used to under the run's lease with its session rebuilt
(250-550 ms under load, on the agent's path): an approved call's `tool.call` (with a person's
edit), a denied call's `tool.result` saying it did not run. The long poll then only reads the
settled answer.

Exactly what the agent's read would have done, or nothing: a call is settled here only when the
run is in a state its agent may drive (queued again because nothing else waits), the approval's
session is still the run's open one and the call has neither event yet. Anything else is left
to the read (`external.decision`), which settles under the lease as before. The decision holds
the run's row (PostgreSQL) or the database (SQLite) for the whole transaction, so the read sees
the call settled or not at all: never settled twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from agents import eventlog, hooks
from agents.decision_words import denied_output
from agents.eventlog import NewEvent
from agents.models import (
    DRIVABLE_STATUSES,
    Approval,
    ApprovalStatus,
    EventKind,
    ExternalCall,
    Run,
    Session,
    SessionStatus,
)


def settle(run: Run, approval_ids: Iterable[int], actor: str) -> None:
    """The decided calls of the run's external agent: their events, now. Every call a person
    approved or denied that is not settled yet, not only `approval_ids`: one decided while
    another call of the run still waited is settled by the last decision, which queues the run."""
    if not run.is_external:
        return  # Shiftlog's own run: its worker's gate finds the decision (no query here)
    run_id = run.pk
    calls = list(
        ExternalCall.objects.filter(
            run_id=run_id,
            approval__status__in=(ApprovalStatus.APPROVED, ApprovalStatus.DENIED),
            called_seq__isnull=True,
            result_seq__isnull=True,
        )
        .order_by("pk")
        .select_related("approval", "approval__decided_by")
    )
    if not calls:
        return  # settled already
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status not in DRIVABLE_STATUSES:
        return  # still waiting for other decisions, paused: the agent's read settles it later
    open_session = (
        Session.objects.filter(run_id=run_id)
        .exclude(status=SessionStatus.ENDED)
        .order_by("-index")
        .values_list("pk", flat=True)
        .first()
    )
    for call in calls:
        approval: Approval = call.approval
        if approval.session_id != open_session:
            continue
        if approval.status == ApprovalStatus.APPROVED:
            payload = {
                "tool_use_id": call.tool_use_id,
                "name": call.tool,
                "input": approval.edited_input or call.input,
                "approval_id": approval.pk,
            }
            event = NewEvent(EventKind.TOOL_CALL, payload, session_id=open_session, actor="agent")
            field = "called_seq"
        else:
            payload = {
                "tool_use_id": call.tool_use_id,
                "name": call.tool,
                "output": denied_output(approval),
                "is_error": True,
                "data": {"approval_id": approval.pk, "decision": approval.status},
            }
            event = NewEvent(
                EventKind.TOOL_RESULT, payload, session_id=open_session, actor="harness"
            )
            field = "result_seq"
        seq = eventlog.append_many(run_id, [event]).events[-1].seq
        ExternalCall.objects.filter(pk=call.pk).update(**{field: seq})


def register() -> None:
    hooks.decided.register(settle)
