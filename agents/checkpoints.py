"""Checkpoints of a run (workspace and agent state together), rewind, fork, and diffs.

The workspace goes into the content-addressed snapshot store (agents/snapshots.py): a checkpoint
is a root tree digest, so unchanged files cost nothing. The agent's state at that point is the
latest handoff and the provider's place, kept on the Checkpoint row.

Rewinding never truncates the log: a run.rewound event records what is discarded, and the events
after the checkpoint stay where they are, as an abandoned branch (see `abandoned_ranges`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agents import eventlog, lifecycle, policy
from agents.blobstore import BlobStore
from agents.models import (
    Approval,
    ApprovalStatus,
    Artifact,
    Checkpoint,
    EndReason,
    Event,
    EventKind,
    Run,
    RunScript,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.snapshots import Change, Snapshots
from agents.tasks import enqueue

FILE_TOOLS = frozenset({"write_file", "edit_file", "bash"})


class CheckpointError(ValueError):
    pass


def snapshots() -> Snapshots:
    return Snapshots(BlobStore())


def cache_path(run: Run) -> Path:
    # Outside the workspace: the agent must not be able to see or forge it.
    return Path(settings.DATA_DIR) / "statcache" / f"run-{run.pk}.json"


def protected_originals() -> Iterator[tuple[int, str, str]]:
    """(run id, path, blob) for every run's protected files.

    `verification.fingerprint` stores their originals with `BlobStore.put` when the run is created,
    and the checks are run against them (`restore_originals`), so the store must keep them like
    a checkpoint's files, also for a run whose first checkpoint is not taken yet. A fork copies
    its origin's fingerprints, so every run counts, over or not.
    """
    rows = Run.objects.exclude(protected={}).values_list("pk", "protected")
    for run_id, prints in rows.iterator(chunk_size=500):
        for path, fingerprint in (prints or {}).items():
            yield run_id, path, fingerprint["hash"]


def abandoned_ranges(run_id: int) -> list[tuple[int, int]]:
    """(after, upto] seq ranges that rewinds turned into abandoned branches."""
    return [
        (p["to_seq"], p["from_seq"])
        for p in Event.objects.filter(run_id=run_id, kind=EventKind.RUN_REWOUND)
        .order_by("seq")
        .values_list("payload", flat=True)
    ]


def live_filter(run_id: int) -> Q:
    """A filter for a run's events that leaves out abandoned branches."""
    q = Q()
    for after, upto in abandoned_ranges(run_id):
        q &= ~Q(seq__gt=after, seq__lte=upto)
    return q


def _latest_checks(run: Run) -> dict[str, dict[str, Any]]:
    """Each check's latest result on the live branch: the ratchet's reading at a checkpoint."""
    latest: dict[str, dict[str, Any]] = {}
    rows = (
        Event.objects.filter(run_id=run.pk, kind=EventKind.CHECK_RESULT)
        .filter(live_filter(run.pk))
        .order_by("seq")
        .values_list("seq", "payload")
    )
    for seq, payload in rows:
        latest[payload["command"]] = {
            "passed": payload["passed"],
            "exit_code": payload.get("exit_code"),
            "seq": seq,
            "at": payload.get("at", "finish"),
        }
    return latest


def _provider_meta(run: Run) -> dict[str, Any]:
    turn = (
        Event.objects.filter(run_id=run.pk, kind=EventKind.MODEL_TURN)
        .filter(live_filter(run.pk))
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()
    )
    if turn is not None:
        return turn.get("meta", {})
    return (run.resume_state or {}).get("provider_meta", {})


def _latest_handoff(run: Run) -> dict[str, Any] | None:
    session = (
        Session.objects.filter(run=run, handoff__isnull=False)
        .order_by("-index")
        .only("handoff")
        .first()
    )
    if session is not None:
        return session.handoff
    return (run.resume_state or {}).get("handoff")


