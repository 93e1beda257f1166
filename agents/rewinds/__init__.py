"""Rewinding a run to one of its checkpoints: what it would discard, and the rewind itself.

One path: `attempt` is the rewind's step (pause the run between steps, then, once no worker
holds it, restore the workspace, end the open sessions, discard pending approvals, record
`run.rewound` and queue the run again). A requested rewind (the web, the API: `request_rewind`)
is a `rewind_run` task that makes one attempt and, while the run's worker finishes a step, is
scheduled again (`carry_out_rewind`); the CLI's `rewind` makes the same attempts in-process. A
feature that keeps state of its own beside the run (a fleet's children) hears of each rewind
through `hooks.rewound`.

Rewinding never truncates the log: a run.rewound event records what is discarded, and the events
after the checkpoint stay where they are, as an abandoned branch (see
`EventQuerySet.abandoned_ranges`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import approvals, eventlog, hooks, jobs, lifecycle, policy, trace_parts, workspaces
from agents.checkpoints import CheckpointError, clean_note, get
from agents.jobs import enqueue
from agents.models import (
    LIVE_STATUSES,
    Artifact,
    Checkpoint,
    EndReason,
    Event,
    EventKind,
    PauseCause,
    ResumeState,
    Run,
    RunStatus,
    Session,
    SessionStatus,
)


# --- what a rewind would discard -------------------------------------------------------------
@dataclass
class Discarded:
    checkpoint_id: int
    number: int
    from_seq: int
    to_seq: int
    events: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    sessions: list[int] = field(default_factory=list)
    tokens: int = 0
    cost_usd: str = "0"
    artifacts: list[str] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    irreversible: list[dict[str, Any]] = field(default_factory=list)
    children: list[int] = field(default_factory=list)  # a parent's live children, cancelled

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_rewind(run: Run, checkpoint: Checkpoint) -> Discarded:
    after = Event.objects.on_live_branch(run.pk).filter(seq__gt=checkpoint.seq)
    by_kind: dict[str, int] = {}
    irreversible, spawns = [], []
    for kind, payload in after.values_list("kind", "payload").iterator(chunk_size=1000):
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if kind == EventKind.FLEET_SPAWNED:
            spawns.append(payload.get("tool_use_id"))
        if kind == EventKind.TOOL_CALL and payload.get("name") == "bash":
            command = str((payload.get("input") or {}).get("command", ""))
            # A rewind puts files back; it cannot unsend a request or undo a change elsewhere.
            risks = [
                r
                for r in policy.classify_bash(command, workspace=run.workspace_path)
                if r != "deletes widely"
            ]
            if risks:
                irreversible.append({"command": command, "risks": risks})
    usage = checkpoint.usage or {}
    changes = workspaces.diff_live(run, checkpoint.tree, text_diffs=False)
    return Discarded(
        checkpoint_id=checkpoint.pk,
        number=checkpoint.number,
        from_seq=run.last_seq,
        to_seq=checkpoint.seq,
        events=sum(by_kind.values()),
        by_kind=by_kind,
        sessions=list(
            Session.objects.filter(run=run, first_seq__gt=checkpoint.seq).values_list(
                "index", flat=True
            )
        ),
        tokens=max(run.total_tokens - int(usage.get("total_tokens", 0)), 0),
        cost_usd=str(max(run.cost_usd - _decimal(usage.get("cost_usd", "0")), 0)),
        artifacts=list(
            Artifact.objects.filter(run=run, seq__gt=checkpoint.seq).values_list("name", flat=True)
        ),
        files=[{"path": c.path, "status": _reverse(c.status)} for c in changes],
        irreversible=irreversible,
        children=list(
            Run.objects.filter(spawned_as__parent=run, spawned_as__tool_use_id__in=spawns)
            .filter(status__in=LIVE_STATUSES)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if spawns
        else [],
    )


def _reverse(status: str) -> str:
    # diff(checkpoint → live) says what happened since; a rewind undoes it.
    return {"added": "removed by rewind", "removed": "restored by rewind"}.get(
        status, f"{status}, restored"
    )


def _decimal(value: Any) -> Decimal:
    return Decimal(str(value))


# --- rewind ---------------------------------------------------------------------------------
# How long a rewind waits for the run's worker to let go before it gives up.
REWIND_WAIT_SECONDS = 60.0
# A rewind tries again this often while the run's worker finishes its step: the task is
# scheduled again (a worker never sleeps on it), the CLI waits in-process.
REWIND_RETRY_SECONDS = 0.25


def rewind(
    run_id: int,
    checkpoint_id: int,
    *,
    actor: str,
    note: str = "",
    dry_run: bool = False,
    wait_seconds: float = REWIND_WAIT_SECONDS,
) -> Discarded:
    """Rewind now, in this process (the CLI's way): the same attempts a requested rewind's task
    makes, waited for here (at most `wait_seconds`) instead of scheduled. The web asks a worker
    to do it (`request_rewind`) and returns at once."""
    note = clean_note(note)
    run = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    if dry_run:
        return plan_rewind(run, checkpoint)
    _check_rewindable(run)
    if run.status == RunStatus.VERIFYING:
        raise CheckpointError(f"run {run_id} is running its checks; try again in a moment")
    deadline = time.monotonic() + wait_seconds
    while (discarded := attempt(run_id, checkpoint, actor=actor, note=note)) is None:
        if time.monotonic() >= deadline:
            raise CheckpointError(
                f"run {run_id} is paused but its worker is still finishing a step; try again shortly"
            )
        time.sleep(REWIND_RETRY_SECONDS)
    return discarded


def attempt(run_id: int, checkpoint: Checkpoint, *, actor: str, note: str) -> Discarded | None:
    """One attempt at the rewind, the step both paths take: the run is paused between steps,
    and once no worker holds it (its checks are not running either), restored. None while the
    run's worker is still on a step: try again shortly."""
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.VERIFYING:
        return None  # the checks finish first; pausing then stops the run between steps
    _pause_to_rewind(run, checkpoint, actor)
    if _worker_holds(run_id):
        return None
    return _restore(run_id, checkpoint, actor=actor, note=note)


def request_rewind(run_id: int, checkpoint_id: int, *, actor: str, note: str = "") -> None:
    """Ask a worker to rewind the run: a `run.rewind_requested` event, and the work queued.
    The worker pauses the run (its own worker finishes the step it is on), restores the
    workspace and queues the run again; the page shows each step as it happens."""
    note = clean_note(note)
    run = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    _check_rewindable(run)
    with transaction.atomic():
        request = eventlog.append(
            run_id,
            EventKind.RUN_REWIND_REQUESTED,
            {
                "checkpoint_id": checkpoint.pk,
                "number": checkpoint.number,
                "to_seq": checkpoint.seq,
                "note": note,
            },
            actor=actor,
        )
        _queue(run_id, checkpoint.pk, actor, note, request.seq)


def reissue_rewind(request: Event) -> None:
    """Queue a rewind request's work again (the reaper: its task was lost)."""
    p = request.payload
    _queue(request.run_id, p["checkpoint_id"], request.actor, p.get("note", ""), request.seq)


def _queue(run_id: int, checkpoint_id: int, actor: str, note: str, request_seq: int) -> None:
    jobs.later(
        "rewind_run",
        run_id=run_id,
        checkpoint_id=checkpoint_id,
        actor=actor,
        note=note,
        until=time.time() + REWIND_WAIT_SECONDS,
        request_seq=request_seq,
    )


def rewind_answered(run_id: int, request_seq: int) -> bool:
    """Whether the rewind asked at `request_seq` was carried out or given up (an event says)."""
    after = Event.objects.filter(run_id=run_id, seq__gt=request_seq)
    return (
        after.filter(kind=EventKind.RUN_REWOUND).exists()
        or after.filter(kind=EventKind.ERROR, payload__source="rewind").exists()
    )


def carry_out_rewind(
    run_id: int,
    checkpoint_id: int,
    *,
    actor: str,
    note: str,
    until: float,
    request_seq: int | None = None,
) -> bool:
    """One attempt at a requested rewind, by a worker: True when it is over (done, or given up
    with an error event saying why), False to try again shortly (the run's worker is still on a
    step, or its checks are running). A request already answered (its task ran twice: the
    reaper asked again) is over at once."""
    if request_seq is not None and rewind_answered(run_id, request_seq):
        return True
    run = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    if not run.is_live or time.time() > until:
        why = (
            f"the run is {run.status}"
            if not run.is_live
            else f"its worker did not let go of it within {REWIND_WAIT_SECONDS:.0f} s"
        )
        eventlog.append(
            run_id,
            EventKind.ERROR,
            {
                "source": "rewind",
                "message": f"the rewind to checkpoint {checkpoint.number} was not done: {why}",
            },
            actor=actor,
        )
        return True
    return attempt(run_id, checkpoint, actor=actor, note=note) is not None


def run_task(**request: Any) -> bool:
    """The `rewind_run` task (its keywords are `carry_out_rewind`'s): one attempt per execution;
    while the run's worker is on a step, the task is scheduled again rather than waited for, so
    the thread goes back to running slices meanwhile."""
    done = carry_out_rewind(**request)
    if not done:
        jobs.schedule("rewind_run", delay=REWIND_RETRY_SECONDS, **request)
    return done


def _check_rewindable(run: Run) -> None:
    if not run.is_live:
        raise CheckpointError(f"run {run.pk} is {run.status}; fork it from the checkpoint instead")


def _pause_to_rewind(run: Run, checkpoint: Checkpoint, actor: str) -> None:
    """Stop the run between steps before its workspace is restored. No webhook: nobody asked
    for a pause, only for a rewind."""
    if run.status != RunStatus.PAUSED:
        lifecycle.transition(
            run.pk,
            RunStatus.PAUSED,
            actor=actor,
            reason=f"paused by {actor} to rewind to checkpoint {checkpoint.number}",
            notify=False,
            cause=PauseCause.REWIND,
        )


def _restore(run_id: int, checkpoint: Checkpoint, *, actor: str, note: str) -> Discarded:
    """The rewind itself, once no worker holds the run: workspace, sessions, approvals, the
    run.rewound event, the new branch's state; the run is queued again."""
    run = Run.objects.get(pk=run_id)
    discarded = plan_rewind(run, checkpoint)
    if not workspaces.cached():  # else the worker that claims the run next restores it
        workspaces.restore(run, checkpoint.tree)
    with transaction.atomic():
        now = timezone.now()
        for session in Session.objects.filter(run=run).exclude(status=SessionStatus.ENDED):
            Session.objects.filter(pk=session.pk).update(
                status=SessionStatus.ENDED, end_reason=EndReason.REWOUND, ended_at=now
            )
            eventlog.append(
                run_id,
                EventKind.SESSION_ENDED,
                {"index": session.index, "reason": EndReason.REWOUND},
                session_id=session.pk,
                actor=actor,
            )
            trace_parts.export_later(run_id)  # the rewound session's spans (agents/telemetry.py)
        approvals.discard_pending(
            run_id, reason=f"discarded by the rewind to checkpoint {checkpoint.number}", actor=actor
        )
        discarded.from_seq = Run.objects.get(pk=run_id).last_seq
        event = eventlog.append(
            run_id, EventKind.RUN_REWOUND, {**discarded.as_dict(), "note": note}, actor=actor
        )
        Run.objects.filter(pk=run_id).update(
            head_checkpoint=checkpoint,
            workspace_tree=checkpoint.tree,
            branch_seq=event.seq,
            # The lease of a worker that let go of the run by running out of time (stopped, say,
            # in a model call) goes with the rewind: woken, that worker would go on with the
            # abandoned branch's conversation and workspace. Its next write is refused.
            lease_owner="",
            lease_expires_at=None,
            resume_state=ResumeState.from_checkpoint(checkpoint, note).as_json(),
        )
        # Features that keep state beside the run (a fleet's children: agents/fleets/cascade.py).
        hooks.rewound(run_id, checkpoint, actor)
        lifecycle.transition(
            run_id,
            RunStatus.QUEUED,
            actor=actor,
            reason=f"rewound to checkpoint {checkpoint.number} by {actor}",
        )
        enqueue(run_id)
    return discarded


def _worker_holds(run_id: int) -> bool:
    """Whether a worker still holds the run (its lease has not expired)."""
    owner, expires = (
        Run.objects.filter(pk=run_id).values_list("lease_owner", "lease_expires_at").get()
    )
    return bool(owner) and (expires is None or expires >= timezone.now())
