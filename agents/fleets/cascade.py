"""A fleet in the status machine, through the hooks the core calls (agents/hooks.py, registered
by `AgentsConfig.ready`): a child's end is told to its parent and wakes a parent waiting for its
children; a parent's end, and a person's pause, resume or cancel of it, reach its live children;
a parent's rewind undoes what its live branch no longer holds.
"""

from __future__ import annotations

from django.db import transaction

from agents import eventlog, hooks, jobs
from agents.fleets import tree as fleets
from agents.lifecycle import TERMINAL, IllegalTransition, transition
from agents.models import Checkpoint, EventKind, PauseCause, Run, RunStatus

S = RunStatus


def register() -> None:
    hooks.status_changed.register(status_changed)
    hooks.controlled.register(cascade)
    hooks.rewound.register(rewound)


def status_changed(run: Run, previous: str, actor: str) -> None:
    if run.status not in TERMINAL:
        return
    if run.parent_id is not None:
        _tell_parent(run)
    if run.status != S.CANCELLED:
        # A parent that ended leaves no child spending for it: its live children are
        # cancelled once its own end has committed (a cancel cascades from services).
        run_id, cause = run.pk, f"run {run.pk} ended ({run.status})"
        transaction.on_commit(lambda: cascade(run_id, "cancel", cause, "harness"))


def rewound(run_id: int, checkpoint: Checkpoint, actor: str) -> None:
    """A fleet's parent: merges the rewind took out are to be made again, and children spawned
    after the checkpoint are no longer waited for (cancelled once the rewind commits)."""
    unwanted = fleets.after_rewind(run_id)
    if unwanted:
        cause = (
            f"run {run_id} was rewound to checkpoint {checkpoint.number}, "
            "before this child was spawned"
        )
        transaction.on_commit(lambda: cascade(run_id, "cancel", cause, actor, only=unwanted))


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
