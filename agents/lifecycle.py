"""Run status transitions: the one place that changes Run.status.

Every transition is checked against the table below inside a transaction that holds the run's
write lock, recorded as a run.status event naming who or what caused it, and an illegal one
raises instead of being silently ignored.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import approval_endings, eventlog, jobs, notifications
from agents.fleets import tree as fleets
from agents.models import EventKind, PauseCause, Run, RunStatus

S = RunStatus
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.RUNNING, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset(
        {S.AWAITING_APPROVAL, S.PAUSED, S.VERIFYING, S.WAITING_FOR_CHILDREN, S.CANCELLED, S.FAILED}
    ),
    S.WAITING_FOR_CHILDREN: frozenset({S.QUEUED, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.AWAITING_APPROVAL: frozenset({S.QUEUED, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.PAUSED: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.VERIFYING: frozenset({S.SUCCEEDED, S.RUNNING, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
TERMINAL = frozenset(s for s, targets in TRANSITIONS.items() if not targets)


class IllegalTransition(Exception):
    def __init__(self, run_id: int, current: str, target: str, hint: str = ""):
        self.run_id, self.current, self.target = run_id, current, target
        message = f"run {run_id} is {current}; it cannot become {target}"
        super().__init__(f"{message}: {hint}" if hint else message)


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


def transition(
    run_id: int,
    target: str,
    *,
    actor: str,
    reason: str = "",
    expect: set[str] | frozenset[str] | None = None,
    session_id: int | None = None,
    lease_owner: str | None = None,
    notify: bool = True,
    cause: str = "",
) -> Run:
    """Move a run to `target`, or raise IllegalTransition.

    `expect` narrows the states the caller is prepared to move from (a worker finishing
    verification expects `verifying`; if a person cancelled meanwhile, that must win).
    `notify=False` sends no webhook (a rewind pauses the run on its way, nobody asked for a
    pause). `cause` says why a run is paused (PauseCause; the harness's, when not given).
    """
    with transaction.atomic():
        # select_for_update locks the row on PostgreSQL; on SQLite the IMMEDIATE transaction
        # already holds the database's write lock.
        run = Run.objects.select_for_update().get(pk=run_id)
        current = run.status
        if (expect is not None and current not in expect) or not can_transition(current, target):
            raise IllegalTransition(run_id, current, target)
        now = timezone.now()
        fields = {"status": target, "status_reason": reason, "updated_at": now}
        fields["pause_cause"] = (cause or PauseCause.HARNESS) if target == S.PAUSED else ""
        if target == S.RUNNING and run.started_at is None:
            fields["started_at"] = now
        if target in TERMINAL:
            fields["finished_at"] = now
        # The event first: its append checks the worker's lease, which a terminal state clears.
        eventlog.append(
            run_id,
            EventKind.RUN_STATUS,
            {
                "from": current,
                "to": target,
                "reason": reason,
                **({"cause": fields["pause_cause"]} if target == S.PAUSED else {}),
            },
            actor=actor,
            session_id=session_id,
            lease_owner=lease_owner,
        )
        if target in TERMINAL:
            # What the run asked a person about ends with it: off the inbox, the header's count
            # and the overview, and no longer decidable (agents/approval_endings.py).
            approval_endings.discard_pending(
                run_id, reason=approval_endings.ended_reason(target), actor=actor
            )
        Run.objects.filter(pk=run_id).update(**fields)
        for name, value in fields.items():
            setattr(run, name, value)
        if notify and target in notifications.NOTIFY_STATUSES:
            notifications.notify(run, f"run.{target}", previous=current)
        if target in TERMINAL and settings.SHIFTLOG["OTEL_ENDPOINT"]:
            # The run's whole trace, once, by a worker after commit: nobody waits on the
            # collector (agents/telemetry.py).
            jobs.later("export_trace", run_id=run_id)
        if target in TERMINAL and run.parent_id is not None:
            _tell_parent(run)
        if target in TERMINAL and target != S.CANCELLED:
            # A parent that ended leaves no child spending for it: its live children are
            # cancelled once its own end has committed (a cancel cascades from services).
            cause = f"run {run_id} ended ({target})"
            transaction.on_commit(lambda: cascade(run_id, "cancel", cause, "harness"))
    return run


# A child paused because its parent was: resuming the parent resumes it (and only it).
CASCADE_PAUSE = "paused with its fleet's parent"


def cascade(
    run_id: int, action: str, cause: str, actor: str, *, only: list[int] | None = None
) -> None:
    """Pause, resume or cancel a fleet's live children (and theirs) as their parent was: each
    gets a `fleet.cascade` event naming the cause. Each in its own transaction, after the
    parent's: a child's end locks the child before the parent, and so must everything. `only`
    names the children it applies to (all of them when None)."""
    children = Run.objects.filter(parent_id=run_id).order_by("pk")
    for child in children if only is None else children.filter(pk__in=only):
        moves = {
            "pause": child.is_live and child.status != S.PAUSED,
            "cancel": child.is_live,
            "resume": child.status == S.PAUSED and child.pause_cause == PauseCause.FLEET,
        }
        if not moves[action]:
            continue
        target = {"pause": S.PAUSED, "resume": S.QUEUED}.get(action, S.CANCELLED)
        reason = f"{CASCADE_PAUSE} (run {run_id})" if action == "pause" else cause
        try:
            with transaction.atomic():
                eventlog.append(
                    child.pk, EventKind.FLEET_CASCADE, {"action": action, "cause": cause},
                    actor=actor,
                )  # fmt: skip
                transition(child.pk, target, actor=actor, reason=reason, cause=PauseCause.FLEET)
                if target == S.QUEUED:
                    jobs.enqueue(child.pk)
        except IllegalTransition:
            continue  # it moved meanwhile (ended, say): nothing to cascade to it
        cascade(child.pk, action, cause, actor)


def _tell_parent(child: Run) -> None:
    """A fleet's child ended: its parent's log says so, and a parent waiting for its children
    is queued again once its wait is over (every child of its latest spawn ended, or, with
    wait "any", the first). Inside the child's transition: the child's row lock is taken before
    the parent's, here and wherever a parent is put to wait, so the two cannot miss each other."""
    parent = Run.objects.select_for_update().get(pk=child.parent_id)
    eventlog.append(
        parent.pk,
        EventKind.FLEET_CHILD_ENDED,
        {"run_id": child.pk, "status": child.status},
        actor="harness",
    )
    if parent.status != S.WAITING_FOR_CHILDREN:
        return
    wait = fleets.wait_state(parent)
    if not wait.over:
        return
    eventlog.append(
        parent.pk,
        EventKind.FLEET_WOKE,
        {"reason": wait.reason, "children": wait.children},
        actor="harness",
    )
    transition(parent.pk, S.QUEUED, actor="harness", reason=wait.reason)
    jobs.enqueue(parent.pk)
