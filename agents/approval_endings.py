"""How an approval ends without a person's decision: discarded because the call it asked about
was abandoned (a rewind took it out) or its run ended (cancelled, failed, succeeded). Low in the
house so that `lifecycle` discards what waits in the same transaction that ends a run, and
`approvals` (which moves runs through `lifecycle`) builds on it.

Every ending writes `approval.decided` with the same payload (`decided_payload`), so the inbox,
the header's count and the log always agree.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agents import eventlog, reach
from agents.models import LIVE_STATUSES, Approval, ApprovalStatus, EventKind


def decided_payload(approval: Approval, decision: str, comment: str = "", **extra) -> dict:
    """The payload of every `approval.decided` event, whoever or whatever decided."""
    return {
        "approval_id": approval.pk,
        "tool_use_id": approval.tool_use_id,
        "tool": approval.tool_name,
        "decision": decision,
        "comment": comment,
        **extra,
    }


def discard_pending(run_id: int, *, reason: str, actor: str) -> list[int]:
    """End a run's pending approvals without a decision: status `discarded` and an
    `approval.decided` event each. Call it inside the transaction that abandons them (a rewind,
    or the transition that ends the run)."""
    now = timezone.now()
    discarded = []
    for approval in Approval.objects.filter(run_id=run_id).pending().order_by("pk"):
        if (
            Approval.objects.filter(pk=approval.pk)
            .pending()
            .update(status=ApprovalStatus.DISCARDED, decided_at=now, comment=reason)
        ):
            eventlog.append(
                run_id,
                EventKind.APPROVAL_DECIDED,
                decided_payload(approval, ApprovalStatus.DISCARDED, reason),
                actor=actor,
                session_id=approval.session_id,
            )
            discarded.append(approval.pk)
    reach.approval_settled(discarded)
    return discarded


def ended_reason(status: str) -> str:
    return f"discarded: the run ended ({status})"


def discard_of_ended_runs() -> list[int]:
    """Pending approvals of runs that have ended (left by a version that did not discard them
    at the end, or by a crash between the two): discarded now, as the end would have. The
    reaper calls it."""
    discarded: list[int] = []
    stale = (
        Approval.objects.pending()
        .exclude(run__status__in=LIVE_STATUSES)
        .values_list("run_id", "run__status")
        .distinct()
    )
    for run_id, status in list(stale):
        with transaction.atomic():
            discarded += discard_pending(run_id, reason=ended_reason(status), actor="harness")
    return discarded
