"""Restore: make a workspace exactly a checkpoint (rewind), or create one from it (fork).

The live workspace is scanned first (no blobs stored, its trees kept by digest), so only subtrees
whose digests differ are compared and only what differs is touched. With a trusted change feed
(feed.py) that scan looks only at the folders reported changed since the last checkpoint, so a
rewind costs about what it writes. Nothing else should write to the workspace during a restore.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agents.blobstore import BlobStoreBackend
from agents.snapshots.cache import FolderRecord, StatCache, cache_key, keep_cache, load_cache
from agents.snapshots.errors import CorruptBlob, MissingBlob
from agents.snapshots.feed import ChangeFeed
from agents.snapshots.hashing import CHUNK
from agents.snapshots.names import decode_name, join_path, to_str
from agents.snapshots.results import RestoreResult
from agents.snapshots.scan import Scanner
from agents.snapshots.trees import TreeReader


class Restorer:
    """Restores checkpoints into workspaces, scanning what is there first."""

    def __init__(self, blobs: BlobStoreBackend, trees: TreeReader, scanner: Scanner):
        self.blobs = blobs
        self.trees = trees
        self.scanner = scanner

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

        Only what differs is touched: extra paths are removed (links are removed, never
        followed), missing or different files written (to a temp file renamed into place, so
        nothing is ever written through a link), modes set. Every tree and blob needed is
        checked to exist before the first change, so a store missing one fails before touching
        anything (a blob whose content is damaged is caught while it is copied). `feed`: the
        workspace's ChangeFeed, if this process keeps one (the scan of what is there is then
        incremental when the feed is trusted). `borrow` (without a feed): use the journal of
        another process's feed (journal.py) when there is a trusted one; the cache file is then
        left as it is (that feed sees what the restore writes).
        """
        started = time.perf_counter()
        workspace = Path(workspace)
        self.scanner.check_outside(workspace, cache_path)
        lent = None
        if borrow and feed is None and cache is None and cache_path is not None:
            # The workspace is scanned while the watching worker answers (journal.borrow).
            lent = self.scanner.borrowed(cache_path, workspace=workspace)
        scanned = None
        if lent is not None:
            cache, scan_plan, scanned = lent
        else:
            if cache is None:
                cache = load_cache(cache_path)
            scan_plan = self.scanner.plan(workspace, feed, cache) if feed is not None else None
        with self.blobs.lock():
            current = scanned
            if current is None and os.path.isdir(workspace):
                current = self.scanner.scan(
                    workspace, cache, cache_path, store=False, keep_trees=True, plan=scan_plan
                )
            plan = RestorePlan()
            extra = current.trees if current else {}
            counts = current.counts if current else {}
            if self.blobs.remote:
                self.trees.warm(tree, extra, self.blobs.workers)
            self._plan(b"", tree, current.root if current else None, extra, counts, plan)
            # A store that has to fetch blobs over the network gets them all at once first.
            with self._fetched(tree, [] if dry_run else plan.blobs):
                # (What a remote store fetched is there: no need to ask about each again.)
                for digest in plan.blobs if dry_run or not self.blobs.remote else ():
                    if not self.blobs.exists(digest):
                        raise MissingBlob(
                            f"blob {digest} needed by tree {tree} is not in the store"
                        )
                if not dry_run:
                    if current is None:  # no workspace yet (a fork)
                        workspace.mkdir(parents=True, exist_ok=True)
                    self._apply(os.fsencode(workspace), plan.ops)
        if current is not None and lent is None:
            new = current.new
            if not dry_run:
                # What was written is new (new inodes, fresh timestamps) and would not match its
                # record anyway; say so explicitly, per folder.
                touched: dict[str, set[str]] = {}
                for op in plan.ops:
                    folder, name = cache_key(op[1])
                    touched.setdefault(folder, set()).add(name)
                for folder, names in touched.items():
                    rec = new.get(folder)
                    if rec is not None:
                        new[folder] = rec.with_stale(
                            i for i, k in enumerate(rec.keys) if k in names
                        )
            # The records describe the workspace (a dry run's as it is): keep them, so a change
            # feed's changes taken for this scan are accounted for.
            keep_cache(cache, new, cache_path)
            if feed is not None:
                feed.settle(cache)
        return RestoreResult(
            written=plan.count["write"],
            removed=plan.count["rm"],
            unchanged=plan.unchanged,
            links=plan.count["link"],
            dirs_created=plan.count["mkdir"],
            modes_set=plan.count["chmod"],
            seconds=time.perf_counter() - started,
            dry_run=dry_run,
            actions=[(op[0], to_str(op[1])) for op in plan.ops],
            incremental=current is not None and current.incremental,
        )

    def _plan(
        self,
        rel: bytes,
        target: str,
        current: str | None,
        extra: dict[str, FolderRecord],
        counts: dict[str, int],
        plan: RestorePlan,
    ) -> None:
        """Add to `plan` what turns tree `current` (None: nothing there) at `rel` into `target`;
        trees whose digests are equal are left alone, their files counted as unchanged."""
        if target == current:
            plan.unchanged += counts.get(current, 0)
            return
        want = self.trees.get(target, extra)
        have = self.trees.get(current, extra) if current else {}
        for key in sorted(have.keys() - want.keys(), key=decode_name):
            plan.add("rm", join_path(rel, decode_name(key)))
        # Entries equal on both sides are what they should be (a folder's digest names all it
        # holds): counted, never looked at again. A rewind after a tool call differs from what
        # is there in one entry per folder on the changed paths.
        differ = []
        for key, w in want.items():
            if w != have.get(key):
                differ.append(key)
            elif w["t"] == "f":
                plan.unchanged += 1
            elif w["t"] == "d":
                plan.unchanged += counts.get(w["h"], 0)
        for key in sorted(differ, key=decode_name):
            w, h = want[key], have.get(key)
            path = join_path(rel, decode_name(key))
            if w["t"] == "d":
                if h is not None and h["t"] == "d":
                    self._plan(path, w["h"], h["h"], extra, counts, plan)
                    if h["m"] != w["m"]:
                        plan.add("chmod", path, w["m"])
                else:
                    if h is not None:
                        plan.add("rm", path)
                    plan.add("mkdir", path)
                    self._plan(path, w["h"], None, extra, counts, plan)
                    # Last, so a read-only folder is filled before it becomes read-only.
                    plan.add("mode", path, w["m"])
            elif w["t"] == "f":
                if h is not None and h["t"] == "f" and h["h"] == w["h"]:
                    plan.unchanged += 1
                    if h["m"] != w["m"]:
                        plan.add("chmod", path, w["m"])
                else:
                    if h is not None and h["t"] == "d":
                        plan.add("rm", path)
                    plan.add("write", path, w["h"], w["m"], w.get("s"))
                    plan.blobs.add(w["h"])
            elif h is None or h["t"] != "l" or h["target"] != w["target"]:
                if h is not None:
                    plan.add("rm", path)
                plan.add("link", path, decode_name(w["target"]))

    def _apply(self, root: bytes, ops: list[tuple]) -> None:
        opened: dict[bytes, int] = {}  # folders made writable for the restore -> original mode
        checked: set[bytes] = set()
        for op in ops:
            kind, path = op[0], root + b"/" + op[1]
            self._writable(os.path.dirname(path), checked, opened)
            if kind == "rm":
                remove_tree(path)
            elif kind == "mkdir":
                os.mkdir(path, 0o700)
                checked.add(path)
            elif kind == "write":
                self._write_file(path, op[2], op[3], op[4])
            elif kind == "link":
                os.symlink(op[2], path)
            elif kind in ("chmod", "mode"):
                if not os.path.islink(path):
                    os.chmod(path, op[2])
                opened.pop(path, None)
        for folder, mode in opened.items():
            with contextlib.suppress(FileNotFoundError):
                os.chmod(folder, mode)

    @contextlib.contextmanager
    def _fetched(self, tree: str, digests: Iterable[str]) -> Iterator[None]:
        entered = False
        try:
            with self.blobs.prefetched(digests):
                entered = True
                yield
        except FileNotFoundError as e:
            if entered:
                raise
            raise MissingBlob(f"{e} (needed by tree {tree})") from None

    @staticmethod
    def _writable(folder: bytes, checked: set[bytes], opened: dict[bytes, int]) -> None:
        if folder in checked:
            return
        checked.add(folder)
        mode = stat.S_IMODE(os.lstat(folder).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(folder, mode | 0o700)
            opened[folder] = mode

    def _write_file(self, path: bytes, digest: str, mode: int, size: int | None) -> None:
        """The blob's content written to a temp file beside `path`, checked against its digest
        while copied, then renamed over `path`. A small blob (what a tool call edits, mostly)
        is read whole and written from plain descriptors: each system call is dear in a process
        that sat idle, and buffered file objects make twice as many."""
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=b".shiftlog-restore-")
        try:
            try:
                if size is not None and size <= CHUNK:
                    data = self.blobs.get(digest)
                    _write_all(fd, data)
                    actual = hashlib.sha256(data).hexdigest()
                else:
                    with self.blobs.open(digest) as src:
                        h = hashlib.sha256()
                        while chunk := src.read(CHUNK):
                            h.update(chunk)
                            _write_all(fd, chunk)
                    actual = h.hexdigest()
                if actual != digest:
                    raise CorruptBlob(f"blob {digest} does not match its digest")
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class RestorePlan:
    """What a restore will do, in order: `ops` of (kind, workspace-relative path, *args), where
    kind is rm | mkdir | write (digest, mode, size or None) | link (raw target) | chmod | mode
    (mode), the latter being a new folder's mode, set once it is filled; `blobs` the file blobs
    it needs."""

    def __init__(self):
        self.ops: list[tuple] = []
        self.blobs: set[str] = set()
        self.unchanged = 0
        self.count = dict.fromkeys(("rm", "mkdir", "mode", "write", "link", "chmod"), 0)

    def add(self, kind: str, path: bytes, *args: Any) -> None:
        self.ops.append((kind, path, *args))
        self.count[kind] += 1


def remove_tree(path: bytes) -> None:
    """Remove a file, link or folder tree without ever following a link."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)
    with os.scandir(path) as it:
        items = list(it)
    for item in items:
        if item.is_dir(follow_symlinks=False):
            remove_tree(item.path)
        else:
            os.unlink(item.path)
    os.rmdir(path)
