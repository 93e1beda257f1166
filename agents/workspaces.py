"""A run's workspace on disk and its snapshots in the content-addressed store.

The store (agents/snapshots) knows trees and folders; this module knows runs: where a run's
workspace is, where its stat cache is kept (outside the workspace, so the agent can neither see
nor forge it), and how to snapshot, restore and diff a run's workspace. Checkpoints, forks,
rewinds and the judge all go through here.

A worker watches the workspace of the run it drives (`watch`/`unwatch`, around each slice): a
change feed (agents/snapshots/feed.py) that lets `snapshot` and `restore` in this process look
only at the folders changed since the last checkpoint. Without one (another process, a restart,
lost events) they scan the whole workspace, as they always could.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from agents import blobstore
from agents.models import Checkpoint, Run
from agents.snapshots import (
    Change,
    ChangeFeed,
    RestoreResult,
    SnapshotError,
    SnapshotResult,
    Snapshots,
    feed,
    journal,
)
from agents.snapshots.beneath import open_beneath


def store() -> Snapshots:
    return Snapshots(blobstore.configured())


def cache_path(run: Run) -> Path:
    # Outside the workspace: the agent must not be able to see or forge it.
    return Path(settings.DATA_DIR) / "statcache" / f"run-{run.pk}.json"


def watch(run: Run) -> ChangeFeed | None:
    """Start (or reuse) this process's change feed of the run's workspace; None where it cannot
    be watched or SHIFTLOG["CHANGE_FEED"] is off. Pair with `unwatch`."""
    if not settings.SHIFTLOG.get("CHANGE_FEED", True):
        return None
    return feed.acquire(run.workspace_path)


def unwatch(watching: ChangeFeed | None) -> None:
    """The slice is over: the feed lingers a while (a rewind or the next slice here reuses it)."""
    feed.release(watching)


def snapshot(run: Run) -> SnapshotResult:
    """Checkpoint the run's workspace: only what changed since the last checkpoint when this
    process's change feed is trusted, or (the web, the CLI, another worker) when the worker
    watching the workspace shares what its feed saw (snapshots/journal.py); else a scan of
    everything."""
    watching = feed.active(run.workspace_path)
    return store().snapshot(
        run.workspace_path, cache_path=cache_path(run), feed=watching, borrow=watching is None
    )


def restore(run: Run, tree: str) -> RestoreResult:
    """Make the run's workspace exactly `tree`, touching only the files that differ (looking
    only at what changed, as `snapshot` does)."""
    watching = feed.active(run.workspace_path)
    return store().restore(
        tree,
        run.workspace_path,
        cache_path=cache_path(run),
        feed=watching,
        borrow=watching is None,
    )


def diff_live(run: Run, tree: str | None, *, text_diffs: bool = True) -> list[Change]:
    """What changed from `tree` (None: nothing) to the run's workspace as it is now: with
    workspaces as each host's cache, as last committed (no folder needed where this runs)."""
    if cached() and (live := committed_tree(run)):
        return store().diff(tree, live, text_diffs=text_diffs)
    return store().diff(tree, run.workspace_path, text_diffs=text_diffs, cache_path=cache_path(run))


# --- workspaces as each host's cache (SHIFTLOG["WORKSPACE_CACHE"]) ---------------------------
#
# Run.workspace_tree is the run's last committed workspace, in the store: set in the transaction
# that commits each tool result whose call changed the workspace (after its blobs are stored),
# and by checkpoints, rewinds, merges and uploads. A host holds a run's workspace as a cache and
# records which tree it holds in a state file beside its stat cache (outside the workspace); a
# worker that claims a run whose tree it does not hold restores it from the store first.


def cached() -> bool:
    return bool(settings.SHIFTLOG["WORKSPACE_CACHE"])


def _state_path(run_id: int) -> Path:
    return Path(settings.DATA_DIR) / "workspace-state" / f"run-{run_id}.json"


