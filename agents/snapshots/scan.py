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

Crash safety. A checkpoint writes its new blobs as one blobstore.Batch: every file blob, then
the trees, children before parents, each to a temporary file; then one barrier makes them all
durable, they are renamed into place in that order, and the renamed-into folders are fsynced
(two barriers per checkpoint, not one fsync per blob). A blob is never named before its content
is durable and, renames being durable in order (ext4, XFS), no stored tree ever names a missing
blob, even after a power cut; `snapshot` returns only once the whole checkpoint is durable. A
stored tree therefore implies its whole subtree is stored, which lets a checkpoint skip
checking blobs under unchanged folders; `prune` keeps that invariant (it deletes trees
parent-first, then other blobs).

Change feed. Given a feed (feed.py) whose changes are trusted for the stat cache, a checkpoint
is incremental: it lists only the folders reported changed (plus those whose records hold
entries not to be trusted as they are), reaches them through their ancestors' records, walks
new folders whole, and takes every other folder's record as it is (walk.walk_changed). Its
result is the tree a full scan would give. A feed that is not trusted (new process, lost
events, a cache written elsewhere) means a full scan, which becomes the feed's new baseline.
With nothing reported, a checkpoint makes no system call on the workspace at all.

Phases of one scan: walk.py lists and stats, hashing.py reads the files whose stat changed,
build.py makes folder records and tree digests, then (for a checkpoint) this module stores what is
not stored yet. A cached digest whose blob turns out to be missing and no longer the file's makes
its folder be scanned again without its record (RescanFolder).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
from pathlib import Path

from agents.blobstore import BlobStoreBackend
from agents.snapshots import journal, lazy
from agents.snapshots.beneath import open_beneath
from agents.snapshots.build import build
from agents.snapshots.cache import (
    FolderRecord,
    Records,
    StatCache,
    join_key,
    keep_cache,
    load_cache,
)
from agents.snapshots.feed import ChangeFeed
from agents.snapshots.hashing import FileHasher
from agents.snapshots.results import SnapshotResult
from agents.snapshots.scan_state import (
    PendingFile,
    RescanFolder,
    ScannedFolder,
    ScanPlan,
    ScanState,
)
from agents.snapshots.trees import tree_bytes
from agents.snapshots.walk import pinned, walk, walk_changed

RACY_FALLBACK_NS = 2_000_000_000


