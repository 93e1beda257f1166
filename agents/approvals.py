"""Deciding tool calls that wait for a person.

A decision is one conditional UPDATE on a pending approval, so when two people decide at once
exactly one wins and the other is told who was first. When the last pending approval of a run is
decided, the run goes back to the queue; no worker waited meanwhile.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import eventlog, lifecycle, policy, sandbox
from agents.models import Approval, ApprovalStatus, EventKind, Run, RunStatus
from agents.tasks import enqueue


class ApprovalError(ValueError):
    pass


class NotAllowed(ApprovalError):
    pass


def can_decide(user) -> bool:
    return user is not None and user.is_active and user.has_perm("agents.decide_approval")


def input_diff(tool: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    """A readable diff of an edit: the command for bash, the JSON for everything else."""
    if tool == "bash":
        a, b = str(before.get("command", "")), str(after.get("command", ""))
    else:
        a = json.dumps(before, indent=2, sort_keys=True)
        b = json.dumps(after, indent=2, sort_keys=True)
    return "".join(
        difflib.unified_diff(
            a.splitlines(keepends=True) or [""],
            b.splitlines(keepends=True) or [""],
            "requested",
            "approved",
            lineterm="\n",
        )
    )


def _get(approval_id: int) -> Approval:
    try:
        return Approval.objects.select_related("run", "decided_by").get(pk=approval_id)
    except Approval.DoesNotExist:
        raise ApprovalError(f"no approval with id {approval_id}") from None


def _refused(approval: Approval) -> ApprovalError:
    approval.refresh_from_db()
    who = approval.decided_by.get_username() if approval.decided_by else "nobody"
    when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else ""
    if approval.status == ApprovalStatus.EXPIRED:
        return ApprovalError(
            f"approval {approval.pk} expired at {when}; it can no longer be decided"
        )
    return ApprovalError(f"approval {approval.pk} was already {approval.status} by {who} at {when}")


def decide(
    approval_id: int,
    *,
    user,
    approve: bool,
    edited_input: dict[str, Any] | None = None,
    comment: str = "",
    allow_similar: bool = False,
) -> Approval:
    if not can_decide(user):
        raise NotAllowed(
            f"{user.get_username() if user else 'anonymous'} may not decide approvals (needs agents.decide_approval)"
        )
    approval = _get(approval_id)
    comment = (comment or "").strip()
    if not approve and not comment:
        raise ApprovalError("a denial needs a reason: the agent reads it")
    if edited_input is not None:
        if not approve:
            raise ApprovalError("an edit goes with an approval, not a denial")
        try:
            edited_input = sandbox.validate_input(approval.tool_name, edited_input)
        except sandbox.ToolInputError as e:
            raise ApprovalError(
                f"the edited input is not valid for {approval.tool_name}: {e}"
            ) from None
        if edited_input == approval.tool_input:
            edited_input = None
    if allow_similar and not approve:
        raise ApprovalError("allow-similar goes with an approval")
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    now = timezone.now()
    actor = f"user:{user.get_username()}"
    with transaction.atomic():
        # The run row first, as the worker does before it starts waiting: the two serialise, so
        # a decision can never slip between the worker's last look and its going to sleep.
        Run.objects.select_for_update().filter(pk=approval.run_id).first()
        won = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            status=status,
            decided_by=user,
            decided_at=now,
            comment=comment,
            edited_input=edited_input,
        )
        if not won:
            raise _refused(approval)
        payload: dict[str, Any] = {
            "approval_id": approval.pk,
            "tool_use_id": approval.tool_use_id,
            "tool": approval.tool_name,
            "decision": status,
            "comment": comment,
        }
        if edited_input is not None:
            payload["edited_input"] = edited_input
            payload["diff"] = input_diff(approval.tool_name, approval.tool_input, edited_input)
        eventlog.append(
            approval.run_id,
            EventKind.APPROVAL_DECIDED,
            payload,
            actor=actor,
            session_id=approval.session_id,
        )
        if allow_similar:
            rule = policy.similar_rule(approval.tool_name, edited_input or approval.tool_input)
            add_rule(
                approval.run_id,
                rule,
                actor=actor,
                because=f"allow similar to approval {approval.pk}",
            )
            _approve_matching(approval.run_id, user, actor)
        _resume_if_all_decided(approval.run_id, actor)
    approval.refresh_from_db()
    return approval


def add_rule(
    run_id: int, rule: dict[str, Any], *, actor: str, because: str = ""
) -> list[dict[str, Any]]:
    run = Run.objects.select_for_update().get(pk=run_id)
    rules = policy.validate([rule, *run.tool_policy])
    set_policy(run_id, rules, actor=actor, because=because or "rule added")
    return rules


def set_policy(run_id: int, rules: Any, *, actor: str, because: str = "") -> list[dict[str, Any]]:
    try:
        rules = policy.validate(rules)
    except policy.PolicyError as e:
        raise ApprovalError(str(e)) from None
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(tool_policy=rules)
        eventlog.append(
            run_id, EventKind.RUN_UPDATED, {"tool_policy": rules, "because": because}, actor=actor
        )
    return rules


def _approve_matching(run_id: int, user, actor: str) -> None:
    """Pending calls that the run's policy now allows are approved along with the rule."""
    run = Run.objects.get(pk=run_id)
    for other in Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING):
        decision = policy.decide(run.tool_policy, other.tool_name, other.tool_input)
        if decision.action != "allow" or decision.rule is None:
            continue
        if Approval.objects.filter(pk=other.pk, status=ApprovalStatus.PENDING).update(
            status=ApprovalStatus.APPROVED,
            decided_by=user,
            decided_at=timezone.now(),
            comment=f"allowed by {decision.reason}",
        ):
            eventlog.append(
                run_id,
                EventKind.APPROVAL_DECIDED,
                {
                    "approval_id": other.pk,
                    "tool_use_id": other.tool_use_id,
                    "tool": other.tool_name,
                    "decision": ApprovalStatus.APPROVED,
                    "comment": f"allowed by {decision.reason}",
                },
                actor=actor,
                session_id=other.session_id,
            )


