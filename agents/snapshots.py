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

Speed. Only files whose (size, mtime_ns, ctime_ns, inode) differ from the StatCache are read;
unchanged directories produce the same tree digest, which is already stored, so nothing is written
for them. A file is only cached once its timestamps are older than the filesystem's clock at the
start of the checkpoint (read from a probe file on the same filesystem, or the wall clock minus
2 s when there is none): a file modified again within the same timestamp tick after being read
would otherwise look unchanged ("racy git"). Such files are simply read again next time.
Within one process, a cache file this process saved last is not parsed again: the cache object
is reused, with each folder's entries and digest from the last scan, so folders whose entries are
all unchanged are not serialised and hashed again either.

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

import base64
import contextlib
import difflib
import errno
import hashlib
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from agents.blobstore import BlobStore

TREE_MAGIC = b"shiftlog-tree 1\n"
B64_PREFIX = "b64:"
RACY_FALLBACK_NS = 2_000_000_000
TEXT_DIFF_MAX_INPUT = 1 << 20
_CHUNK = 1 << 20
# Below this many files to read, a thread pool costs more than it saves.
_PARALLEL_MIN_FILES = 64

# Cache file -> (its stat when this process last wrote it, the cache). Reusing the object skips
# parsing the file again and keeps its in-memory folder digests; the stat tells when another
# process has replaced the file since. Process-wide, so short-lived Snapshots objects share it.
_CACHES: dict[Path, tuple[tuple[int, int, int], StatCache]] = {}
_CACHES_MAX = 16  # workspaces remembered; a long-lived worker serves many runs
_CACHES_LOCK = threading.Lock()


class SnapshotError(Exception):
    pass


class MissingBlob(SnapshotError):
    pass


class CorruptBlob(SnapshotError):
    pass


# -- names -------------------------------------------------------------------------------------


def encode_name(raw: bytes) -> str:
    """A file name (or link target) as a JSON-safe str; reversible with decode_name."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or text.startswith(B64_PREFIX):
        return B64_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")
    return text


def decode_name(key: str) -> bytes:
    if key.startswith(B64_PREFIX):
        return base64.urlsafe_b64decode(key[len(B64_PREFIX) :])
    return key.encode("utf-8")


def display(path: str) -> str:
    """A printable form of a path from this module (undecodable bytes shown as \\xNN)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _to_str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _to_bytes(path: str | bytes) -> bytes:
    return path if isinstance(path, bytes) else path.encode("utf-8", "surrogateescape")


def _join(rel: bytes, name: bytes) -> bytes:
    return rel + b"/" + name if rel else name


# -- results -----------------------------------------------------------------------------------


@dataclass
class SnapshotResult:
    tree: str
    files: int
    bytes_total: int
    blobs_added: int
    bytes_added: int
    hashed_files: int
    seconds: float
    dirs: int = 0
    links: int = 0
    skipped: list[str] = field(default_factory=list)


@dataclass
class RestoreResult:
    written: int
    removed: int
    unchanged: int
    links: int
    dirs_created: int
    modes_set: int
    seconds: float
    dry_run: bool = False
    actions: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    path: str
    type: str
    hash: str | None = None
    mode: int | None = None
    size: int | None = None
    target: str | None = None

    @property
    def raw_path(self) -> bytes:
        return _to_bytes(self.path)


@dataclass
class Change:
    path: str
    status: str  # added | removed | changed | type_changed | mode_changed
    old_type: str | None = None
    new_type: str | None = None
    old_hash: str | None = None
    new_hash: str | None = None
    old_mode: int | None = None
    new_mode: int | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_target: str | None = None
    new_target: str | None = None
    binary: bool | None = None
    diff: str | None = None
    note: str | None = None


@dataclass
class PruneResult:
    deleted: int
    bytes_freed: int
    kept: int
    temp_removed: int
    dry_run: bool = False


# -- stat cache --------------------------------------------------------------------------------


