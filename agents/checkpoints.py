"""Checkpoints of a run (workspace and agent state together), rewind, fork, and diffs.

The workspace goes into the content-addressed snapshot store (agents/snapshots/): a checkpoint
is a root tree digest, so unchanged files cost nothing. The agent's state at that point is the
latest handoff and the provider's place, kept on the Checkpoint row.

Rewinding never truncates the log: a run.rewound event records what is discarded, and the events
after the checkpoint stay where they are, as an abandoned branch (see
`EventQuerySet.abandoned_ranges`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from agents import (
    approvals,
    done_conditions,
    eventlog,
    hooks,
    inputs,
    jobs,
    lifecycle,
    policy,
    services,
    workspaces,
)
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
from agents.runspec import RunSpec
from agents.snapshots import Change, SnapshotResult

FILE_TOOLS = frozenset({"write_file", "edit_file", "bash"})


class CheckpointError(ValueError):
    pass


def protected_originals() -> Iterator[tuple[int, str, str]]:
    """(run id, path, blob) for every run's protected files.

    `verification.fingerprint` stores their originals with `BlobStore.put` when the run is created,
    and the checks are run against them (`restore_originals`), so the store must keep them like
    a checkpoint's files, also for a run whose first checkpoint is not taken yet. A fork copies
    its origin's fingerprints, so every run counts, over or not.
    """
    rows = Run.objects.values_list("pk", "protected", "check_settings")
    for run_id, prints, settings in rows.iterator(chunk_size=500):
        for path, fingerprint in (prints or {}).items():
            yield run_id, path, fingerprint["hash"]
        for path, fingerprint in (settings or {}).items():  # agents/check_settings.py
            if fingerprint.get("blob"):
                yield run_id, path, fingerprint["blob"]


def provider_meta(run: Run) -> dict[str, Any]:
    """The provider's place on the live branch (a scripted run's position in its script): the
    latest model turn's, or where a rewind or fork put it."""
    turn = (
        Event.objects.on_live_branch(run.pk)
        .filter(kind=EventKind.MODEL_TURN)
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()
    )
    if turn is not None:
        return turn.get("meta", {})
    resume = run.resume
    return resume.provider_meta if resume else {}


def _latest_handoff(run: Run) -> dict[str, Any] | None:
    session = (
        Session.objects.filter(run=run, handoff__isnull=False)
        .order_by("-index")
        .only("handoff")
        .first()
    )
    if session is not None:
        return session.handoff
    resume = run.resume
    return resume.handoff if resume else None


def create(
    run_id: int,
    *,
    kind: str,
    label: str = "",
    session_id: int | None = None,
    actor: str = "harness",
    lease_owner: str | None = None,
) -> Checkpoint:
    held = lease_owner is not None or not workspaces.cached()
    for _ in range(10):
        run = Run.objects.get(pk=run_id)
        described = None if held or not run.workspace_tree else run.workspace_tree
        if described is None:
            result = workspaces.snapshot(run)
        else:  # a person's checkpoint, where the workspace is some worker's: its committed state
            result = workspaces.stored_state(described)
        checkpoint = _record(run_id, kind, label, session_id, actor, lease_owner, result, described)
        if checkpoint is not None:
            break
    else:
        raise CheckpointError(f"run {run_id} changed too fast to checkpoint; try again")
    if held and workspaces.cached():
        workspaces.hold(run, result.tree, result.bytes_total)
    return checkpoint


def _record(
    run_id: int,
    kind: str,
    label: str,
    session_id: int | None,
    actor: str,
    lease_owner: str | None,
    result: SnapshotResult,
    described: str | None,
) -> Checkpoint | None:
    """The checkpoint of `result`, and its event; None when `described` (the committed tree a
    person's checkpoint describes) is no longer the run's: a worker committed a call meanwhile,
    and recording the older tree would set the run's workspace back (found by bench/chaos.py:
    the next worker restored it, and a committed write was gone)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if described is not None and run.workspace_tree != described:
            return None
        sessions = Session.objects.filter(run=run).count()
        last = Checkpoint.objects.filter(run=run).aggregate(n=Max("number"))["n"] or 0
        checkpoint = Checkpoint.objects.create(
            run=run,
            number=last + 1,
            session_id=session_id,
            # The seq of its own checkpoint.created event: everything after it is newer.
            seq=run.last_seq + 1,
            kind=kind,
            label=label,
            tree=result.tree,
            files=result.files,
            bytes_total=result.bytes_total,
            bytes_added=result.bytes_added,
            handoff=_latest_handoff(run),
            state={"provider_meta": provider_meta(run), "checks": done_conditions.reading(run.pk)},
            usage={
                "turns": run.turns,
                "total_tokens": run.total_tokens,
                "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens,
                "cost_usd": str(run.cost_usd),
                "sessions": sessions,
            },
            parent=run.head_checkpoint,
        )
        event = eventlog.append(
            run_id,
            EventKind.CHECKPOINT_CREATED,
            {
                "checkpoint_id": checkpoint.pk,
                "number": checkpoint.number,
                "kind": kind,
                "label": label,
                "tree": result.tree,
                "files": result.files,
                "bytes_added": result.bytes_added,
                "ms": round(result.seconds * 1000, 1),
            },
            session_id=session_id,
            actor=actor,
            lease_owner=lease_owner,
        )
        assert event.seq == checkpoint.seq, "the run row lock keeps these equal"
        Run.objects.filter(pk=run_id).update(head_checkpoint=checkpoint, workspace_tree=result.tree)
    return checkpoint


def by_number(run_id: int, number: Any) -> Checkpoint:
    """A run's checkpoint by its number in the run (1, 2, 3 ...): what people name it by."""
    try:
        number = inputs.whole_number(number, what="a checkpoint number", minimum=1)
    except inputs.InputError as e:
        raise CheckpointError(str(e)) from None
    try:
        return Checkpoint.objects.select_related("run").get(run_id=run_id, number=number)
    except Checkpoint.DoesNotExist:
        raise CheckpointError(
            f"run {run_id} has no checkpoint {number} (checkpoints are numbered 1, 2, 3 ... within "
            "their run: `show_run` lists them)"
        ) from None


