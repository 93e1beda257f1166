"""Checkpoints of a run's workspace: git-like Merkle trees in the content-addressed BlobStore.

Pure Python (no Django): give it a BlobStore with an explicit root.

    snaps = Snapshots(BlobStore(root))
    res = snaps.snapshot(workspace, cache_path=meta / "stat-cache.json")  # res.tree identifies it
    snaps.restore(res.tree, workspace, cache_path=...)   # rewind: the workspace becomes that tree
    snaps.restore(res.tree, new_workspace)               # fork: same, into another (new) folder
    feed = ChangeFeed(workspace)                         # or feed.acquire(workspace) per process
    snaps.snapshot(workspace, cache_path=..., feed=feed) # looks only at what changed since the last
    snaps.diff(old_tree, new_tree)                       # or diff(old_tree, workspace_path)
    snaps.files(tree); snaps.read(tree, "src/app.py")
    snaps.referenced_blobs(trees); snaps.verify(trees); snaps.prune(keep_trees, keep_blobs)

How it works, one concern per module (each docstring states its invariants):
    names.py        file names as trees store them (b64: for non-UTF-8), paths as handed out
    trees.py        the tree format (bytes and digests existing stores rely on); TreeReader
    cache.py        the stat cache: per-folder records, an append-only log file, version 3
    feed.py         ChangeFeed: which folders changed since the last checkpoint (inotify)
    journal.py      what a feed knows, shared with processes that keep none (web, CLI)
    scan.py         Scanner: snapshot; speed (stat cache, racy timestamps) and crash safety
    scan_state.py   what one scan passes between its phases
    walk.py         listing and stat-ing a workspace (the hot loop)
    hashing.py      reading and hashing (and storing) the files whose stat changed
    build.py        folder records and tree digests, children first
    restore.py      Restorer: rewind and fork, touching only what differs
    diff.py         Differ: changes between checkpoints or a live workspace, with text diffs
    maintenance.py  StoreMaintenance: referenced blobs, verify, prune; concurrency with prune
    results.py, errors.py   what the methods return and raise

Paths handed out (Entry.path, Change.path) are "/"-joined and decoded as UTF-8 with
surrogateescape, so `path.encode("utf-8", "surrogateescape")` gives the exact bytes back;
`display()` makes one printable. Methods taking a path accept that str or the raw bytes.

Not kept: owners, timestamps, extended attributes, hard links (each path gets its own copy);
sockets, FIFOs and devices are skipped (listed in SnapshotResult.skipped). The workspace's own
permissions are not part of the tree. Nothing else should write to the workspace during a
restore. POSIX only (bytes paths, fcntl locks).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from agents.blobstore import BlobStoreBackend
from agents.snapshots.cache import StatCache
from agents.snapshots.diff import TEXT_DIFF_MAX_INPUT, Differ
from agents.snapshots.errors import CorruptBlob, MissingBlob, SnapshotError
from agents.snapshots.feed import ChangeFeed
from agents.snapshots.hashing import FileHasher
from agents.snapshots.maintenance import StoreMaintenance, iter_tree_blobs
from agents.snapshots.names import B64_PREFIX, decode_name, display, encode_name
from agents.snapshots.restore import Restorer
from agents.snapshots.results import Change, Entry, PruneResult, RestoreResult, SnapshotResult
from agents.snapshots.scan import RACY_FALLBACK_NS, Scanner
from agents.snapshots.trees import TREE_MAGIC, TreeReader

__all__ = [
    "B64_PREFIX",
    "RACY_FALLBACK_NS",
    "TEXT_DIFF_MAX_INPUT",
    "TREE_MAGIC",
    "Change",
    "ChangeFeed",
    "CorruptBlob",
    "Entry",
    "MissingBlob",
    "PruneResult",
    "RestoreResult",
    "SnapshotError",
    "SnapshotResult",
    "Snapshots",
    "StatCache",
    "decode_name",
    "display",
    "encode_name",
    "iter_tree_blobs",
]


class Snapshots:
    """The snapshot store's entry point: each method hands over to the part doing that work."""

    def __init__(self, blobs: BlobStoreBackend, *, workers: int | None = None):
        self.blobs = blobs
        # Reading and hashing release the GIL, so a few threads overlap the I/O and fsyncs of a
        # first checkpoint.
        self._hasher = FileHasher(
            blobs, workers if workers is not None else min(4, os.cpu_count() or 1)
        )
        # Parsed trees, shared by reading, restore, diff and maintenance (prune forgets the ones
        # it deletes).
        self._trees = TreeReader(blobs)
        self._scanner = Scanner(blobs, self._hasher)
        self._restorer = Restorer(blobs, self._trees, self._scanner)
        self._differ = Differ(blobs, self._trees, self._scanner)
        self._maintenance = StoreMaintenance(blobs, self._trees)

    @property
    def workers(self) -> int:
        """Threads reading files when a scan has many to read."""
        return self._hasher.workers

    @workers.setter
    def workers(self, workers: int) -> None:
        self._hasher.workers = workers

    def snapshot(
        self,
        workspace: Path,
        *,
        cache_path: Path | None = None,
        cache: StatCache | None = None,
        feed: ChangeFeed | None = None,
        borrow: bool = False,
    ) -> SnapshotResult:
        """Checkpoint `workspace`; returns once every blob of the checkpoint is durably stored.

        With `feed` (the workspace's ChangeFeed) it is the checkpoint of what changed since the
        last one: only the folders the feed reported are looked at when the feed is trusted
        (result.incremental), and one with nothing reported costs no system call on the
        workspace; else it scans everything, as without a feed. With `borrow`, a process that
        keeps no feed uses the journal of the process that does (journal.py), when there is a
        trusted one. Details: scan.Scanner.snapshot.
        """
        return self._scanner.snapshot(
            workspace, cache_path=cache_path, cache=cache, feed=feed, borrow=borrow
        )

    def files(self, tree: str) -> dict[str, Entry]:
        """Every path in the checkpoint (folders included) -> its entry."""
        return self._trees.files(tree)

    def read(self, tree: str, path: str | bytes) -> bytes:
        """Content of the file at `path` in the checkpoint."""
        return self._trees.read(tree, path)

    def restore(
        self,
        tree: str,
        workspace: Path,
        *,
        cache_path: Path | None = None,
        cache: StatCache | None = None,
        dry_run: bool = False,
        feed: ChangeFeed | None = None,
        borrow: bool = False,
    ) -> RestoreResult:
        """Make `workspace` exactly checkpoint `tree` (creating it if needed).

        Details: restore.Restorer.restore.
        """
        return self._restorer.restore(
            tree,
            workspace,
            cache_path=cache_path,
            cache=cache,
            dry_run=dry_run,
            feed=feed,
            borrow=borrow,
        )

    def diff(
        self,
        old: str | Path | None,
        new: str | Path | None,
        *,
        text_diffs: bool = True,
        max_diff_bytes: int = 200_000,
        cache_path: Path | None = None,
    ) -> list[Change]:
        """Changes from `old` to `new`: each a tree digest, a live workspace folder, or None (empty).

        Details: diff.Differ.diff.
        """
        return self._differ.diff(
            old, new, text_diffs=text_diffs, max_diff_bytes=max_diff_bytes, cache_path=cache_path
        )

    def referenced_blobs(self, trees: Iterable[str]) -> set[str]:
        """Every blob reachable from `trees`, the trees themselves included (missing ones too)."""
        return self._maintenance.referenced_blobs(trees)

    def verify(self, trees: Iterable[str]) -> list[str]:
        """Problems with the checkpoints `trees`: missing blobs, blobs not matching their digest,
        unreadable trees. Empty when every checkpoint can be restored.

        Details: maintenance.StoreMaintenance.verify.
        """
        return self._maintenance.verify(trees)

    def prune(
        self,
        keep_trees: Iterable[str],
        keep_blobs: Iterable[str] = (),
        *,
        grace_seconds: float = 3600.0,
        dry_run: bool = False,
    ) -> PruneResult:
        """Delete blobs not reachable from `keep_trees` and not in `keep_blobs` (artifacts).

        Details: maintenance.StoreMaintenance.prune.
        """
        return self._maintenance.prune(
            keep_trees, keep_blobs, grace_seconds=grace_seconds, dry_run=dry_run
        )
