"""Scanning a workspace, and storing it as a checkpoint.

Speed. A checkpoint costs one stat per entry. The stat cache keeps, per folder, the names and
stats (mode, size, mtime_ns, ctime_ns, inode) of its entries as os.scandir listed them, their
digests and the folder's tree digest. A folder whose names and stats all equal its record, and
whose sub-folders' digests are unchanged, reuses that record and tree digest with no other work
per entry; in a changed folder only files whose stat differs are read. Folders are opened by
descriptor, so each stat resolves one name. A value is only trusted once its timestamps are
older than the filesystem's clock at the start of the checkpoint that recorded it (read from a
probe file on the same filesystem, or the wall clock minus 2 s when there is none): a file
modified again within the same timestamp tick after being read would otherwise look unchanged
("racy git"). Such entries are simply read again next time. The cache file is a log: a
checkpoint appends one line per folder that changed, and nothing when none did (see StatCache).
Within one process, a cache file this process wrote last is not parsed again. Only trees that
are not stored yet are checked and written, top down: a stored tree implies its subtree is.

Crash safety. Blobs are written atomically (temp file, fsync, rename). Within a checkpoint every
file blob is written first, then the store's directories are fsynced, then the tree blobs,
children before parents, so no stored tree ever names a missing blob, even after a power cut;
`snapshot` returns only once the whole checkpoint is durable. A stored tree therefore implies its
whole subtree is stored, which lets a checkpoint skip checking blobs under unchanged folders;
`prune` keeps that invariant (it deletes trees parent-first, then other blobs).

Phases of one scan: walk.py lists and stats, hashing.py reads the files whose stat changed,
build.py makes folder records and tree digests, then (for a checkpoint) this module stores what is
not stored yet. A cached digest whose blob turns out to be missing and no longer the file's makes
its folder be scanned again without its record (RescanFolder).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import time
from pathlib import Path

from agents.blobstore import BlobStore
from agents.snapshots.build import build
from agents.snapshots.cache import FolderRecord, StatCache, keep_cache, load_cache
from agents.snapshots.hashing import FileHasher
from agents.snapshots.results import SnapshotResult
from agents.snapshots.scan_state import PendingFile, RescanFolder, ScannedFolder, ScanState
from agents.snapshots.trees import tree_bytes
from agents.snapshots.walk import walk

RACY_FALLBACK_NS = 2_000_000_000


class Scanner:
    """Scans workspaces for checkpoints (snapshot), and for restore and diff (scan, store=False).
    Callers of `scan` hold the store's lock."""

    def __init__(self, blobs: BlobStore, hasher: FileHasher):
        self.blobs = blobs
        self.hasher = hasher

    def snapshot(
        self, workspace: Path, *, cache_path: Path | None = None, cache: StatCache | None = None
    ) -> SnapshotResult:
        """Checkpoint `workspace`; returns once every blob of the checkpoint is durably stored.

        `cache_path` is a file (outside the workspace) where the stat cache is kept between
        calls; or pass a StatCache object to keep it in memory (it is updated in place).
        """
        started = time.perf_counter()
        workspace = Path(workspace)
        self.check_outside(workspace, cache_path)
        if cache is None:
            cache = load_cache(cache_path)
        with self.blobs.lock():
            scan = self.scan(workspace, cache, cache_path, store=True)
        keep_cache(cache, scan.new, cache_path)
        return SnapshotResult(
            tree=scan.root,
            files=scan.files,
            bytes_total=scan.bytes_total,
            blobs_added=scan.blobs_added,
            bytes_added=scan.bytes_added,
            hashed_files=scan.hashed,
            seconds=time.perf_counter() - started,
            dirs=scan.dirs,
            links=scan.links,
            skipped=scan.skipped,
        )

    def check_outside(self, workspace: Path, cache_path: Path | None) -> None:
        # Either inside the workspace would change with every checkpoint (and be checkpointed).
        ws = workspace.resolve()
        for other, what in ((self.blobs.root, "blob store"), (cache_path, "stat cache")):
            if other is not None and Path(other).resolve().is_relative_to(ws):
                raise ValueError(f"the {what} ({other}) must be outside the workspace ({ws})")

    def scan(
        self,
        workspace: Path,
        cache: StatCache,
        cache_path: Path | None,
        *,
        store: bool,
        live_paths: bool = False,
        keep_trees: bool = False,
    ) -> ScanState:
        """Scan `workspace` against `cache` (not changed: the new records are in the result's
        `new`); with store=True, as a checkpoint, everything it names durably stored."""
        root = os.fsencode(workspace)
        old = cache.dirs
        while True:
            try:
                return self._scan_once(root, old, cache_path, store, live_paths, keep_trees)
            except RescanFolder as r:
                # Read that folder's files again instead of trusting its record.
                old = {k: v for k, v in old.items() if k != r.key}

    def _scan_once(
        self,
        root: bytes,
        old: dict[str, FolderRecord],
        cache_path: Path | None,
        store: bool,
        live_paths: bool,
        keep_trees: bool,
    ) -> ScanState:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            probes = [self.blobs.root]
            if cache_path is not None:
                probes.insert(0, Path(cache_path).parent)
            trusted = fs_clock(st.st_dev, probes, create=store)
            scan = ScanState(old, trusted, live_paths, len(root) + 1, keep_trees or live_paths)
            top = walk(fd, root, "", scan)
        finally:
            os.close(fd)
        self.hasher.hash_pending(scan, store)
        build(top, scan)
        scan.root = top.rec.tree
        scan.files, scan.bytes_total, scan.dirs, scan.links = top.rec.totals
        if store:
            self._store(top, scan)
        return scan

    def _store(self, top: ScannedFolder, scan: ScanState) -> None:
        """Make the scanned checkpoint durable: its file blobs (written while hashing, or again by
        _plan_store) fsynced first, then the trees not stored yet, children before parents; trees
        found already stored get their mtime refreshed (see maintenance.py on prune)."""
        if self.blobs.exists(scan.root):
            # A stored tree implies its whole subtree is stored: nothing below to check.
            scan.freshen.append(scan.root)
        else:
            self._plan_store(top, scan)
        # Every file blob durable before any tree names it; then the trees, children first.
        self.blobs.sync()
        for data in scan.new_trees:
            _, added = self.blobs.add(data)
            if added:
                scan.blobs_added += 1
                scan.bytes_added += len(data)
        for digest in scan.freshen:
            with contextlib.suppress(FileNotFoundError):
                self.blobs.touch(digest)
        self.blobs.sync()

    def _plan_store(self, d: ScannedFolder, scan: ScanState) -> None:
        """For a folder whose tree is not stored: make sure every blob it names is, then queue
        its tree after those of its sub-folders (children first)."""
        rec = d.rec
        for i, s in enumerate(rec.sig):
            if not stat.S_ISREG(s[0]) or i in d.fresh or rec.vals[i] is None:
                continue
            digest = rec.vals[i]
            if self.blobs.exists(digest):
                continue
            # A cached digest whose blob is gone (a prune removed content that was never part of
            # a kept checkpoint): store the file again.
            path = d.path + b"/" + os.fsencode(rec.names[i])
            try:
                f = PendingFile(d, i, path, os.lstat(path))
                result = self.hasher.read(f, True)
            except FileNotFoundError:
                result = None
            if result is None or result[0] != digest:
                raise RescanFolder(d.key)
            if result[2]:
                scan.blobs_added += 1
                scan.bytes_added += result[1]
        for _, child in d.children:
            if self.blobs.exists(child.rec.tree):
                scan.freshen.append(child.rec.tree)
            else:
                self._plan_store(child, scan)
        data = d.data
        if data is None:
            # A record reused as is: its digest must be that of its tree, or the parent would
            # name a blob that is never written.
            data = tree_bytes(rec.entries)
            if hashlib.sha256(data).hexdigest() != rec.tree:
                raise RescanFolder(d.key)
        scan.new_trees.append(data)


def fs_clock(dev: int, folders: list[Path], *, create: bool) -> int:
    """Files with timestamps before the returned ns value can be cached safely."""
    for folder in folders:
        try:
            if create:
                folder.mkdir(parents=True, exist_ok=True)
            if os.stat(folder).st_dev != dev:
                continue
            # A new file's mtime is the filesystem's own "now", at its own granularity.
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-clock-")
        except OSError:
            continue
        try:
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
            os.unlink(tmp)
    return time.time_ns() - RACY_FALLBACK_NS
