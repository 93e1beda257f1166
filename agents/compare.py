"""Two runs side by side (a fork and its original, or any two): what each is and spent, its
done-conditions' history, and the workspace diff between their latest checkpoints. The web's
Compare page and `manage.py compare_runs` show the same; callers choose which runs a person may
see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents import checkpoints, verification
from agents.models import Checkpoint, Run
from agents.snapshots.results import Change


def latest_checkpoint(run: Run) -> Checkpoint | None:
    """The newest checkpoint on the run's live branch (its head); a fork that has not taken one
    yet holds the checkpoint it was forked from."""
    if run.head_checkpoint_id:
        return Checkpoint.objects.select_related("run").get(pk=run.head_checkpoint_id)
    newest = Checkpoint.objects.filter(run=run).select_related("run").order_by("-seq", "-pk")
    found = newest.first()
    if found is None and run.forked_from_id:
        found = Checkpoint.objects.select_related("run").get(pk=run.forked_from_id)
    return found


def origin_of(run: Run) -> int | None:
    """The id of the run a fork was made from (None for a run that is no fork)."""
    if not run.forked_from_id:
        return None
    return Checkpoint.objects.filter(pk=run.forked_from_id).values_list("run_id", flat=True).first()


@dataclass
class Side:
    run: Run
    sessions: int
    checks: dict[str, list[dict[str, Any]]]  # command -> results on the live branch, in order
    checkpoint: Checkpoint | None
    forked_from_run: int | None

    @classmethod
    def of(cls, run: Run) -> Side:
        return cls(
            run=run,
            sessions=run.sessions.count(),
            checks=verification.check_history(run.pk),
            checkpoint=latest_checkpoint(run),
            forked_from_run=origin_of(run),
        )

    def as_json(self) -> dict[str, Any]:
        run, cp = self.run, self.checkpoint
        return {
            "id": run.pk,
            "goal": run.goal,
            "status": run.status,
            "reason": run.status_reason,
            "provider": run.provider,
            "model": run.model,
            "sessions": self.sessions,
            "turns": run.turns,
            "tokens": run.total_tokens,
            "cost_usd": str(run.cost_usd),
            "active_seconds": round(run.active_seconds, 1),
            "forked_from_run": self.forked_from_run,
            "forked_from_checkpoint": run.forked_from_id,
            "checks": self.checks,
            "latest_checkpoint": (
                {"id": cp.pk, "run": cp.run_id, "seq": cp.seq, "kind": cp.kind, "files": cp.files}
                if cp
                else None
            ),
        }


@dataclass
class Comparison:
    a: Side
    b: Side
    # From a's latest checkpoint to b's; None when either has none yet.
    changes: list[Change] | None

    @property
    def commands(self) -> list[str]:
        """Every check either run has results for, in the order first met."""
        return list(dict.fromkeys([*self.a.checks, *self.b.checks]))

    def as_json(self) -> dict[str, Any]:
        return {
            "a": self.a.as_json(),
            "b": self.b.as_json(),
            "diff": None if self.changes is None else [c.__dict__ for c in self.changes],
        }


def compare(a: Run, b: Run) -> Comparison:
    left, right = Side.of(a), Side.of(b)
    changes = None
    if left.checkpoint is not None and right.checkpoint is not None:
        changes = checkpoints.diff(left.checkpoint, right.checkpoint)
    return Comparison(left, right, changes)