class Scanner:
    """Scans workspaces for checkpoints (snapshot), and for restore and diff (scan, store=False).
    Callers of `scan` hold the store's lock."""

    def __init__(self, blobs: BlobStoreBackend, hasher: FileHasher):
        self.blobs = blobs
        self.hasher = hasher
        self._outside: set[tuple[str, str | None]] = set()  # pairs check_outside passed

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

        `cache_path` is a file (outside the workspace) where the stat cache is kept between
        calls; or pass a StatCache object to keep it in memory (it is updated in place).
        `feed`: the workspace's ChangeFeed, if this process keeps one (see the module docstring).
        `borrow` (without a feed): use the journal of another process's feed of the workspace
        (journal.py) when there is a trusted one; the cache file is then left as it is.
        """
        started = time.perf_counter()
        workspace = Path(workspace)
        self.check_outside(workspace, cache_path)
        lent = None
        if borrow and feed is None and cache is None and cache_path is not None:
            lent = self.borrowed(cache_path)
        if lent is not None:
            cache, plan, _ = lent
        else:
            if cache is None:
                cache = load_cache(cache_path)
            plan = self.plan(workspace, feed, cache)
        with self.blobs.lock():
            scan = self.scan(workspace, cache, cache_path, store=True, plan=plan)
        if lent is None:
            keep_cache(cache, scan.new, cache_path)
            if feed is not None:
                feed.settle(cache)
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
            incremental=scan.incremental,
            listed_dirs=scan.listed,
            borrowed=lent is not None,
        )

    @staticmethod
    def plan(workspace: Path, feed: ChangeFeed | None, cache: StatCache) -> ScanPlan | None:
        """What an incremental scan should look at, when `feed` is trusted for `cache`; else None
        (scan everything). Takes the feed's changes either way (the scan that follows, whole or
        not, is the next baseline once the caller settles the feed)."""
        if feed is None:
            return None
        if feed.workspace != Path(os.path.realpath(workspace)):
            raise ValueError(f"the change feed watches {feed.workspace}, not {workspace}")
        changes = feed.take()
        if not changes.trusted_for(cache):
            return None
        listed, deep = changes.keys()
        return ScanPlan(listed, deep, cache.dirs)

    def borrowed(
        self, cache_path: Path, *, workspace: Path | None = None
    ) -> tuple[StatCache, ScanPlan, ScanState | None] | None:
        """The cache file's records (parsed on demand) and what changed since, from the journal
        of the feed another process keeps of the workspace; None when there is no trusted one.
        With `workspace`, the scan a restore makes of it (store=False, its trees kept), made
        while the journal's publisher answers: the third value, None when the answer named
        other folders (the caller scans with the plan then)."""
        meanwhile = None
        if workspace is not None:

            def meanwhile(cache: StatCache, listed: set[str], deep: set[str]) -> ScanState:
                plan = ScanPlan(listed, deep, cache.dirs)
                return self.scan(
                    workspace, cache, cache_path, store=False, keep_trees=True, plan=plan
                )

        for _ in range(3):
            lent = journal.borrow(Path(cache_path), load=True, meanwhile=meanwhile)
            if lent is None:
                return None
            if lent.cache is not None:
                plan = ScanPlan(lent.listed, lent.deep, lent.cache.dirs)
                return lent.cache, plan, lent.meanwhile
            # The worker rewrote the cache file meanwhile (its own checkpoint): ask again.
        return None

    def check_outside(self, workspace: Path, cache_path: Path | None) -> None:
        """Either inside the workspace would change with every checkpoint (and be checkpointed).
        A pair of paths that passed is not resolved again (one lstat per part of each path, a
        noticeable share of a small rewind): they are the harness's own folders."""
        pair = (os.fspath(workspace), None if cache_path is None else os.fspath(cache_path))
        if pair in self._outside:
            return
        ws = workspace.resolve()
        for other, what in ((self.blobs.root, "blob store"), (cache_path, "stat cache")):
            if other is not None and Path(other).resolve().is_relative_to(ws):
                raise ValueError(f"the {what} ({other}) must be outside the workspace ({ws})")
        if len(self._outside) >= 1024:
            self._outside.clear()
        self._outside.add(pair)

    def scan(
        self,
        workspace: Path,
        cache: StatCache,
        cache_path: Path | None,
        *,
        store: bool,
        live_paths: bool = False,
        keep_trees: bool = False,
        plan: ScanPlan | None = None,
    ) -> ScanState:
        """Scan `workspace` against `cache` (not changed: the new records are in the result's
        `new`); with store=True, as a checkpoint, everything it names durably stored. With a
        `plan`, only the folders it names are looked at (see the module docstring)."""
        if plan is not None and (live_paths or "" not in cache.dirs):
            plan = None
        root = os.fsencode(workspace)
        old = cache.dirs
        while True:
            try:
                return self._scan_once(root, old, cache_path, store, live_paths, keep_trees, plan)
            except RescanFolder as r:
                # Read that folder's files again instead of trusting its record (and, in an
                # incremental scan, look at everything: the record was reached unlisted).
                old = {k: v for k, v in old.items() if k != r.key}
                plan = None

    def _scan_once(
        self,
        root: bytes,
        old: dict[str, FolderRecord],
        cache_path: Path | None,
        store: bool,
        live_paths: bool,
        keep_trees: bool,
        plan: ScanPlan | None,
    ) -> ScanState:
        quiet = plan is not None and not plan.visit
        if quiet:
            # Nothing reported and nothing to check again: the cached top record is the tree.
            scan = ScanState(old, 0, live_paths, len(root) + 1, keep_trees)
            scan.new = old.copy()
            top = pinned(root, "", old[""])
        else:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if isinstance(old, lazy.LazyDirs):
                    # A borrowed cache's records are never written back (journal.py): none of
                    # this scan's is kept, so no clock is needed to say which could be.
                    trusted = 0
                else:
                    probes = [self.blobs.root] if self.blobs.root is not None else []
                    if cache_path is not None:
                        probes.insert(0, Path(cache_path).parent)
                    trusted = fs_clock(st.st_dev, probes, create=store)
                scan = ScanState(old, trusted, live_paths, len(root) + 1, keep_trees or live_paths)
                if plan is None:
                    top = walk(fd, root, "", scan)
                else:
                    scan.new = old.copy()
                    top = walk_changed(fd, root, "", scan, plan)
            finally:
                os.close(fd)
        scan.incremental = plan is not None
        if scan.gone:
            _drop(scan.new, scan.gone)
        if store:
            scan.batch = self.blobs.batch(workers=self.hasher.workers)
        try:
            self.hasher.hash_pending(scan)
            build(top, scan)
            scan.root = top.rec.tree
            scan.files, scan.bytes_total, scan.dirs, scan.links = top.rec.totals
            if plan is not None and scan.keep_trees:
                if isinstance(scan.new, lazy.LazyDirs):
                    # A borrowed cache: look records up by digest only when asked.
                    scan.trees = lazy.TreesOf(scan.new, scan.trees)
                    scan.counts = lazy.CountsOf(scan.trees)
                elif isinstance(scan.new, Records):
                    # The index its copies share (what it set is in it already, and an entry
                    # is never wrong: a digest names its content).
                    scan.trees = scan.new.tree_index()
                    scan.counts = lazy.CountsOf(scan.trees)
                else:
                    for rec in scan.new.values():
                        scan.trees.setdefault(rec.tree, rec)
                        scan.counts.setdefault(rec.tree, rec.totals[0])
            if store:
                self._store(top, scan)
        except BaseException:
            if scan.batch is not None:
                scan.batch.abort()
            raise
        return scan

    def _store(self, top: ScannedFolder, scan: ScanState) -> None:
        """Make the scanned checkpoint durable: the file blobs written while hashing (or again by
        _plan_store), then the trees not stored yet, children before parents, all in one batch
        (blobstore.Batch: durable, then named in that order); trees found already stored get
        their mtime refreshed (see maintenance.py on prune)."""
        batch = scan.batch
        if batch.exists(scan.root, ask=_ask(top)):
            # A stored tree implies its whole subtree is stored: nothing below to check.
            scan.freshen.append(scan.root)
        else:
            self._plan_store(top, scan)
        for data in scan.new_trees:
            _, added = batch.add(data, ordered=True)
            if added:
                scan.blobs_added += 1
                scan.bytes_added += len(data)
        batch.commit()
        for digest in scan.freshen:
            with contextlib.suppress(FileNotFoundError):
                self.blobs.touch(digest)

    def _plan_store(self, d: ScannedFolder, scan: ScanState) -> None:
        """For a folder whose tree is not stored: make sure every blob it names is, then queue
        its tree after those of its sub-folders (children first)."""
        rec = d.rec
        batch = scan.batch
        for i, s in enumerate(rec.sig):
            if not stat.S_ISREG(s[0]) or i in d.fresh or rec.vals[i] is None:
                continue
            digest = rec.vals[i]
            if batch.exists(digest):
                continue
            # A cached digest whose blob is gone (a prune removed content that was never part of
            # a kept checkpoint): store the file again.
            path = d.path + b"/" + os.fsencode(rec.names[i])
            try:
                # Its stat through no link (a folder on the way may have become one).
                fd = open_beneath(path[: scan.strip - 1], path[scan.strip :])
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                result = self.hasher.read(PendingFile(d, i, path, st), batch, scan.strip)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
                    raise
                result = None
            if result is None or result[0] != digest:
                raise RescanFolder(d.key)
            if result[2]:
                scan.blobs_added += 1
                scan.bytes_added += result[1]
        if d.pinned and rec.subdirs and not d.children:
            d.children = _pinned_children(d, scan)
        for _, child in d.children:
            if batch.exists(child.rec.tree, ask=_ask(child)):
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


