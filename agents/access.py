"""Who may see and do what: the one place every view and consumer asks.

A user sees a run they created, or any run if they are a superuser or have `agents.view_run`;
controls it (pause, resume, cancel, note, tool policy) if they created it or have
`agents.control_run`; decides approvals only with `agents.decide_approval`. A run someone may
not see does not exist for them (404), so ids reveal nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from agents import approvals, inputs
from agents.models import Approval, Checkpoint, Run, Schedule, Trigger


def sees_all(user) -> bool:
    return bool(user and user.is_active and user.has_perm("agents.view_run"))


def visible_runs(user) -> QuerySet[Run]:
    if not (user and user.is_authenticated and user.is_active):
        return Run.objects.none()
    if sees_all(user):
        return Run.objects.all()
    return Run.objects.filter(created_by=user)


def can_see(user, run: Run) -> bool:
    return bool(user and user.is_authenticated and user.is_active) and (
        run.created_by_id == user.pk or sees_all(user)
    )


def can_control(user, run: Run) -> bool:
    return can_see(user, run) and (
        run.created_by_id == user.pk or user.has_perm("agents.control_run")
    )


def can_decide(user) -> bool:
    return approvals.can_decide(user)


def get_run_for_user(user, run_id: int) -> Run:
    """The run, or 404 when it does not exist or the user may not see it."""
    try:
        return visible_runs(user).get(pk=run_id)
    except Run.DoesNotExist:
        raise Http404("no such run") from None


def get_controllable_run(user, run_id: int) -> Run:
    run = get_run_for_user(user, run_id)
    if not can_control(user, run):
        raise PermissionDenied("you may watch this run but not control it")
    return run


def visible_schedules(user) -> QuerySet[Schedule]:
    """Schedules of the runs the user may see (who may change one: `can_control` its run)."""
    return Schedule.objects.filter(template__in=visible_runs(user))


def visible_triggers(user) -> QuerySet[Trigger]:
    return Trigger.objects.filter(template__in=visible_runs(user))


def visible_approvals(user) -> QuerySet[Approval]:
    if sees_all(user):
        return Approval.objects.all()
    return Approval.objects.filter(run__in=visible_runs(user))


def get_approval_for_user(user, approval_id: int) -> Approval:
    """The approval, or 404 when it does not exist or its run is not the user's to see."""
    try:
        return visible_approvals(user).select_related("run__parent").get(pk=approval_id)
    except Approval.DoesNotExist:
        raise Http404("no such approval") from None


def pending_approvals(user) -> QuerySet[Approval]:
    """What the inbox shows: the waiting tool calls of the runs the user may see, oldest first."""
    return (
        visible_approvals(user)
        .pending()
        .select_related("run__parent", "decided_by")
        .order_by("created_at", "pk")
    )


def pending_count(user) -> int:
    return visible_approvals(user).pending().count()


@dataclass(frozen=True)
class Rights:
    """What a user may do on one run, decided once per page or socket."""

    control: bool = False
    decide: bool = False

    @classmethod
    def of(cls, user, run: Run) -> Rights:
        return cls(control=can_control(user, run), decide=can_decide(user))


def sides(run: Run, a: str | None, b: str | None) -> tuple[Checkpoint, Checkpoint | None]:
    """Checkpoints a and b (by their numbers in the run; b None for `live`, the default), in
    one query."""
    try:
        a_id = inputs.object_id(a or "", what="a")
        b_id = None if b in (None, "", "live") else inputs.object_id(b, what="b")
    except inputs.InputError:
        raise Http404("?a=CHECKPOINT&b=CHECKPOINT|live") from None
    wanted = [a_id] + ([b_id] if b_id else [])
    found = {c.number: c for c in Checkpoint.objects.filter(run=run, number__in=wanted)}
    if a_id not in found or (b_id is not None and b_id not in found):
        raise Http404("no such checkpoint in this run")
    for c in found.values():
        c.run = run  # the live side reads the workspace path from it: no extra query
    return found[a_id], found.get(b_id) if b_id is not None else None