def get(run_id: int, checkpoint_id: int) -> Checkpoint:
    try:
        checkpoint_id = inputs.object_id(checkpoint_id, what="a checkpoint id")
        return Checkpoint.objects.get(pk=checkpoint_id, run_id=run_id)
    except (Checkpoint.DoesNotExist, inputs.InputError):
        raise CheckpointError(f"run {run_id} has no checkpoint {checkpoint_id}") from None


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
def rewind(
    run_id: int,
    checkpoint_id: int,
    *,
    actor: str,
    note: str = "",
    dry_run: bool = False,
    wait_seconds: float = 60.0,
) -> Discarded:
    """Rewind now, waiting (at most `wait_seconds`) for a worker to finish its step: the CLI's
    way. The web asks a worker to do it (`request_rewind`) and returns at once."""
    note = _note(note)
    run = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    if dry_run:
        return plan_rewind(run, checkpoint)
    _check_rewindable(run)
    if run.status == RunStatus.VERIFYING:
        raise CheckpointError(f"run {run_id} is running its checks; try again in a moment")
    _pause_to_rewind(run, checkpoint, actor)
    _wait_for_no_worker(run_id, wait_seconds)
    return _restore(run_id, checkpoint, actor=actor, note=note)


def request_rewind(run_id: int, checkpoint_id: int, *, actor: str, note: str = "") -> None:
    """Ask a worker to rewind the run: a `run.rewind_requested` event, and the work queued.
    The worker pauses the run (its own worker finishes the step it is on), restores the
    workspace and queues the run again; the page shows each step as it happens."""
    note = _note(note)
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
        jobs.later(
            "rewind_run",
            run_id=run_id,
            checkpoint_id=checkpoint.pk,
            actor=actor,
            note=note,
            until=time.time() + REWIND_WAIT_SECONDS,
            request_seq=request.seq,
        )


def reissue_rewind(request: Event) -> None:
    """Queue a rewind request's work again (the reaper: its task was lost)."""
    p = request.payload
    jobs.later(
        "rewind_run",
        run_id=request.run_id,
        checkpoint_id=p["checkpoint_id"],
        actor=request.actor,
        note=p.get("note", ""),
        until=time.time() + REWIND_WAIT_SECONDS,
        request_seq=request.seq,
    )


def rewind_answered(run_id: int, request_seq: int) -> bool:
    """Whether the rewind asked at `request_seq` was carried out or given up (an event says)."""
    after = Event.objects.filter(run_id=run_id, seq__gt=request_seq)
    return (
        after.filter(kind=EventKind.RUN_REWOUND).exists()
        or after.filter(kind=EventKind.ERROR, payload__source="rewind").exists()
    )


# How long a requested rewind waits for the run's worker to let go before it gives up.
REWIND_WAIT_SECONDS = 60.0


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
    if run.status == RunStatus.VERIFYING:
        return False  # the checks finish first; pausing then stops the run between steps
    _pause_to_rewind(run, checkpoint, actor)
    if _worker_holds(run_id):
        return False
    _restore(run_id, checkpoint, actor=actor, note=note)
    return True


def _note(note: str) -> str:
    """A person's note for the next session, checked like any text they hand in."""
    try:
        return inputs.text(note, what="the note", required=False)
    except inputs.InputError as e:
        raise CheckpointError(str(e)) from None


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


def _wait_for_no_worker(run_id: int, wait_seconds: float) -> None:
    """A worker finishing its step must be done with the workspace before it is restored."""
    deadline = time.monotonic() + wait_seconds
    while _worker_holds(run_id):
        if time.monotonic() >= deadline:
            raise CheckpointError(
                f"run {run_id} is paused but its worker is still finishing a step; try again shortly"
            )
        time.sleep(0.1)


# --- fork -----------------------------------------------------------------------------------
def fork(
    run_id: int,
    checkpoint_id: int,
    *,
    actor: str,
    created_by=None,
    goal: str | None = None,
    note: str = "",
) -> Run:
    note = _note(note)
    source = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    # Every setting of the origin; its start's fingerprints too (the checkpoint's workspace may
    # hold the agent's changes to what is protected or to how the checks run).
    spec = RunSpec.of(source, protected=source.protected, check_settings=source.check_settings)
    new = services.create_run(
        spec.replace(goal=goal or source.goal),
        created_by=created_by,
        forked_from=checkpoint,
        resume_state=ResumeState.from_checkpoint(checkpoint, note).as_json(),
        actor=actor,
    )
    eventlog.append(
        run_id,
        EventKind.RUN_FORKED,
        {"checkpoint_id": checkpoint.pk, "number": checkpoint.number, "fork_run_id": new.pk},
        actor=actor,
    )
    return new


# --- diff -----------------------------------------------------------------------------------
def diff(a: Checkpoint, b: Checkpoint | None) -> list[Change]:
    """Changes from checkpoint a to checkpoint b (of any run: a fork and its origin share one
    store), or to a's live workspace when b is None."""
    if b is not None:
        return workspaces.store().diff(a.tree, b.tree)
    return workspaces.diff_live(a.run, a.tree)