def _ask(d: ScannedFolder) -> bool:
    """Whether to ask the store for the tree of `d` before storing it: not for a folder this
    scan rebuilt because it changed since the stat cache's record (its new tree is almost never
    stored; storing it again is harmless, and with an S3 store each question is a round trip on
    the changed path). A folder the cache did not know is asked about: it may be a whole stored
    tree (a restore without its cache), which spares looking at everything under it."""
    return d.data is None or d.old is None


def _pinned_children(d: ScannedFolder, scan: ScanState) -> list[tuple[int, ScannedFolder]]:
    """The sub-folders of a pinned folder, pinned too (their records are in `scan.new`)."""
    children = []
    for i in d.rec.subdirs:
        key = join_key(d.key, d.rec.keys[i])
        rec = scan.new.get(key)
        if rec is None or rec.tree != d.rec.vals[i]:
            raise RescanFolder(d.key)  # the records disagree: look at the folder for real
        children.append((i, pinned(d.path + b"/" + os.fsencode(d.rec.names[i]), key, rec)))
    return children


def _drop(records: dict[str, FolderRecord], gone: set[str]) -> None:
    """Remove the records of folders `gone` and of every folder below them."""
    prefixes = tuple(key + "/" for key in gone)
    for key in [k for k in records if k in gone or k.startswith(prefixes)]:
        del records[key]


def fs_clock(dev: int, folders: list[Path], *, create: bool) -> int:
    """Files with timestamps before the returned ns value can be cached safely."""
    for folder in folders:
        try:
            if create:
                folder.mkdir(parents=True, exist_ok=True)
            if os.stat(folder).st_dev != dev:
                continue
            # A file's mtime set to now is the filesystem's own "now" (its clock, at its own
            # granularity: a server's, over NFS), as a new file's would be. The file is kept
            # open: making one each time cost 0.2 ms after the process had slept.
            now = _clock_now(folder, dev)
        except OSError:
            continue
        if now is not None:
            return now
    return time.time_ns() - RACY_FALLBACK_NS


_CLOCKS: dict[Path, int] = {}  # folder -> this process's descriptor of its ".clock" file
_CLOCKS_LOCK = threading.Lock()  # held while a descriptor is used: none is closed under a user


def _clock_now(folder: Path, dev: int) -> int | None:
    """The mtime of `folder`'s ".clock" file set to now, if it is on device `dev`."""
    with _CLOCKS_LOCK:
        for fresh in (False, True):
            fd = _CLOCKS.get(folder)
            if fd is not None and fresh:
                os.close(_CLOCKS.pop(folder))
                fd = None
            if fd is None:
                if len(_CLOCKS) >= 64:
                    for old in _CLOCKS.values():
                        os.close(old)
                    _CLOCKS.clear()
                fd = os.open(folder / ".clock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                _CLOCKS[folder] = fd
            os.utime(fd)
            st = os.fstat(fd)
            if st.st_dev == dev:
                return st.st_mtime_ns
            # (A folder made again on another filesystem since: its file is opened again.)
    return None
