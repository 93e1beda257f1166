"""Models as the API shows them (the shapes of api/schemas.py)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from agents.events import ApprovalRequested, read_payload
from agents.events import summary as event_summary
from agents.fleets import tree as fleets
from agents.models import Approval, Artifact, Checkpoint, Event, EventKind, Run


def runs(rows: list[Run]) -> list[dict[str, Any]]:
    """Runs with their session and pending-approval counts, in two queries for the page."""
    ids = [r.pk for r in rows]
    counts = {
        row["pk"]: row
        for row in Run.objects.filter(pk__in=ids)
        .annotate(
            n_sessions=Count("sessions", distinct=True),
            n_pending=Count("approvals", filter=Q(approvals__status="pending"), distinct=True),
        )
        .values("pk", "n_sessions", "n_pending")
    }
    children: dict[int, list[int]] = {}
    for parent, child in (
        Run.objects.filter(parent_id__in=ids).order_by("pk").values_list("parent_id", "pk")
    ):
        children.setdefault(parent, []).append(child)
    return [run(r, counts.get(r.pk, {}), children.get(r.pk, [])) for r in rows]


def run(
    r: Run, counts: dict[str, int] | None = None, children: list[int] | None = None
) -> dict[str, Any]:
    if children is None:
        children = list(r.children.order_by("pk").values_list("pk", flat=True))
    # Only a fleet's parent needs the tree summed (a query a level).
    spent = fleets.rollup(r) if children else fleets.Rollup(r.total_tokens, r.cost_usd)
    if counts is None:
        counts = {
            "n_sessions": r.sessions.count(),
            "n_pending": r.approvals.filter(status="pending").count(),
        }
    return {
        "id": r.pk,
        "goal": r.goal,
        "status": r.status,
        "status_reason": r.status_reason,
        "pause_cause": r.pause_cause,
        "provider": r.provider,
        "external": r.is_external,
        "stalled": r.stalled,
        "last_contact_at": r.last_contact_at,
        "heartbeat_seconds": r.heartbeat_window if r.is_external else None,
        "model": r.model,
        "checks": r.checks,
        "created_at": r.created_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "turns": r.turns,
        "tokens": {
            "input": r.input_tokens,
            "output": r.output_tokens,
            "cache_read": r.cache_read_tokens,
            "cache_write": r.cache_write_tokens,
            "total": r.total_tokens,
        },
        "cost_usd": str(r.cost_usd),
        "budgets": {
            "max_sessions": r.max_sessions,
            "max_tokens": r.max_tokens,
            "max_cost_usd": str(r.max_cost_usd) if r.max_cost_usd is not None else None,
            "max_wall_seconds": r.max_wall_seconds,
        },
        "sessions": counts.get("n_sessions", 0),
        "last_seq": r.last_seq,
        "pending_approvals": counts.get("n_pending", 0),
        "forked_from": {"run": r.forked_from.run_id, "checkpoint": r.forked_from.number}
        if r.forked_from_id
        else None,
        "url": r.get_absolute_url(),
        "project": r.project,
        "slack_channel": r.slack_channel,
        "slack_news": r.slack_news,
        "schedule": r.schedule_id,
        "trigger": r.trigger_id,
        "wake_at": r.wake_at,
        "parent": r.parent_id,
        "depth": r.depth,
        "children": children,
        "rollup": spent.as_json(),
    }


def event(e: Event, session_index: int | None) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "kind": e.kind,
        "actor": e.actor,
        "session": session_index,
        "created_at": e.created_at,
        "payload": e.payload,
        "summary": event_summary(e.kind, e.payload),
    }


def events(rows: list[Event]) -> list[dict[str, Any]]:
    return [event(e, e.session.index if e.session_id else None) for e in rows]


def approvals(rows: list[Approval]) -> list[dict[str, Any]]:
    """Approvals with why each was asked (from its approval.requested event), in one query."""
    why: dict[int, str] = {}
    if rows:
        for payload in Event.objects.filter(
            run_id__in={a.run_id for a in rows},
            kind=EventKind.APPROVAL_REQUESTED,
            payload__approval_id__in=[a.pk for a in rows],
        ).values_list("payload", flat=True):
            asked: ApprovalRequested = read_payload(EventKind.APPROVAL_REQUESTED, payload)
            why[asked.approval_id] = asked.reason
    return [approval(a, why.get(a.pk, "")) for a in rows]


def approval(a: Approval, reason: str = "") -> dict[str, Any]:
    return {
        "id": a.pk,
        "run": a.run_id,
        "status": a.status,
        "tool": a.tool_name,
        "input": a.tool_input,
        "reason": reason,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "decided_by": a.decided_by.get_username() if a.decided_by_id else None,
        "decided_at": a.decided_at,
        "comment": a.comment,
        "edited_input": a.edited_input,
    }


def checkpoint(c: Checkpoint) -> dict[str, Any]:
    return {
        "number": c.number,
        "kind": c.kind,
        "label": c.label,
        "seq": c.seq,
        "session": c.session.index if c.session_id else None,
        "files": c.files,
        "bytes_total": c.bytes_total,
        "created_at": c.created_at,
    }


def artifact(a: Artifact) -> dict[str, Any]:
    return {
        "id": a.pk,
        "run": a.run_id,
        "name": a.name,
        "kind": a.kind,
        "size": a.size,
        "mime_type": a.mime_type,
        "session": a.session.index if a.session_id else None,
        "created_at": a.created_at,
    }