class StatCache:
    """What is known about the files of one workspace, so unchanged files are not read again.

    `dirs` maps a folder (its encoded names joined by "/", "" for the top) to
    {encoded name: [size, mtime_ns, ctime_ns, inode, digest]}. Only entries recorded safely (see
    the module docstring on racy timestamps) are put here, so a matching stat means the content
    is the one hashed; a lost or stale cache only costs re-reading files. `trees` (kept in memory,
    never saved) remembers each folder's entries and tree digest from the last scan, so a folder
    whose entries are all unchanged is not serialised and hashed again.
    """

    VERSION = 2

    def __init__(self, dirs: dict[str, dict[str, list[Any]]] | None = None):
        self.dirs: dict[str, dict[str, list[Any]]] = dirs if dirs is not None else {}
        self.trees: dict[str, tuple[dict[str, Any], str]] = {}

    def get(self, path: str | bytes) -> list[Any] | None:
        """The entry for a workspace-relative path, if any (for inspection and tests)."""
        folder, name = _cache_key(_to_bytes(path))
        return self.dirs.get(folder, {}).get(name)

    def discard(self, path: str | bytes) -> None:
        folder, name = _cache_key(_to_bytes(path))
        self.dirs.get(folder, {}).pop(name, None)

    def __len__(self) -> int:
        return sum(len(files) for files in self.dirs.values())

    def to_json(self) -> str:
        return json.dumps({"version": self.VERSION, "dirs": self.dirs}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StatCache:
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        if not isinstance(data, dict) or data.get("version") != cls.VERSION:
            return cls()
        dirs = data.get("dirs")
        return cls(dirs if isinstance(dirs, dict) else {})

    @classmethod
    def load(cls, path: Path) -> StatCache:
        try:
            return cls.from_json(Path(path).read_text())
        except (OSError, UnicodeDecodeError):
            return cls()

    def save(self, path: Path) -> None:
        # No fsync: after a power cut an old or empty cache is still correct, just slower.
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-cache-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _cache_key(rel: bytes) -> tuple[str, str]:
    """(folder key, name key) of a workspace-relative path in a StatCache."""
    parts = [encode_name(p) for p in rel.split(b"/") if p]
    return "/".join(parts[:-1]), parts[-1] if parts else ""


# -- scanning a workspace ----------------------------------------------------------------------


class _Dir:
    __slots__ = ("entries", "entry", "hits", "key", "path", "subdirs")

    def __init__(self, path: bytes, key: str):
        self.path = path
        self.key = key  # the folder's key in the StatCache
        self.entries: dict[str, dict[str, Any]] = {}
        self.entry: dict[str, Any] | None = None  # this folder's entry in its parent
        self.subdirs: list[_Dir] = []
        self.hits: list[tuple[str, bytes]] = []  # (key, name) of files digested from the cache


class _File:
    __slots__ = ("entry", "key", "parent", "path", "st")

    def __init__(self, path: bytes, st: os.stat_result, entry: dict, parent: _Dir, key: str):
        self.path = path
        self.st = st
        self.entry = entry
        self.parent = parent
        self.key = key


class _Scan:
    def __init__(self, cache: StatCache, trusted_before: int, live_paths: bool):
        self.cache = cache
        self.new_cache = StatCache()
        self.trusted_before = trusted_before
        self.pending: list[_File] = []
        self.skipped: list[str] = []
        self.live_paths = live_paths  # diffs read live files: remember where each digest was
        self.trees: dict[str, dict[str, Any]] = {}  # digest -> entries, for every folder seen
        self.counts: dict[str, int] = {}  # tree digest -> files under it
        self.live: dict[str, bytes] = {}  # file digest -> a path with that content
        self.new_trees: list[bytes] = []  # tree blobs to write, children first
        self.freshen: list[str] = []
        self.root = ""
        self.files = self.dirs = self.links = self.bytes_total = 0
        self.hashed = self.blobs_added = self.bytes_added = 0


def _tree_bytes(entries: dict[str, Any]) -> bytes:
    body = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return TREE_MAGIC + body.encode("utf-8")


def _digest_tree(d: _Dir, cache: StatCache | None) -> tuple[bytes | None, str]:
    """(tree blob or None when it did not need building, digest) of a scanned folder."""
    if cache is not None:
        last = cache.trees.get(d.key)
        # Equal entries serialise to the same bytes: skip the JSON and the hash.
        if last is not None and last[0] == d.entries:
            return None, last[1]
    data = _tree_bytes(d.entries)
    return data, hashlib.sha256(data).hexdigest()


def _join_key(folder: str, key: str) -> str:
    return folder + "/" + key if folder else key


def _is_text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Snapshots:
    def __init__(self, blobs: BlobStore, *, workers: int | None = None):
        self.blobs = blobs
        # Reading and hashing release the GIL, so a few threads overlap the I/O and fsyncs of a
        # first checkpoint.
        self.workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        self._tree_cache: dict[str, dict[str, Any]] = {}

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
            cache = self._load_cache(cache_path)
        with self.blobs.lock():
            scan = self._scan(workspace, cache, cache_path, store=True)
        self._keep_cache(cache, scan.new_cache, cache_path)
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

    def _load_cache(self, cache_path: Path | None) -> StatCache:
        if cache_path is None:
            return StatCache()
        cache_path = Path(cache_path)
        try:
            st = os.stat(cache_path)
        except FileNotFoundError:
            return StatCache()
        known = _CACHES.get(cache_path)
        if known is not None and known[0] == (st.st_ino, st.st_size, st.st_mtime_ns):
            return known[1]
        return StatCache.load(cache_path)

    def _keep_cache(self, cache: StatCache, new: StatCache, cache_path: Path | None) -> None:
        cache.dirs, cache.trees = new.dirs, new.trees
        if cache_path is not None:
            cache_path = Path(cache_path)
            cache.save(cache_path)
            st = os.stat(cache_path)
            with _CACHES_LOCK:
                _CACHES.pop(cache_path, None)
                _CACHES[cache_path] = ((st.st_ino, st.st_size, st.st_mtime_ns), cache)
                while len(_CACHES) > _CACHES_MAX:
                    _CACHES.pop(next(iter(_CACHES)))

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
    ) -> _Scan:
        root = os.fsencode(workspace)
        st = os.stat(root)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(workspace)
        probes = [self.blobs.root]
        if cache_path is not None:
            probes.insert(0, Path(cache_path).parent)
        scan = _Scan(cache, self._fs_clock(st.st_dev, probes, create=store), live_paths)
        top = self._walk(root, "", scan, len(root) + 1)
        self._hash_all(scan, store)
        scan.root, existed = self._build(top, scan, store)
        if store:
            if existed:
                scan.freshen.append(scan.root)
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

    def _walk(self, path: bytes, dkey: str, scan: _Scan, strip: int) -> _Dir:
        # The hot loop of a checkpoint: one lstat per entry and as little else as possible.
        d = _Dir(path, dkey)
        known = scan.cache.dirs.get(dkey, {})
        keep: dict[str, list[Any]] = {}
        with os.scandir(path) as it:
            items = list(it)
        for item in items:
            name = item.name
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            key = encode_name(name)
            fmt = stat.S_IFMT(st.st_mode)
            if fmt == stat.S_IFREG:
                e = known.get(key)
                if (
                    e is not None
                    and e[0] == st.st_size
                    and e[1] == st.st_mtime_ns
                    and e[2] == st.st_ctime_ns
                    and e[3] == st.st_ino
                ):
                    d.entries[key] = {"t": "f", "h": e[4], "m": st.st_mode & 0o7777, "s": e[0]}
                    keep[key] = e
                    d.hits.append((key, name))
                    if scan.live_paths:
                        scan.live[e[4]] = path + b"/" + name
                else:
                    entry = d.entries[key] = {"t": "f", "m": st.st_mode & 0o7777}
                    scan.pending.append(_File(path + b"/" + name, st, entry, d, key))
            elif fmt == stat.S_IFLNK:
                try:
                    target = os.readlink(path + b"/" + name)
                except FileNotFoundError:
                    continue
                d.entries[key] = {"t": "l", "target": encode_name(target)}
                scan.links += 1
            elif fmt == stat.S_IFDIR:
                try:
                    sub = self._walk(path + b"/" + name, _join_key(dkey, key), scan, strip)
                except FileNotFoundError:
                    continue
                sub.entry = d.entries[key] = {"t": "d", "m": st.st_mode & 0o7777}
                d.subdirs.append(sub)
                scan.dirs += 1
            else:
                scan.skipped.append(_to_str((path + b"/" + name)[strip:]))
        if keep:
            scan.new_cache.dirs[dkey] = keep
        return d

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
                digest, size = _hash_stream(fh)
                added = False
            return digest, size, added, os.fstat(fd)

    def _record(self, scan: _Scan, f: _File, result: tuple | None) -> None:
        if result is None:
            f.parent.entries.pop(f.key, None)
            return
        digest, size, added, after = result
        f.entry["h"] = digest
        f.entry["s"] = size
        scan.hashed += 1
        if scan.live_paths:
            scan.live[digest] = f.path
        if added:
            scan.blobs_added += 1
            scan.bytes_added += size
        stable = (
            after.st_size == size
            and after.st_mtime_ns == f.st.st_mtime_ns
            and after.st_ctime_ns == f.st.st_ctime_ns
            and after.st_ino == f.st.st_ino
        )
        if stable and max(after.st_mtime_ns, after.st_ctime_ns) < scan.trusted_before:
            folder = scan.new_cache.dirs.setdefault(f.parent.key, {})
            folder[f.key] = [size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino, digest]

    def _build(self, d: _Dir, scan: _Scan, store: bool) -> tuple[str, bool]:
        """Digest of folder `d` (children first) and whether its tree blob was already stored."""
        existing_children = []
        below = 0
        for sub in d.subdirs:
            digest, existed = self._build(sub, scan, store)
            sub.entry["h"] = digest
            below += scan.counts[digest]
            if existed:
                existing_children.append(digest)
        data, digest = _digest_tree(d, scan.cache)
        existed = False
        if store:
            if self.blobs.exists(digest):
                existed = True
            else:
                # A new tree: cached digests under it must name stored blobs (a prune may have
                # removed content that was never part of a kept checkpoint).
                missing = [(k, n) for k, n in d.hits if not self.blobs.exists(d.entries[k]["h"])]
                for key, name in missing:
                    scan.new_cache.dirs[d.key].pop(key, None)
                    path = d.path + b"/" + name
                    try:
                        f = _File(path, os.lstat(path), d.entries[key], d, key)
                    except FileNotFoundError:
                        d.entries.pop(key)
                        continue
                    self._record(scan, f, self._read(f, store))
                if missing:
                    data, digest = _digest_tree(d, None)
                scan.new_trees.append(data or _tree_bytes(d.entries))
                scan.freshen.extend(existing_children)
        sizes = [e["s"] for e in d.entries.values() if e["t"] == "f"]
        scan.trees[digest] = d.entries
        scan.new_cache.trees[d.key] = (d.entries, digest)
        scan.counts[digest] = below + len(sizes)
        scan.files += len(sizes)
        scan.bytes_total += sum(sizes)
        return digest, existed

    # -- reading trees -------------------------------------------------------------------------

    def _tree(self, digest: str, extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        if extra is not None and digest in extra:
            return extra[digest]
        cached = self._tree_cache.get(digest)
        if cached is not None:
            return cached
        try:
            data = self.blobs.get(digest)
        except FileNotFoundError:
            raise MissingBlob(f"tree {digest} is not in the store") from None
        entries = _parse_tree(digest, data)
        if len(self._tree_cache) > 20_000:
            self._tree_cache.clear()
        self._tree_cache[digest] = entries
        return entries

    def files(self, tree: str) -> dict[str, Entry]:
        """Every path in the checkpoint (folders included) -> its entry."""
        out: dict[str, Entry] = {}
        with self.blobs.lock():
            self._list(tree, b"", out)
        return out

    def _list(self, digest: str, rel: bytes, out: dict[str, Entry]) -> None:
        for key, e in sorted(self._tree(digest).items(), key=lambda kv: decode_name(kv[0])):
            path = _join(rel, decode_name(key))
            out[_to_str(path)] = _entry(_to_str(path), e)
            if e["t"] == "d":
                self._list(e["h"], path, out)

    def read(self, tree: str, path: str | bytes) -> bytes:
        """Content of the file at `path` in the checkpoint."""
        parts = [p for p in _to_bytes(path).split(b"/") if p]
        if not parts:
            raise IsADirectoryError(path)
        with self.blobs.lock():
            entries = self._tree(tree)
            for i, part in enumerate(parts):
                e = entries.get(encode_name(part))
                if e is None:
                    raise FileNotFoundError(path)
                if i < len(parts) - 1:
                    if e["t"] != "d":
                        raise NotADirectoryError(path)
                    entries = self._tree(e["h"])
                elif e["t"] == "d":
                    raise IsADirectoryError(path)
                elif e["t"] == "l":
                    raise ValueError(f"{display(_to_str(_to_bytes(path)))} is a symlink")
            return self.blobs.get(e["h"])

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
            cache = self._load_cache(cache_path)
        with self.blobs.lock():
            current = None
            if os.path.isdir(workspace):
                current = self._scan(workspace, cache, cache_path, store=False)
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
            for op in plan.ops:
                current.new_cache.discard(op[1])
            self._keep_cache(cache, current.new_cache, cache_path)
        return RestoreResult(
            written=plan.count["write"],
            removed=plan.count["rm"],
            unchanged=plan.unchanged,
            links=plan.count["link"],
            dirs_created=plan.count["mkdir"],
            modes_set=plan.count["chmod"],
            seconds=time.perf_counter() - started,
            dry_run=dry_run,
            actions=[(op[0], _to_str(op[1])) for op in plan.ops],
        )

    def _plan(
        self,
        rel: bytes,
        target: str,
        current: str | None,
        extra: dict[str, dict[str, Any]],
        counts: dict[str, int],
        plan: _Plan,
    ) -> None:
        if target == current:
            plan.unchanged += counts.get(current, 0)
            return
        want = self._tree(target, extra)
        have = self._tree(current, extra) if current else {}
        for key in sorted(have.keys() - want.keys(), key=decode_name):
            plan.add("rm", _join(rel, decode_name(key)))
        for key in sorted(want, key=decode_name):
            w, h = want[key], have.get(key)
            path = _join(rel, decode_name(key))
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
                while chunk := src.read(_CHUNK):
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
        extra: dict[str, dict[str, Any]] = {}
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
        extra: dict[str, dict[str, Any]],
        live: dict[str, bytes],
        cache_path: Path | None,
    ) -> str | None:
        if side is None or isinstance(side, str):
            return side
        cache = self._load_cache(cache_path)
        scan = self._scan(Path(side), cache, cache_path, store=False, live_paths=True)
        extra.update(scan.trees)
        live.update(scan.live)
        return scan.root

    def _diff(
        self,
        rel: bytes,
        a: str | None,
        b: str | None,
        extra: dict[str, dict[str, Any]],
        out: list[Change],
    ) -> None:
        if a == b:
            return
        old = self._tree(a, extra) if a else {}
        new = self._tree(b, extra) if b else {}
        for key in sorted(old.keys() | new.keys(), key=decode_name):
            o, n = old.get(key), new.get(key)
            if o == n:
                continue
            path = _join(rel, decode_name(key))
            c = _change(_to_str(path), o, n)
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
                entries = self._tree(digest)
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
                label = f"{display(_to_str(where)) or '/'} in checkpoint {root[:12]}"
                try:
                    data = self.blobs.get(digest)
                except FileNotFoundError:
                    problems.append(f"missing tree {digest} ({label})")
                    continue
                if hashlib.sha256(data).hexdigest() != digest:
                    problems.append(f"corrupt tree {digest}: content does not match ({label})")
                    continue
                try:
                    entries = _parse_tree(digest, data)
                except SnapshotError as e:
                    problems.append(f"{e} ({label})")
                    continue
                for key, e in entries.items():
                    path = _join(where, decode_name(key))
                    if e["t"] == "d":
                        stack.append((e["h"], root, path))
                    elif e["t"] == "f" and e["h"] not in checked:
                        checked.add(e["h"])
                        problem = self._check_blob(e["h"])
                        if problem:
                            shown = display(_to_str(path))
                            problems.append(f"{problem} (file {shown} in checkpoint {root[:12]})")
        return problems

    def _check_blob(self, digest: str) -> str | None:
        try:
            with self.blobs.open(digest) as f:
                actual, _ = _hash_stream(f)
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
                    self._tree_cache.pop(digest, None)
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
                entries = self._tree(t)
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


