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
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agents.blobstore import BlobStore
from agents.snapshots.cache import (
    FolderRecord,
    StatCache,
    cache_key,
    keep_cache,
    load_cache,
)
from agents.snapshots.errors import CorruptBlob, MissingBlob, SnapshotError
from agents.snapshots.hashing import CHUNK, FileHasher, hash_stream
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
from agents.snapshots.scan import Scanner
from agents.snapshots.trees import (
    TREE_MAGIC,
    TreeReader,
    parse_tree,
)

__all__ = [
    "TREE_MAGIC",
    "Change",
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

TEXT_DIFF_MAX_INPUT = 1 << 20


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
        self._hasher = FileHasher(
            blobs, workers if workers is not None else min(4, os.cpu_count() or 1)
        )
        self._trees = TreeReader(blobs)
        self._scanner = Scanner(blobs, self._hasher)

    @property
    def workers(self) -> int:
        """Threads reading files when a scan has many to read."""
        return self._hasher.workers

    @workers.setter
    def workers(self, workers: int) -> None:
        self._hasher.workers = workers

    # -- snapshot ------------------------------------------------------------------------------

    def snapshot(
        self, workspace: Path, *, cache_path: Path | None = None, cache: StatCache | None = None
    ) -> SnapshotResult:
        """Checkpoint `workspace`; returns once every blob of the checkpoint is durably stored.

        `cache_path` is a file (outside the workspace) where the stat cache is kept between
        calls; or pass a StatCache object to keep it in memory (it is updated in place).
        """
        return self._scanner.snapshot(workspace, cache_path=cache_path, cache=cache)

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
        self._scanner.check_outside(workspace, cache_path)
        if cache is None:
            cache = load_cache(cache_path)
        with self.blobs.lock():
            current = None
            if os.path.isdir(workspace):
                current = self._scanner.scan(
                    workspace, cache, cache_path, store=False, keep_trees=True
                )
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
        scan = self._scanner.scan(Path(side), cache, cache_path, store=False, live_paths=True)
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
