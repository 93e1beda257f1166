"""Checkpoints of a run (workspace and agent state together), rewind, fork, and diffs.

The workspace goes into the content-addressed snapshot store (agents/snapshots/): a checkpoint
is a root tree digest, so unchanged files cost nothing. The agent's state at that point is the
latest handoff and the provider's place, kept on the Checkpoint row.

Rewinding never truncates the log: a run.rewound event records what is discarded, and the events
after the checkpoint stay where they are, as an abandoned branch (see
`EventQuerySet.abandoned_ranges`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.db.models import Max

from agents import (
    dbconn,
    done_conditions,
    eventlog,
    inputs,
    services,
    workspaces,
)
from agents.models import (
    Checkpoint,
    Event,
    EventKind,
    ResumeState,
    Run,
    Session,
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
    latest model turn's, or where a rewind or fork put it. `run` as read from the database."""
    turn = None
    if run.turns:  # every model.turn adds one (eventlog.COUNTERS): with none, none to read
        turn = (
            Event.objects.on_live_branch(run.pk, Event.objects.ranges_of(run))
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
    run: Run | None = None,
) -> Checkpoint:
    """`run`: the run as the worker holding its lease has it (its workspace is that worker's to
    read, and `_record` reads the row again under its lock)."""
    held = lease_owner is not None or not workspaces.cached()
    for _ in range(10):
        if run is None or lease_owner is None:
            run = Run.objects.get(pk=run_id)
        described = None if held or not run.workspace_tree else run.workspace_tree
        if described is None:
            # Reading and storing the files may wait on the disk: no database connection is
            # held meanwhile (hundreds of runs ending together queued on the pool for it).
            dbconn.release()
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
        # Each its own statement, after the lock: in one statement with the lock, PostgreSQL
        # reads them as of before any wait for the lock, and a checkpoint committed meanwhile
        # (a person's beside the worker's) gave two the same number (found by bench/chaos.py).
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
            state={
                "provider_meta": provider_meta(run),
                "checks": done_conditions.reading(run.pk, run),
            },
            usage={
                "turns": run.turns,
                "total_tokens": run.total_tokens,
                "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens,
                "cost_usd": str(run.cost_usd),
                "sessions": sessions,
            },
            parent_id=run.head_checkpoint_id,
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


def clean_note(note: str) -> str:
    """A person's note for the next session, checked like any text they hand in."""
    try:
        return inputs.text(note, what="the note", required=False)
    except inputs.InputError as e:
        raise CheckpointError(str(e)) from None


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
    note = clean_note(note)
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