def _resume_if_all_decided(run_id: int, actor: str) -> None:
    if Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).exists():
        return
    run = Run.objects.get(pk=run_id)
    if run.status != RunStatus.AWAITING_APPROVAL:
        return  # paused or cancelled meanwhile: a person resumes it explicitly
    lifecycle.transition(
        run_id, RunStatus.QUEUED, actor=actor, reason="every waiting tool call is decided"
    )
    enqueue(run_id)


def expire_due(now=None) -> list[int]:
    """Pending approvals past their expiry count as denied ("expired"); their runs pause."""
    now = now or timezone.now()
    expired = []
    for approval in Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lt=now):
        with transaction.atomic():
            if not Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
                status=ApprovalStatus.EXPIRED, decided_at=now, comment="expired"
            ):
                continue
            eventlog.append(
                approval.run_id,
                EventKind.APPROVAL_DECIDED,
                {
                    "approval_id": approval.pk,
                    "tool_use_id": approval.tool_use_id,
                    "tool": approval.tool_name,
                    "decision": ApprovalStatus.EXPIRED,
                    "comment": "expired",
                },
                actor="harness",
                session_id=approval.session_id,
            )
            run = Run.objects.get(pk=approval.run_id)
            if (
                lifecycle.can_transition(run.status, RunStatus.PAUSED)
                and run.status == RunStatus.AWAITING_APPROVAL
            ):
                lifecycle.transition(
                    run.pk,
                    RunStatus.PAUSED,
                    actor="harness",
                    reason=f"approval {approval.pk} ({approval.tool_name}) expired; resume to go on without it",
                )
            expired.append(approval.pk)
    return expired
