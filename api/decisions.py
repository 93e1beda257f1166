"""Approvals: the inbox and a person's decision, as on the web and with manage.py approve."""

from __future__ import annotations

from typing import Literal

from ninja import Query, Router, Schema
from pydantic import Field

from agents import access, approvals
from agents.models import Approval, ApprovalStatus
from api import out
from api.auth import need
from api.errors import Problem
from api.schemas import ApprovalList, ApprovalOut, Decision, PathId

router = Router(tags=["approvals"])


class ApprovalFilter(Schema):
    status: Literal[tuple(ApprovalStatus.values)] | None = None  # type: ignore[valid-type]
    run: int | None = Field(None, ge=1, le=2**53)
    limit: int = Field(100, ge=1, le=500)


@router.get("/approvals", response=ApprovalList, summary="Approvals (oldest first)")
def list_approvals(request, filters: Query[ApprovalFilter]):
    need(request, "read")
    rows = access.visible_approvals(request.user).select_related("decided_by")
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.run:
        rows = rows.filter(run_id=filters.run)
    return {"items": out.approvals(list(rows.order_by("created_at", "pk")[: filters.limit]))}


def _approval(request, approval_id: int) -> Approval:
    found = (
        access.visible_approvals(request.user)
        .select_related("decided_by")
        .filter(pk=approval_id)
        .first()
    )
    if found is None:
        raise Problem(404, f"no approval with id {approval_id}")
    return found


@router.get("/approvals/{approval_id}", response=ApprovalOut, summary="One approval")
def get_approval(request, approval_id: PathId):
    need(request, "read")
    return out.approvals([_approval(request, approval_id)])[0]


@router.post(
    "/approvals/{approval_id}/decision",
    response=ApprovalOut,
    summary="Approve, deny (with a reason) or edit then approve a waiting tool call",
)
def decide(request, approval_id: PathId, body: Decision):
    need(request, "decide")
    approval = _approval(request, approval_id)
    try:
        return _decide(request, approval, body)
    except approvals.NotAllowed:
        raise
    except approvals.RunEnded as e:
        raise Problem(409, str(e)) from None
    except approvals.ApprovalError as e:
        # Decided already (or expired, discarded): a conflict; otherwise the request is wrong.
        approval.refresh_from_db()
        raise Problem(422 if approval.status == ApprovalStatus.PENDING else 409, str(e)) from None


def _decide(request, approval: Approval, body: Decision) -> dict:
    decided = approvals.decide_as(approval.pk, user=request.user, **body.dict())
    return out.approvals([decided])[0]