def _held_state(run: Run) -> dict[str, Any]:
    try:
        state = json.loads(_state_path(run.pk).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def held_tree(run: Run) -> str:
    """The tree this host's copy of the run's workspace is known to be at ("" if none, or while
    a call that may change it has no committed result)."""
    if not run.workspace_path.is_dir():
        return ""
    state = _held_state(run)
    return "" if state.get("unsettled") else str(state.get("tree", ""))


def hold(run: Run, tree: str, size: int | None = None) -> None:
    """Record that this host's copy of the workspace is at `tree` (and its size, for eviction;
    None: the size last recorded)."""
    if size is None:
        size = int(_held_state(run).get("bytes", 0) or 0)
    _write_state(run.pk, {"tree": tree, "bytes": size})


def unsettle(run: Run) -> None:
    """A call that may change the workspace is about to run: until its result commits (and
    `hold` names the tree the call left), this host's copy is the tree it held plus whatever
    the call did. A worker that dies meanwhile leaves the call's changes and no result; the
    next worker here keeps them (the call is closed as interrupted: it may have had its
    effect) unless the run was rewound since: that branch never made the call, so the copy is
    restored (a rewind to the checkpoint of the tree last held kept what the dead call did;
    found by bench/chaos.py)."""
    if not cached():
        return
    state = _held_state(run)
    if state.get("tree") and not state.get("unsettled"):
        _write_state(run.pk, {**state, "unsettled": True, "branch": run.branch_seq})


def settle(run: Run, tree: str) -> None:
    """The call's result is committed and it changed nothing: this host's copy is at `tree`
    (the run's committed tree) again."""
    if cached() and tree:
        hold(run, tree)


def _write_state(run_id: int, state: dict[str, Any]) -> None:
    path = _state_path(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def committed_tree(run: Run) -> str:
    """The run's last committed workspace tree, read fresh ("" if none is recorded)."""
    return Run.objects.filter(pk=run.pk).values_list("workspace_tree", flat=True).first() or ""


def changed_tree(run: Run, last: str) -> SnapshotResult | None:
    """After a tool call: the workspace's snapshot if it differs from `last`, its blobs stored;
    None when it did not change (with this process's change feed: no scan at all)."""
    watching = feed.active(run.workspace_path)
    if watching is not None and last and not watching.pending():
        return None
    result = snapshot(run)
    return None if result.tree == last else result


def ensure_local(run: Run) -> dict[str, Any] | None:
    """Before a worker's first step: make this host's copy of the run's workspace its last
    committed tree, restored from the store when it is missing or at another tree. Returns what
    was done (for the `workspace.restored` event), or None when the copy was already right."""
    if not cached():
        return None
    tree, branch = Run.objects.filter(pk=run.pk).values_list(
        "workspace_tree", "branch_seq"
    ).first() or ("", 0)
    if not tree:
        return None
    state = _held_state(run) if run.workspace_path.is_dir() else {}
    had, unsettled = state.get("tree", ""), bool(state.get("unsettled"))
    if had == tree and (not unsettled or state.get("branch") == branch):
        _used(run)
        return None
    started = time.perf_counter()
    result = restore(run, tree)
    state = stored_state(tree)
    files, size = state.files, state.bytes_total
    hold(run, tree, size)
    checkpoint = (
        Checkpoint.objects.filter(run=run, tree=tree).order_by("-number").values("pk", "number")
    ).first()
    return {
        "host": settings.SHIFTLOG["HOST"],
        "tree": tree,
        "checkpoint_id": checkpoint["pk"] if checkpoint else None,
        "checkpoint": checkpoint["number"] if checkpoint else None,
        "files": files,
        "bytes": size,
        "written": result.written,
        "removed": result.removed,
        "milliseconds": round((time.perf_counter() - started) * 1000, 1),
        "had": (
            "nothing"
            if not had
            else "a call's unrecorded changes, and the run was rewound since"
            if had == tree
            else "an older state"
        ),
    }


def _used(run: Run) -> None:
    with contextlib.suppress(OSError):
        os.utime(_state_path(run.pk))


def evict(*, keep: int | None = None) -> list[int]:
    """Keep this host's workspaces of other runs under SHIFTLOG_WORKSPACE_CACHE_MB: the least
    recently used go first, never `keep` nor a run this host holds a lease on, nor a run whose
    last committed tree is not recorded (its copy here may be the only one). Returns the runs
    whose workspaces were removed."""
    cap = settings.SHIFTLOG["WORKSPACE_CACHE_MB"] * 1024 * 1024
    folder = _state_path(0).parent
    held = []
    for path in folder.glob("run-*.json"):
        try:
            state = json.loads(path.read_text())
            held.append((path.stat().st_mtime, int(path.stem[4:]), int(state.get("bytes", 0))))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    total = sum(size for _, _, size in held)
    if total <= cap:
        return []
    mine = f"worker:{settings.SHIFTLOG['HOST']}:"
    rows = Run.objects.filter(pk__in=[run_id for _, run_id, _ in held]).values_list(
        "pk", "lease_owner", "workspace_tree"
    )
    removable = {pk for pk, owner, tree in rows if tree and not owner.startswith(mine)}
    removed = []
    for _, run_id, size in sorted(held):
        if total <= cap:
            break
        if run_id == keep or run_id not in removable:
            continue
        shutil.rmtree(Path(settings.SHIFTLOG["WORKSPACE_ROOT"]) / f"run-{run_id}", True)
        stat_cache = Path(settings.DATA_DIR) / "statcache" / f"run-{run_id}.json"
        for path in (_state_path(run_id), stat_cache, journal.journal_path(stat_cache)):
            path.unlink(missing_ok=True)
        shutil.rmtree(journal.flush_dir(stat_cache), True)
        total -= size
        removed.append(run_id)
    return removed


def read_live(run: Run, rel: str, limit: int) -> bytes | None:
    """A file of the run's workspace as it is now (as last committed, with workspaces as each
    host's cache), if it is a regular file inside it of at most `limit` bytes; else None."""
    if cached() and (tree := committed_tree(run)):
        snaps = store()
        entry = snaps.files(tree).get(rel.strip("/"))
        if entry is None or entry.type != "f" or (entry.size or 0) > limit:
            return None
        try:
            return snaps.read(tree, entry.path)
        except (SnapshotError, OSError):
            return None
    try:
        # Through no link at any level: an agent may swap a folder for one at any moment.
        fd = open_beneath(run.workspace_path, os.fsencode(posixpath.normpath(rel.strip("/"))))
    except (OSError, ValueError):
        return None
    with open(fd, "rb", buffering=0) as f:
        if os.fstat(fd).st_size > limit:
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def stored_state(tree: str) -> SnapshotResult:
    """A stored tree described as a snapshot of it would be (nothing added to the store)."""
    started = time.perf_counter()
    entries = store().files(tree).values()
    files = [e for e in entries if e.type == "f"]
    return SnapshotResult(
        tree=tree,
        files=len(files),
        bytes_total=sum(e.size or 0 for e in files),
        blobs_added=0,
        bytes_added=0,
        hashed_files=0,
        seconds=time.perf_counter() - started,
        dirs=sum(1 for e in entries if e.type == "d"),
        links=sum(1 for e in entries if e.type == "l"),
    )