def _parse_tree(digest: str, data: bytes) -> dict[str, Any]:
    if not data.startswith(TREE_MAGIC):
        raise CorruptBlob(f"blob {digest} is not a tree")
    try:
        entries = json.loads(data[len(TREE_MAGIC) :])
    except ValueError:
        raise CorruptBlob(f"tree {digest} is not valid JSON") from None
    if not isinstance(entries, dict):
        raise CorruptBlob(f"tree {digest} is not a JSON object")
    for key, e in entries.items():
        name = decode_name(key)
        # A name like ".." or "a/b" would let a damaged store write outside the workspace.
        if name in (b"", b".", b"..") or b"/" in name or b"\0" in name:
            raise CorruptBlob(f"tree {digest} has an invalid name {key!r}")
        if not _valid_entry(e):
            raise CorruptBlob(f"tree {digest} has an invalid entry for {key!r}")
    return entries


def _valid_entry(e: Any) -> bool:
    if not isinstance(e, dict):
        return False
    kind = e.get("t")
    if kind == "l":
        return isinstance(e.get("target"), str)
    if kind not in ("f", "d") or not isinstance(e.get("m"), int):
        return False
    digest = e.get("h")
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return False
    return kind == "d" or isinstance(e.get("s"), int)


def _entry(path: str, e: dict[str, Any]) -> Entry:
    if e["t"] == "l":
        return Entry(path, "l", target=_to_str(decode_name(e["target"])))
    return Entry(path, e["t"], hash=e["h"], mode=e["m"], size=e.get("s"))


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
            setattr(c, f"{prefix}_target", _to_str(decode_name(e["target"])))
            continue
        setattr(c, f"{prefix}_mode", e["m"])
        if e["t"] == "f":
            setattr(c, f"{prefix}_hash", e["h"])
            setattr(c, f"{prefix}_size", e["s"])
    return c


def _hash_stream(f: BinaryIO) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


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
            yield digest, _parse_tree(digest, data)
        except CorruptBlob:
            continue
