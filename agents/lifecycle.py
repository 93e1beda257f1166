"""Run status transitions: the one place that changes Run.status.

Every transition is checked against the table below inside a transaction that holds the run's
write lock, recorded as a run.status event naming who or what caused it, and an illegal one
raises instead of being silently ignored.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agents import approval_endings, eventlog, hooks, notifications, reach, trace_parts
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
        if notify and (target in TERMINAL or target == S.PAUSED):
            news = "paused" if target == S.PAUSED else "ended"
            reach.run_news(run, news, f"{target}: {reason}" if reason else str(target))
        if target in TERMINAL:
            # The rest of the run's trace (its own span, what no session sent), by a worker
            # after commit: nobody waits on the collector (agents/telemetry.py).
            trace_parts.export_later(run_id)
        # Features that follow a run's status (a fleet: agents/fleets/cascade.py).
        hooks.status_changed(run, current, actor)
    return run
