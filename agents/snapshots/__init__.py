"""Checkpoints of a run's workspace: git-like Merkle trees in the content-addressed BlobStore.

Pure Python (no Django): give it a BlobStore with an explicit root.

    snaps = Snapshots(BlobStore(root))
    res = snaps.snapshot(workspace, cache_path=meta / "stat-cache.json")  # res.tree identifies it
    snaps.restore(res.tree, workspace, cache_path=...)   # rewind: the workspace becomes that tree
    snaps.restore(res.tree, new_workspace)               # fork: same, into another (new) folder
    snaps.diff(old_tree, new_tree)                       # or diff(old_tree, workspace_path)
    snaps.files(tree); snaps.read(tree, "src/app.py")
    snaps.referenced_blobs(trees); snaps.verify(trees); snaps.prune(keep_trees, keep_blobs)

Format. A directory is a tree blob: the line b"shiftlog-tree 1\\n" followed by canonical JSON
(sorted keys, compact, UTF-8) of {name: entry}, where an entry is
    {"t": "f", "h": <content blob>, "m": <st_mode & 0o7777>, "s": <size>}   regular file
    {"t": "d", "h": <child tree blob>, "m": <mode>}                         directory
    {"t": "l", "target": <link target, encoded like a name>}                symlink (never followed)
A name (or link target) that is valid UTF-8 is stored as itself; any other byte string, and any
name that itself starts with "b64:", as "b64:" + urlsafe base64 of the raw bytes, so every name
round-trips byte for byte. A checkpoint is its root tree's digest; empty folders are empty trees.
The magic line lets maintenance code tell trees from file contents without any other index.

Paths handed out (Entry.path, Change.path) are "/"-joined and decoded as UTF-8 with
surrogateescape, so `path.encode("utf-8", "surrogateescape")` gives the exact bytes back;
`display()` makes one printable. Methods taking a path accept that str or the raw bytes.

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

Prune and concurrency. snapshot/restore/diff/verify hold the store's shared lock, prune the
exclusive one. A tree found already stored during a checkpoint has its mtime refreshed, and prune
keeps everything reachable from trees newer than its grace period, so a checkpoint whose tree has
not yet been recorded by the caller survives a prune for that long.

Not kept: owners, timestamps, extended attributes, hard links (each path gets its own copy);
sockets, FIFOs and devices are skipped (listed in SnapshotResult.skipped). The workspace's own
permissions are not part of the tree. Nothing else should write to the workspace during a
restore. POSIX only (bytes paths, fcntl locks).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agents.blobstore import BlobStore
from agents.snapshots.cache import (
    FolderRecord,
    StatCache,
    cache_key,
    join_key,
    keep_cache,
    load_cache,
)
from agents.snapshots.errors import CorruptBlob, MissingBlob, SnapshotError
from agents.snapshots.hashing import CHUNK, hash_stream
from agents.snapshots.names import (
    decode_name,
    display,
    encode_name,
    join_path,
    to_str,
)
from agents.snapshots.results import (
    Change,
    Entry,
    PruneResult,
    RestoreResult,
    SnapshotResult,
)
from agents.snapshots.trees import (
    TREE_MAGIC,
    TreeReader,
    entries_of,
    parse_tree,
    tree_bytes,
)

RACY_FALLBACK_NS = 2_000_000_000
TEXT_DIFF_MAX_INPUT = 1 << 20
# Below this many files to read, a thread pool costs more than it saves.
_PARALLEL_MIN_FILES = 64

# -- scanning a workspace ----------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Dir:
    """A folder during a scan. `fast`: its names and stats equal its cached record `old`, so
    (once its sub-folders' digests are known to be unchanged too) that record is reused as is."""

    __slots__ = (
        "children",
        "data",
        "fast",
        "fresh",
        "key",
        "keys",
        "names",
        "old",
        "path",
        "rec",
        "sig",
        "stale",
        "vals",
    )

    def __init__(self, path: bytes, key: str, old: FolderRecord | None):
        self.path = path
        self.key = key  # the folder's key in the StatCache
        self.old = old
        self.fast = False
        self.names: list[str] = []
        self.keys: list[str] = []
        self.sig: list[tuple[int, int, int, int, int]] = []
        self.vals: list[str | None] = []
        self.stale: list[int] = []
        self.fresh: set[int] = set()  # entries read (and stored) by this scan
        self.children: list[tuple[int, _Dir]] = []
        self.rec: FolderRecord | None = (
            None  # the record after the scan (`old` itself when unchanged)
        )
        self.data: bytes | None = None  # the tree blob, when it was built by this scan


class _File:
    __slots__ = ("d", "i", "path", "st")

    def __init__(self, d: _Dir, i: int, path: bytes, st: os.stat_result):
        self.d = d
        self.i = i
        self.path = path
        self.st = st


class _Retry(Exception):
    """A cached digest's blob is missing and the file no longer has that content."""

    def __init__(self, key: str):
        self.key = key


class _Scan:
    def __init__(
        self, old: dict[str, FolderRecord], trusted_before: int, live_paths: bool, strip: int
    ):
        self.old = old
        self.new: dict[str, FolderRecord] = {}
        self.trusted_before = trusted_before
        self.strip = strip
        self.pending: list[_File] = []
        self.skipped: list[str] = []
        self.live_paths = live_paths  # diffs read live files: remember where each digest was
        self.keep_trees = False  # restore and diff look at the live trees: keep them by digest
        self.trees: dict[str, FolderRecord] = {}  # digest -> record, for every folder seen
        self.counts: dict[str, int] = {}  # tree digest -> files under it
        self.live: dict[str, bytes] = {}  # file digest -> a path with that content
        self.new_trees: list[bytes] = []  # tree blobs to write, children first
        self.freshen: list[str] = []
        self.root = ""
        self.files = self.dirs = self.links = self.bytes_total = 0
        self.hashed = self.blobs_added = self.bytes_added = 0


def _is_text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _open_dir(fd: int, name: str) -> int | None:
    """A descriptor for sub-folder `name` of `fd`, or None when it is gone or no longer a folder."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link since it was listed
            return None
        raise


class Snapshots:
    def __init__(self, blobs: BlobStore, *, workers: int | None = None):
        self.blobs = blobs
        # Reading and hashing release the GIL, so a few threads overlap the I/O and fsyncs of a
        # first checkpoint.
        self.workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        self._trees = TreeReader(blobs)

    # -- snapshot ------------------------------------------------------------------------------

    def snapshot(
        self, workspace: Path, *, cache_path: Path | None = None, cache: StatCache | None = None
    ) -> SnapshotResult:
        """Checkpoint `workspace`; returns once every blob of the checkpoint is durably stored.

        `cache_path` is a file (outside the workspace) where the stat cache is kept between
        calls; or pass a StatCache object to keep it in memory (it is updated in place).
        """
        started = time.perf_counter()
        workspace = Path(workspace)
        self._check_outside(workspace, cache_path)
        if cache is None:
            cache = load_cache(cache_path)
        with self.blobs.lock():
            scan = self._scan(workspace, cache, cache_path, store=True)
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

    def _check_outside(self, workspace: Path, cache_path: Path | None) -> None:
        # Either inside the workspace would change with every checkpoint (and be checkpointed).
        ws = workspace.resolve()
        for other, what in ((self.blobs.root, "blob store"), (cache_path, "stat cache")):
            if other is not None and Path(other).resolve().is_relative_to(ws):
                raise ValueError(f"the {what} ({other}) must be outside the workspace ({ws})")

    def _scan(
        self,
        workspace: Path,
        cache: StatCache,
        cache_path: Path | None,
        *,
        store: bool,
        live_paths: bool = False,
        keep_trees: bool = False,
    ) -> _Scan:
        root = os.fsencode(workspace)
        old = cache.dirs
        while True:
            try:
                return self._scan_once(root, old, cache_path, store, live_paths, keep_trees)
            except _Retry as r:
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
    ) -> _Scan:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            probes = [self.blobs.root]
            if cache_path is not None:
                probes.insert(0, Path(cache_path).parent)
            trusted = self._fs_clock(st.st_dev, probes, create=store)
            scan = _Scan(old, trusted, live_paths, len(root) + 1)
            scan.keep_trees = keep_trees or live_paths
            top = self._walk(fd, root, "", scan)
        finally:
            os.close(fd)
        self._hash_all(scan, store)
        self._build(top, scan)
        scan.root = top.rec.tree
        scan.files, scan.bytes_total, scan.dirs, scan.links = top.rec.totals
        if store:
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
        return scan

    @staticmethod
    def _fs_clock(dev: int, folders: list[Path], *, create: bool) -> int:
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

    def _walk(self, fd: int, path: bytes, dkey: str, scan: _Scan) -> _Dir:
        # The hot loop of a checkpoint: one stat per entry and, for a folder whose names and
        # stats all equal its record, nothing else per entry.
        with os.scandir(fd) as it:
            items = list(it)
        names = [e.name for e in items]
        try:
            sts = [e.stat(follow_symlinks=False) for e in items]
        except FileNotFoundError:
            sts = None
        old = scan.old.get(dkey)
        d = _Dir(path, dkey, old)
        if sts is None:
            # Something vanished while listing: keep what is still there.
            kept = []
            for e in items:
                with contextlib.suppress(FileNotFoundError):
                    kept.append((e.name, e.stat(follow_symlinks=False)))
            names = [n for n, _ in kept]
            sts = [s for _, s in kept]
        sig = [(s.st_mode, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for s in sts]
        if old is not None and not old.stale and old.sig == sig and old.names == names:
            d.fast = True
            d.names, d.keys, d.sig, d.vals = old.names, old.keys, old.sig, old.vals
            subs = old.subdirs
        else:
            subs = self._compare(d, fd, names, sts, sig, scan)
        for i in subs:
            name = d.names[i]
            sub = _open_dir(fd, name)
            if sub is None:
                if d.fast:
                    d.fast = False
                    d.vals = list(d.vals)
                d.vals[i] = None
                d.stale.append(i)
                continue
            try:
                child = self._walk(
                    sub, path + b"/" + os.fsencode(name), join_key(dkey, d.keys[i]), scan
                )
            finally:
                os.close(sub)
            d.children.append((i, child))
        return d

    def _compare(
        self,
        d: _Dir,
        fd: int,
        names: list[str],
        sts: list[os.stat_result],
        sig: list[tuple[int, int, int, int, int]],
        scan: _Scan,
    ) -> list[int]:
        """Fill a changed folder entry by entry, reusing what its record still vouches for;
        returns the indexes of its sub-folders."""
        old = d.old
        index: dict[str, int] = {}
        old_stale: tuple[int, ...] = ()
        if old is not None:
            index = {n: j for j, n in enumerate(old.names)}
            old_stale = old.stale
        d.names, d.sig = names, sig
        keys, vals, stale = d.keys, d.vals, d.stale
        subs = []
        for i, name in enumerate(names):
            raw = os.fsencode(name)
            keys.append(encode_name(raw))
            s = sig[i]
            j = index.get(name)
            same = j is not None and old.sig[j] == s and j not in old_stale
            fmt = stat.S_IFMT(s[0])
            if fmt == stat.S_IFREG:
                if same:
                    vals.append(old.vals[j])
                else:
                    vals.append(None)
                    scan.pending.append(_File(d, i, d.path + b"/" + raw, sts[i]))
            elif fmt == stat.S_IFDIR:
                vals.append(None)  # its tree digest, once built
                subs.append(i)
            elif fmt == stat.S_IFLNK:
                if same:
                    vals.append(old.vals[j])
                    continue
                try:
                    target = os.readlink(raw, dir_fd=fd)
                except (FileNotFoundError, OSError):
                    vals.append(None)
                    stale.append(i)
                    continue
                vals.append(encode_name(target))
                # A link replaced within one timestamp tick could keep its stat: like files,
                # trust the target only once its timestamps are in the past.
                if max(s[2], s[3]) >= scan.trusted_before:
                    stale.append(i)
            else:
                vals.append(None)
                stale.append(i)
                scan.skipped.append(to_str((d.path + b"/" + raw)[scan.strip :]))
        return subs

    def _hash_all(self, scan: _Scan, store: bool) -> None:
        pending, scan.pending = scan.pending, []
        if len(pending) >= _PARALLEL_MIN_FILES and self.workers > 1:
            with ThreadPoolExecutor(self.workers) as pool:
                results = list(pool.map(lambda f: self._read(f, store), pending))
        else:
            results = [self._read(f, store) for f in pending]
        for f, result in zip(pending, results, strict=True):
            self._record(scan, f, result)

    def _read(self, f: _File, store: bool) -> tuple[str, int, bool, os.stat_result] | None:
        try:
            fd = os.open(f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            # Gone, or replaced by a link, since the folder was listed: leave it out.
            if e.errno in (errno.ENOENT, errno.ELOOP):
                return None
            raise
        with open(fd, "rb", buffering=0) as fh:
            if store:
                digest, size, added = self.blobs.add_file(fh)
            else:
                digest, size = hash_stream(fh)
                added = False
            return digest, size, added, os.fstat(fd)

    def _record(self, scan: _Scan, f: _File, result: tuple | None) -> None:
        d, i, st = f.d, f.i, f.st
        if result is None:
            d.vals[i] = None
            d.stale.append(i)
            return
        digest, size, added, after = result
        d.vals[i] = digest
        d.fresh.add(i)
        scan.hashed += 1
        if scan.live_paths:
            scan.live[digest] = f.path
        if added:
            scan.blobs_added += 1
            scan.bytes_added += size
        stable = (
            after.st_size == size
            and after.st_mtime_ns == st.st_mtime_ns
            and after.st_ctime_ns == st.st_ctime_ns
            and after.st_ino == st.st_ino
        )
        if not stable or max(after.st_mtime_ns, after.st_ctime_ns) >= scan.trusted_before:
            d.stale.append(i)
            if size != st.st_size:
                # The entry records the size that was read; the stat is not trusted anyway.
                d.sig[i] = (st.st_mode, size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def _build(self, d: _Dir, scan: _Scan) -> None:
        """Digest of folder `d` and its new record, children first."""
        for _, child in d.children:
            self._build(child, scan)
        old = d.old
        if d.fast and all(child.rec.tree == old.vals[i] for i, child in d.children):
            rec = old
        else:
            vals = list(d.vals) if d.fast else d.vals
            below = [0, 0, len(d.children), 0]
            for i, child in d.children:
                vals[i] = child.rec.tree
                for n, x in enumerate(child.rec.totals):
                    below[n] += x
            entries = entries_of(d.keys, d.sig, vals)
            files = links = size = 0
            for e in entries.values():
                t = e["t"]
                if t == "f":
                    files += 1
                    size += e["s"]
                elif t == "l":
                    links += 1
            totals = (below[0] + files, below[1] + size, below[2], below[3] + links)
            d.data = tree_bytes(entries)
            digest = hashlib.sha256(d.data).hexdigest()
            rec = FolderRecord(
                d.names, d.keys, d.sig, vals, tuple(sorted(set(d.stale))), digest, totals, entries
            )
            if (
                old is not None
                and rec.tree == old.tree
                and rec.stale == old.stale
                and rec.sig == old.sig
                and rec.keys == old.keys
                and rec.vals == old.vals
            ):
                rec = old
        d.rec = rec
        scan.new[d.key] = rec
        if scan.keep_trees:
            scan.trees[rec.tree] = rec
            scan.counts[rec.tree] = rec.totals[0]
        if scan.live_paths:
            for i, s in enumerate(rec.sig):
                if stat.S_ISREG(s[0]) and rec.vals[i] is not None and i not in d.fresh:
                    scan.live.setdefault(rec.vals[i], d.path + b"/" + os.fsencode(rec.names[i]))

    def _plan_store(self, d: _Dir, scan: _Scan) -> None:
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
                f = _File(d, i, path, os.lstat(path))
                result = self._read(f, True)
            except FileNotFoundError:
                result = None
            if result is None or result[0] != digest:
                raise _Retry(d.key)
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
                raise _Retry(d.key)
        scan.new_trees.append(data)

    # -- reading trees -------------------------------------------------------------------------

    def files(self, tree: str) -> dict[str, Entry]:
        """Every path in the checkpoint (folders included) -> its entry."""
        return self._trees.files(tree)

    def read(self, tree: str, path: str | bytes) -> bytes:
        """Content of the file at `path` in the checkpoint."""
        return self._trees.read(tree, path)

    # -- restore -------------------------------------------------------------------------------

    def restore(
        self,
        tree: str,
        workspace: Path,
        *,
        cache_path: Path | None = None,
        cache: StatCache | None = None,
        dry_run: bool = False,
    ) -> RestoreResult:
        """Make `workspace` exactly checkpoint `tree` (creating it if needed).

        Only what differs is touched: extra paths are removed (links are removed, never
        followed), missing or different files written (to a temp file renamed into place, so
        nothing is ever written through a link), modes set. Every tree and blob needed is
        checked to exist before the first change, so a store missing one fails before touching
        anything (a blob whose content is damaged is caught while it is copied).
        """
        started = time.perf_counter()
        workspace = Path(workspace)
        self._check_outside(workspace, cache_path)
        if cache is None:
            cache = load_cache(cache_path)
        with self.blobs.lock():
            current = None
            if os.path.isdir(workspace):
                current = self._scan(workspace, cache, cache_path, store=False, keep_trees=True)
            plan = _Plan()
            extra = current.trees if current else {}
            counts = current.counts if current else {}
            self._plan(b"", tree, current.root if current else None, extra, counts, plan)
            for digest in plan.blobs:
                if not self.blobs.exists(digest):
                    raise MissingBlob(f"blob {digest} needed by tree {tree} is not in the store")
            if not dry_run:
                workspace.mkdir(parents=True, exist_ok=True)
                self._apply(os.fsencode(workspace), plan.ops)
        if not dry_run and current is not None:
            # What was written is new (new inodes, fresh timestamps) and would not match its
            # record anyway; say so explicitly, per folder.
            touched: dict[str, set[str]] = {}
            for op in plan.ops:
                folder, name = cache_key(op[1])
                touched.setdefault(folder, set()).add(name)
            new = current.new
            for folder, names in touched.items():
                rec = new.get(folder)
                if rec is not None:
                    new[folder] = rec.with_stale(i for i, k in enumerate(rec.keys) if k in names)
            keep_cache(cache, new, cache_path)
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
        )

    def _plan(
        self,
        rel: bytes,
        target: str,
        current: str | None,
        extra: dict[str, FolderRecord],
        counts: dict[str, int],
        plan: _Plan,
    ) -> None:
        if target == current:
            plan.unchanged += counts.get(current, 0)
            return
        want = self._trees.get(target, extra)
        have = self._trees.get(current, extra) if current else {}
        for key in sorted(have.keys() - want.keys(), key=decode_name):
            plan.add("rm", join_path(rel, decode_name(key)))
        for key in sorted(want, key=decode_name):
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
                    plan.add("write", path, w["h"], w["m"])
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
                _remove(path)
            elif kind == "mkdir":
                os.mkdir(path, 0o700)
                checked.add(path)
            elif kind == "write":
                self._write_file(path, op[2], op[3])
            elif kind == "link":
                os.symlink(op[2], path)
            elif kind in ("chmod", "mode"):
                if not os.path.islink(path):
                    os.chmod(path, op[2])
                opened.pop(path, None)
        for folder, mode in opened.items():
            with contextlib.suppress(FileNotFoundError):
                os.chmod(folder, mode)

    @staticmethod
    def _writable(folder: bytes, checked: set[bytes], opened: dict[bytes, int]) -> None:
        if folder in checked:
            return
        checked.add(folder)
        mode = stat.S_IMODE(os.lstat(folder).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(folder, mode | 0o700)
            opened[folder] = mode

    def _write_file(self, path: bytes, digest: str, mode: int) -> None:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=b".shiftlog-restore-")
        try:
            with os.fdopen(fd, "wb") as out, self.blobs.open(digest) as src:
                h = hashlib.sha256()
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                if h.hexdigest() != digest:
                    raise CorruptBlob(f"blob {digest} does not match its digest")
                os.fchmod(out.fileno(), mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    # -- diff ----------------------------------------------------------------------------------

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

        Only subtrees whose digests differ are walked. Text files (UTF-8, no NUL, at most
        TEXT_DIFF_MAX_INPUT bytes a side) get a unified diff of at most `max_diff_bytes`, cut with
        a note; other files are compared by size and hash only.
        """
        extra: dict[str, FolderRecord] = {}
        live: dict[str, bytes] = {}
        with self.blobs.lock():
            a = self._side(old, extra, live, cache_path)
            b = self._side(new, extra, live, cache_path)
            changes: list[Change] = []
            self._diff(b"", a, b, extra, changes)
            if text_diffs:
                for c in changes:
                    if (
                        c.old_type in ("f", None)
                        and c.new_type in ("f", None)
                        and c.status
                        in (
                            "added",
                            "removed",
                            "changed",
                        )
                    ):
                        self._text_diff(c, live, max_diff_bytes)
        return changes

    def _side(
        self,
        side: str | Path | None,
        extra: dict[str, FolderRecord],
        live: dict[str, bytes],
        cache_path: Path | None,
    ) -> str | None:
        if side is None or isinstance(side, str):
            return side
        cache = load_cache(cache_path)
        scan = self._scan(Path(side), cache, cache_path, store=False, live_paths=True)
        extra.update(scan.trees)
        live.update(scan.live)
        return scan.root

    def _diff(
        self,
        rel: bytes,
        a: str | None,
        b: str | None,
        extra: dict[str, FolderRecord],
        out: list[Change],
    ) -> None:
        if a == b:
            return
        old = self._trees.get(a, extra) if a else {}
        new = self._trees.get(b, extra) if b else {}
        for key in sorted(old.keys() | new.keys(), key=decode_name):
            o, n = old.get(key), new.get(key)
            if o == n:
                continue
            path = join_path(rel, decode_name(key))
            c = _change(to_str(path), o, n)
            if o is not None and n is not None and o["t"] == n["t"] == "d":
                if o["m"] != n["m"]:
                    c.status = "mode_changed"
                    out.append(c)
                self._diff(path, o["h"], n["h"], extra, out)
                continue
            out.append(c)
            # A folder that appeared, went away or replaced a file: list what is inside it.
            if (o is not None and o["t"] == "d") or (n is not None and n["t"] == "d"):
                oh = o["h"] if o is not None and o["t"] == "d" else None
                nh = n["h"] if n is not None and n["t"] == "d" else None
                self._diff(path, oh, nh, extra, out)

    def _content(self, digest: str, live: dict[str, bytes]) -> bytes:
        try:
            return self.blobs.get(digest)
        except FileNotFoundError:
            if digest in live:
                with open(live[digest], "rb") as f:
                    return f.read()
            raise MissingBlob(f"blob {digest} is not in the store") from None

    def _text_diff(self, c: Change, live: dict[str, bytes], limit: int) -> None:
        if max(c.old_size or 0, c.new_size or 0) > TEXT_DIFF_MAX_INPUT:
            c.note = f"too large for a text diff (over {TEXT_DIFF_MAX_INPUT} bytes)"
            return
        old = self._content(c.old_hash, live) if c.old_hash else b""
        new = self._content(c.new_hash, live) if c.new_hash else b""
        old_text, new_text = _is_text(old), _is_text(new)
        if old_text is None or new_text is None:
            c.binary = True
            return
        c.binary = False
        name = display(c.path)
        lines = difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile="a/" + name if c.old_hash else "/dev/null",
            tofile="b/" + name if c.new_hash else "/dev/null",
        )
        parts: list[str] = []
        used = 0
        for line in lines:
            if not line.endswith("\n"):
                line += "\n\\ No newline at end of file\n"
            used += len(line.encode("utf-8"))
            if used > limit:
                parts.append(f"[diff cut here: longer than {limit} bytes]\n")
                c.note = "diff truncated"
                break
            parts.append(line)
        c.diff = "".join(parts)

    # -- store maintenance ---------------------------------------------------------------------

    def referenced_blobs(self, trees: Iterable[str]) -> set[str]:
        """Every blob reachable from `trees`, the trees themselves included (missing ones too)."""
        with self.blobs.lock():
            return self._reachable(trees)

    def _reachable(self, trees: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        stack = list(trees)
        while stack:
            digest = stack.pop()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                entries = self._trees.get(digest)
            except SnapshotError:
                continue
            for e in entries.values():
                if e["t"] == "d":
                    stack.append(e["h"])
                elif e["t"] == "f":
                    seen.add(e["h"])
        return seen

    def verify(self, trees: Iterable[str]) -> list[str]:
        """Problems with the checkpoints `trees`: missing blobs, blobs not matching their digest,
        unreadable trees. Empty when every checkpoint can be restored."""
        problems: list[str] = []
        checked: set[str] = set()
        with self.blobs.lock():
            stack = [(t, t, b"") for t in trees]
            while stack:
                digest, root, where = stack.pop()
                if digest in checked:
                    continue
                checked.add(digest)
                label = f"{display(to_str(where)) or '/'} in checkpoint {root[:12]}"
                try:
                    data = self.blobs.get(digest)
                except FileNotFoundError:
                    problems.append(f"missing tree {digest} ({label})")
                    continue
                if hashlib.sha256(data).hexdigest() != digest:
                    problems.append(f"corrupt tree {digest}: content does not match ({label})")
                    continue
                try:
                    entries = parse_tree(digest, data)
                except SnapshotError as e:
                    problems.append(f"{e} ({label})")
                    continue
                for key, e in entries.items():
                    path = join_path(where, decode_name(key))
                    if e["t"] == "d":
                        stack.append((e["h"], root, path))
                    elif e["t"] == "f" and e["h"] not in checked:
                        checked.add(e["h"])
                        problem = self._check_blob(e["h"])
                        if problem:
                            shown = display(to_str(path))
                            problems.append(f"{problem} (file {shown} in checkpoint {root[:12]})")
        return problems

    def _check_blob(self, digest: str) -> str | None:
        try:
            with self.blobs.open(digest) as f:
                actual, _ = hash_stream(f)
        except FileNotFoundError:
            return f"missing blob {digest}"
        if actual != digest:
            return f"corrupt blob {digest}: content hashes to {actual}"
        return None

    def prune(
        self,
        keep_trees: Iterable[str],
        keep_blobs: Iterable[str] = (),
        *,
        grace_seconds: float = 3600.0,
        dry_run: bool = False,
    ) -> PruneResult:
        """Delete blobs not reachable from `keep_trees` and not in `keep_blobs` (artifacts).

        Blobs newer than `grace_seconds`, and everything reachable from trees that new, are kept:
        they may belong to a checkpoint or artifact whose row is not written yet. Trees go first,
        parents before children, so an interrupted prune still leaves no tree naming a missing
        blob.
        """
        now = time.time()
        with self.blobs.lock(exclusive=True):
            keep = self._reachable(keep_trees) | set(keep_blobs)
            doomed: dict[str, int] = {}
            recent_trees = []
            stored = 0
            for digest in self.blobs.iter_digests():
                stored += 1
                if digest in keep:
                    continue
                try:
                    st = self.blobs.path(digest).stat()
                except FileNotFoundError:
                    continue
                if now - st.st_mtime < grace_seconds:
                    if self._is_tree(digest):
                        recent_trees.append(digest)
                    keep.add(digest)
                else:
                    doomed[digest] = st.st_size
            keep |= self._reachable(recent_trees)
            doomed = {d: size for d, size in doomed.items() if d not in keep}
            order = self._deletion_order(doomed)
            if not dry_run:
                for digest in order:
                    self.blobs.delete(digest)
                    self._trees.forget(digest)
            temp = 0 if dry_run else self.blobs.remove_stray_temp(grace_seconds)
        return PruneResult(
            deleted=len(order),
            bytes_freed=sum(doomed.values()),
            kept=stored - len(order),
            temp_removed=temp,
            dry_run=dry_run,
        )

    def _is_tree(self, digest: str) -> bool:
        try:
            return self.blobs.read_head(digest, len(TREE_MAGIC)) == TREE_MAGIC
        except FileNotFoundError:
            return False

    def _deletion_order(self, doomed: dict[str, int]) -> list[str]:
        trees = [d for d in doomed if self._is_tree(d)]
        children: dict[str, list[str]] = {}
        parents_left = dict.fromkeys(trees, 0)
        for t in trees:
            try:
                entries = self._trees.get(t)
            except SnapshotError:
                entries = {}
            kids = [e["h"] for e in entries.values() if e["t"] == "d" and e["h"] in parents_left]
            children[t] = kids
            for k in kids:
                parents_left[k] += 1
        # Kahn's algorithm: a tree is deleted only once no doomed tree left names it.
        ready = [t for t, n in parents_left.items() if n == 0]
        order = []
        while ready:
            t = ready.pop()
            order.append(t)
            for k in children[t]:
                parents_left[k] -= 1
                if parents_left[k] == 0:
                    ready.append(k)
        tree_set = set(trees)
        return order + [d for d in doomed if d not in tree_set]


class _Plan:
    def __init__(self):
        self.ops: list[tuple] = []
        self.blobs: set[str] = set()
        self.unchanged = 0
        self.count = dict.fromkeys(("rm", "mkdir", "mode", "write", "link", "chmod"), 0)

    def add(self, kind: str, path: bytes, *args: Any) -> None:
        self.ops.append((kind, path, *args))
        self.count[kind] += 1


def _change(path: str, o: dict[str, Any] | None, n: dict[str, Any] | None) -> Change:
    if o is None:
        status = "added"
    elif n is None:
        status = "removed"
    elif o["t"] != n["t"]:
        status = "type_changed"
    elif o.get("h") == n.get("h") and o.get("target") == n.get("target"):
        status = "mode_changed"
    else:
        status = "changed"
    c = Change(path, status)
    for prefix, e in (("old", o), ("new", n)):
        if e is None:
            continue
        setattr(c, f"{prefix}_type", e["t"])
        if e["t"] == "l":
            setattr(c, f"{prefix}_target", to_str(decode_name(e["target"])))
            continue
        setattr(c, f"{prefix}_mode", e["m"])
        if e["t"] == "f":
            setattr(c, f"{prefix}_hash", e["h"])
            setattr(c, f"{prefix}_size", e["s"])
    return c


def _remove(path: bytes) -> None:
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
            _remove(item.path)
        else:
            os.unlink(item.path)
    os.rmdir(path)


def iter_tree_blobs(blobs: BlobStore) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every tree stored in `blobs` (found by its magic line), parsed; for checks and tests."""
    for digest in blobs.iter_digests():
        try:
            with blobs.open(digest) as f:
                if f.read(len(TREE_MAGIC)) != TREE_MAGIC:
                    continue
                data = TREE_MAGIC + f.read()
        except FileNotFoundError:
            continue
        try:
            yield digest, parse_tree(digest, data)
        except CorruptBlob:
            continue