def create(
    run_id: int,
    *,
    kind: str,
    label: str = "",
    session_id: int | None = None,
    actor: str = "harness",
    lease_owner: str | None = None,
) -> Checkpoint:
    run = Run.objects.get(pk=run_id)
    result = snapshots().snapshot(run.workspace_path, cache_path=cache_path(run))
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        sessions = Session.objects.filter(run=run).count()
        checkpoint = Checkpoint.objects.create(
            run=run,
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
            state={"provider_meta": _provider_meta(run), "checks": _latest_checks(run)},
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
        Run.objects.filter(pk=run_id).update(head_checkpoint=checkpoint)
    return checkpoint


def get(run_id: int, checkpoint_id: int) -> Checkpoint:
    try:
        return Checkpoint.objects.get(pk=checkpoint_id, run_id=run_id)
    except Checkpoint.DoesNotExist:
        raise CheckpointError(f"run {run_id} has no checkpoint {checkpoint_id}") from None


# --- what a rewind would discard -------------------------------------------------------------
@dataclass
class Discarded:
    checkpoint_id: int
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_rewind(run: Run, checkpoint: Checkpoint) -> Discarded:
    after = Event.objects.filter(run=run, seq__gt=checkpoint.seq).filter(live_filter(run.pk))
    by_kind: dict[str, int] = {}
    irreversible = []
    for kind, payload in after.values_list("kind", "payload").iterator(chunk_size=1000):
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if kind == EventKind.TOOL_CALL and payload.get("name") == "bash":
            command = str((payload.get("input") or {}).get("command", ""))
            # A rewind puts files back; it cannot unsend a request or undo a change elsewhere.
            risks = [r for r in policy.classify_bash(command) if r != "deletes widely"]
            if risks:
                irreversible.append({"command": command, "risks": risks})
    usage = checkpoint.usage or {}
    changes = snapshots().diff(
        checkpoint.tree, run.workspace_path, text_diffs=False, cache_path=cache_path(run)
    )
    return Discarded(
        checkpoint_id=checkpoint.pk,
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
    )


def _reverse(status: str) -> str:
    # diff(checkpoint → live) says what happened since; a rewind undoes it.
    return {"added": "removed by rewind", "removed": "restored by rewind"}.get(
        status, f"{status}, restored"
    )


def _decimal(value: Any):
    from decimal import Decimal

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
    run = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    if dry_run:
        return plan_rewind(run, checkpoint)
    if not run.is_live:
        raise CheckpointError(f"run {run_id} is {run.status}; fork it from the checkpoint instead")
    if run.status == RunStatus.VERIFYING:
        raise CheckpointError(f"run {run_id} is running its checks; try again in a moment")
    if run.status != RunStatus.PAUSED:
        lifecycle.transition(
            run_id, RunStatus.PAUSED, actor=actor, reason=f"paused by {actor} to rewind"
        )
    _wait_for_no_worker(run_id, wait_seconds)
    run.refresh_from_db()
    discarded = plan_rewind(run, checkpoint)
    snapshots().restore(checkpoint.tree, run.workspace_path, cache_path=cache_path(run))
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
        for approval in Approval.objects.filter(run=run, status=ApprovalStatus.PENDING):
            Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
                status=ApprovalStatus.EXPIRED,
                decided_at=now,
                comment=f"discarded by the rewind to checkpoint {checkpoint.pk}",
            )
        discarded.from_seq = Run.objects.get(pk=run_id).last_seq
        event = eventlog.append(
            run_id, EventKind.RUN_REWOUND, {**discarded.as_dict(), "note": note}, actor=actor
        )
        Run.objects.filter(pk=run_id).update(
            head_checkpoint=checkpoint,
            branch_seq=event.seq,
            resume_state={
                "checkpoint_id": checkpoint.pk,
                "handoff": checkpoint.handoff,
                "note": note,
                "provider_meta": checkpoint.state.get("provider_meta", {}),
            },
        )
        lifecycle.transition(
            run_id,
            RunStatus.QUEUED,
            actor=actor,
            reason=f"rewound to checkpoint {checkpoint.pk} by {actor}",
        )
        enqueue(run_id)
    return discarded


def _wait_for_no_worker(run_id: int, wait_seconds: float) -> None:
    """A worker finishing its step must be done with the workspace before it is restored."""
    deadline = time.monotonic() + wait_seconds
    while True:
        owner, expires = (
            Run.objects.filter(pk=run_id).values_list("lease_owner", "lease_expires_at").get()
        )
        if not owner or (expires is not None and expires < timezone.now()):
            return
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
    from agents import services

    source = Run.objects.get(pk=run_id)
    checkpoint = get(run_id, checkpoint_id)
    script = RunScript.objects.filter(run=source).values_list("script", flat=True).first()
    new = services.create_run(
        goal=goal or source.goal,
        checks=source.checks,
        rubric=source.rubric,
        provider=source.provider,
        script=script,
        script_name=source.script_name,
        model=source.model,
        budgets=services.Budgets(
            max_sessions=source.max_sessions,
            max_tokens=source.max_tokens,
            max_cost_usd=source.max_cost_usd,
            max_wall_seconds=source.max_wall_seconds,
        ),
        max_turns_per_session=source.max_turns_per_session,
        max_input_tokens_per_session=source.max_input_tokens_per_session,
        tool_policy=source.tool_policy,
        webhook_urls=source.webhook_urls,
        approval_timeout_seconds=source.approval_timeout_seconds,
        judge_model=source.judge_model,
        protected_action=source.protected_action,
        protected=source.protected,
        acceptance=[{"name": c["name"], "check": c.get("check")} for c in source.acceptance],
        created_by=created_by,
        forked_from=checkpoint,
        resume_state={
            "checkpoint_id": checkpoint.pk,
            "handoff": checkpoint.handoff,
            "note": note,
            "provider_meta": checkpoint.state.get("provider_meta", {}),
        },
        actor=actor,
    )
    eventlog.append(
        run_id,
        EventKind.RUN_FORKED,
        {"checkpoint_id": checkpoint.pk, "fork_run_id": new.pk},
        actor=actor,
    )
    return new


def restore_into(checkpoint: Checkpoint, run: Run) -> None:
    snapshots().restore(checkpoint.tree, run.workspace_path, cache_path=cache_path(run))


# --- diff -----------------------------------------------------------------------------------
def diff(a: Checkpoint, b: Checkpoint | None) -> list[Change]:
    """Changes from checkpoint a to checkpoint b (of any run: a fork and its origin share one
    store), or to a's live workspace when b is None."""
    if b is not None:
        return snapshots().diff(a.tree, b.tree)
    return snapshots().diff(a.tree, a.run.workspace_path, cache_path=cache_path(a.run))
