"""A run's workspace on disk and its snapshots in the content-addressed store.

The store (agents/snapshots) knows trees and folders; this module knows runs: where a run's
workspace is, where its stat cache is kept (outside the workspace, so the agent can neither see
nor forge it), and how to snapshot, restore and diff a run's workspace. Checkpoints, forks,
rewinds and the judge all go through here.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from agents.blobstore import BlobStore
from agents.models import Run
from agents.snapshots import Change, RestoreResult, SnapshotResult, Snapshots


def store() -> Snapshots:
    return Snapshots(BlobStore())


def cache_path(run: Run) -> Path:
    # Outside the workspace: the agent must not be able to see or forge it.
    return Path(settings.DATA_DIR) / "statcache" / f"run-{run.pk}.json"


def snapshot(run: Run) -> SnapshotResult:
    return store().snapshot(run.workspace_path, cache_path=cache_path(run))


def restore(run: Run, tree: str) -> RestoreResult:
    """Make the run's workspace exactly `tree`, touching only the files that differ."""
    return store().restore(tree, run.workspace_path, cache_path=cache_path(run))


def diff_live(run: Run, tree: str | None, *, text_diffs: bool = True) -> list[Change]:
    """What changed from `tree` (None: nothing) to the run's workspace as it is now."""
    return store().diff(tree, run.workspace_path, text_diffs=text_diffs, cache_path=cache_path(run))
