"""The stat cache: what a checkpoint knows about a workspace's folders from the last one.

How a checkpoint uses it, and when a value may be trusted, is in scan.py's docstring. The file's
format (StatCache.HEADER, the record lines) is read by existing workspaces' caches: a change to
it needs a new version, and an unreadable cache only costs re-reading files.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agents.snapshots.names import B64_PREFIX, decode_name, encode_name, to_bytes
from agents.snapshots.trees import entries_of

_VAL_TYPES = {str, type(None)}
_FS_UTF8 = (
    sys.getfilesystemencoding() == "utf-8" and sys.getfilesystemencodeerrors() == "surrogateescape"
)


class FolderRecord:
    """One folder as a scan saw it: enough to tell, from one stat per entry, that it is unchanged.

    Parallel lists in the order os.scandir gave the entries: `names` (as scandir returns them for
    a folder opened by descriptor), `keys` (encoded names), `sig` ((st_mode, st_size, st_mtime_ns,
    st_ctime_ns, st_ino) per entry) and `vals` (a file's content digest, a link's encoded target,
    a sub-folder's tree digest; None for an entry left out of the tree). `stale` lists the entries
    whose value must not be trusted next time (racy timestamps, files that changed while read,
    special files, entries that vanished). `tree` is the folder's tree digest and `totals` the
    (files, bytes, dirs, links) of its whole subtree, which the digest determines.
    """

    __slots__ = ("_entries", "keys", "names", "sig", "stale", "subdirs", "totals", "tree", "vals")

    def __init__(
        self,
        names: list[str],
        keys: list[str],
        sig: list[tuple[int, int, int, int, int]],
        vals: list[str | None],
        stale: tuple[int, ...],
        tree: str,
        totals: tuple[int, int, int, int],
        entries: dict[str, Any] | None = None,
    ):
        self.names = names
        self.keys = keys
        self.sig = sig
        self.vals = vals
        self.stale = stale
        self.tree = tree
        self.totals = totals
        self._entries = entries
        self.subdirs = [i for i, s in enumerate(sig) if stat.S_ISDIR(s[0]) and vals[i] is not None]

    @property
    def entries(self) -> dict[str, Any]:
        """The folder's tree object ({encoded name: entry})."""
        if self._entries is None:
            self._entries = entries_of(self.keys, self.sig, self.vals)
        return self._entries

    def with_stale(self, indexes: Iterable[int]) -> FolderRecord:
        stale = tuple(sorted(set(self.stale).union(indexes)))
        return FolderRecord(
            self.names, self.keys, self.sig, self.vals, stale, self.tree, self.totals, self._entries
        )

    def to_line(self, dkey: str) -> str:
        return json.dumps(
            [dkey, self.tree, self.totals, self.stale, self.keys, self.sig, self.vals],
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, data: list[Any]) -> FolderRecord:
        """A record from its cache line (raises ValueError/TypeError when it is malformed)."""
        _, tree, totals, stale, keys, sig, vals = data
        n = len(keys)
        # Checked with C-speed set operations: loading a 10,000-file cache should cost little.
        if not (
            isinstance(tree, str)
            and len(sig) == n == len(vals)
            and set(map(type, keys)) <= {str}
            and set(map(type, vals)) <= _VAL_TYPES
            and set(map(len, sig)) <= {5}
            and set(map(type, itertools.chain(totals, stale, *sig))) <= {int}
            and len(totals) == 4
            and all(0 <= i < n for i in stale)
        ):
            raise ValueError("bad stat cache record")
        if _FS_UTF8:
            # A name that is valid UTF-8 is its own key, and scandir gives it back as that str.
            names = [
                k if not k.startswith(B64_PREFIX) else os.fsdecode(decode_name(k)) for k in keys
            ]
        else:
            names = [os.fsdecode(decode_name(k)) for k in keys]
        return cls(names, keys, list(map(tuple, sig)), vals, tuple(stale), tree, tuple(totals))


class Records(dict):
    """Folder records by key (StatCache.dirs, a scan's `new`) that keep, as they change, what a
    checkpoint after one tool call needs without going through every folder (611 of them at
    10,000 files; that cost about 0.6 ms a checkpoint or rewind, cold):
    - `changed`: keys set or removed since the object was made (a copy of `origin`) or last
      written to its file (StatCache.sync_to writes those lines only);
    - `stale`: keys whose records hold entries not to be trusted (a scan's plan lists them);
    - `trees`: records by tree digest (what a restore looks live trees up by), made once and
      shared along a chain of copies, each adding what it sets. A digest names its content, so
      an entry is never wrong; it may name a folder that is no longer there.
    Every change goes through __setitem__ and __delitem__ (the other mutators are routed there).
    """

    __slots__ = ("__weakref__", "changed", "origin", "stale", "trees")

    def __init__(self, base: dict[str, FolderRecord] | None = None):
        super().__init__()
        self.changed: set[str] = set()
        # (Weak: a strong one would keep every earlier checkpoint's records alive.)
        self.origin: weakref.ref[Records] | None = None
        self.trees: dict[str, FolderRecord] | None = None
        if isinstance(base, Records):
            dict.update(self, base)
            self.stale: set[str] = set(base.stale)
            self.origin = weakref.ref(base)
            self.trees = base.trees
        else:
            if base:
                dict.update(self, base)
            self.stale = {k for k, rec in dict.items(self) if rec.stale}

    def __setitem__(self, key: str, rec: FolderRecord) -> None:
        dict.__setitem__(self, key, rec)
        self.changed.add(key)
        if rec.stale:
            self.stale.add(key)
        else:
            self.stale.discard(key)
        if self.trees is not None:
            self.trees.setdefault(rec.tree, rec)

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.changed.add(key)
        self.stale.discard(key)

    def copy(self) -> Records:
        return Records(self)

    def stale_keys(self) -> set[str]:
        return self.stale

    def tree_index(self) -> dict[str, FolderRecord]:
        """Records by tree digest, every record here included (made now if there is none, or
        if the shared one has grown well past this object's folders)."""
        trees = self.trees
        if trees is None or len(trees) > 2 * len(self) + 256:
            trees = {}
            for rec in dict.values(self):
                trees.setdefault(rec.tree, rec)
            self.trees = trees
        return trees

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            rec = dict.__getitem__(self, key)
            del self[key]
            return rec
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[str, FolderRecord]:
        if not self:
            raise KeyError("popitem(): no records")
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, rec in dict(*args, **kwargs).items():
            self[key] = rec

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def __ior__(self, other: Any) -> Records:
        self.update(other)
        return self


class StatCache:
    """What is known about the folders of one workspace, so unchanged ones cost only their stats.

    `dirs` maps a folder (its encoded names joined by "/", "" for the top) to a FolderRecord: per
    entry its stat (mode, size, mtime_ns, ctime_ns, inode) and its digest (or link target, or
    sub-folder tree), plus the folder's own tree digest. Values are trusted only when recorded
    safely (see scan.py's docstring on racy timestamps), so a matching stat means the content is
    the one hashed; a lost or stale cache only costs re-reading files.

    On disk it is a log of JSON lines: a header, then one line per folder ([key, tree, totals,
    stale, keys, sigs, values], or [key, null] for a folder that is gone), later lines replacing
    earlier ones. A checkpoint appends the lines of the folders that changed (nothing at all when
    none did); the whole file is rewritten (temp file + rename) when the log has grown to about
    twice its live size, or when the file is not the one this object last read or wrote.
    """

    VERSION = 3
    HEADER = '{"shiftlog-stat-cache":3}'

    def __init__(self, dirs: dict[str, FolderRecord] | None = None):
        self.dirs: dict[str, FolderRecord] = Records(dirs)
        # Bumped each time a scan's records replace `dirs` (a change feed's baseline names it).
        self.generation = 0
        # What the file on disk holds, when it is exactly what this object read or wrote last:
        # (path, (st_ino, st_size, st_mtime_ns)) and the records it holds; else None.
        self._disk: tuple[Path, tuple[int, int, int]] | None = None
        self._synced: dict[str, FolderRecord] = {}
        # The Records object `_synced` was taken from (its `changed` emptied then): what a copy
        # of it, or it, has changed since is all that can differ from the file.
        self._synced_from: Records | None = None
        self._log_lines = 0  # lines in the file beyond one per folder

    def _find(self, path: str | bytes) -> tuple[FolderRecord | None, int]:
        folder, name = cache_key(to_bytes(path))
        rec = self.dirs.get(folder)
        if rec is None or name not in rec.keys:
            return None, -1
        return rec, rec.keys.index(name)

    def get(self, path: str | bytes) -> list[Any] | None:
        """[size, mtime_ns, ctime_ns, inode, digest] of a trusted file entry, if any (for tests)."""
        rec, i = self._find(path)
        if rec is None or i in rec.stale or not stat.S_ISREG(rec.sig[i][0]):
            return None
        _, size, mtime, ctime, ino = rec.sig[i]
        return [size, mtime, ctime, ino, rec.vals[i]]

    def discard(self, path: str | bytes) -> None:
        rec, i = self._find(path)
        if rec is not None:
            self.dirs[cache_key(to_bytes(path))[0]] = rec.with_stale([i])

    def __len__(self) -> int:
        """Trusted file entries."""
        return sum(
            1
            for rec in self.dirs.values()
            for i, s in enumerate(rec.sig)
            if stat.S_ISREG(s[0]) and i not in rec.stale
        )

    def to_json(self) -> str:
        lines = [self.HEADER] + [rec.to_line(k) for k, rec in self.dirs.items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StatCache:
        return cls._parse(text)[0]

    @classmethod
    def _parse(cls, text: str) -> tuple[StatCache, bool]:
        """(cache, whether every line was read cleanly: if not, rewrite it before appending)."""
        lines = text.split("\n")
        if lines[0] != cls.HEADER:
            return cls(), False
        clean = lines[-1] == ""  # ends with a newline: no torn last line
        lines = [line for line in lines[1:] if line]
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except ValueError:  # a torn or damaged line costs only its folder
                clean = False
        last: dict[str, list[Any] | None] = {}
        for data in parsed:
            if isinstance(data, list) and data and isinstance(data[0], str) and len(data) in (2, 7):
                last[data[0]] = data if len(data) == 7 else None
            else:
                clean = False
        dirs: dict[str, FolderRecord] = {}
        for key, data in last.items():
            if data is None:
                continue
            try:
                dirs[key] = FolderRecord.from_json(data)
            except (ValueError, TypeError):
                clean = False
        cache = cls(dirs)
        cache._log_lines = len(lines) - len(dirs)
        return cache, clean

    @classmethod
    def load(cls, path: Path) -> StatCache:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
                st = os.fstat(f.fileno())
            cache, clean = cls._parse(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            return cls()
        if clean and st.st_size == len(data):
            cache._disk = (path, (st.st_ino, st.st_size, st.st_mtime_ns))
            cache._mark_synced(dict(cache.dirs))
        return cache

    def save(self, path: Path) -> None:
        """Write the whole cache (temp file + rename)."""
        # No fsync: after a power cut an old or empty cache is still correct, just slower.
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-cache-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
                f.flush()
                st = os.fstat(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._disk = (path, (st.st_ino, st.st_size, st.st_mtime_ns))
        self._mark_synced(dict(self.dirs))
        self._log_lines = 0

    def sync_to(self, path: Path) -> None:
        """Make the file at `path` hold this cache: append the folders that changed since it was
        last read or written by this object, or rewrite it when that is not possible or the log
        has grown long. Writes nothing when no folder changed."""
        path = Path(path)
        disk, synced = self._disk, self._synced
        if disk is None or disk[0] != path or self._log_lines > max(64, len(self.dirs)):
            self.save(path)
            return
        dirs = self.dirs
        keys = self._changed_since_sync(dirs)
        if keys is None:  # not known: every folder compared
            lines = [rec.to_line(k) for k, rec in dirs.items() if synced.get(k) is not rec]
            lines += [json.dumps([k, None]) for k in synced.keys() - dirs.keys()]
        else:
            lines = []
            for k in keys:
                rec = dirs.get(k)
                if rec is None:
                    if k in synced:
                        lines.append(json.dumps([k, None]))
                elif synced.get(k) is not rec:
                    lines.append(rec.to_line(k))
        if not lines:
            self._mark_synced(synced)
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            self.save(path)
            return
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != disk[1]:
                # Another process has written it since: start again from this object's view.
                os.close(fd)
                fd = -1
                self.save(path)
                return
            data = ("\n".join(lines) + "\n").encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            st = os.fstat(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        self._disk = (path, (st.st_ino, st.st_size, st.st_mtime_ns))
        if keys is None:
            synced = dict(dirs)
        else:
            for k in keys:
                rec = dirs.get(k)
                if rec is None:
                    synced.pop(k, None)
                else:
                    synced[k] = rec
        self._mark_synced(synced)
        self._log_lines += len(lines)

    def _changed_since_sync(self, dirs: dict[str, FolderRecord]) -> set[str] | None:
        """The keys in which `dirs` may differ from what was last synced; None: not known."""
        synced_from = self._synced_from
        if synced_from is None or not isinstance(dirs, Records):
            return None
        if dirs is synced_from:
            return dirs.changed
        if dirs.origin is not None and dirs.origin() is synced_from and not synced_from.changed:
            return dirs.changed
        return None

    def _mark_synced(self, synced: dict[str, FolderRecord]) -> None:
        """The file now holds `synced`, which is `self.dirs`."""
        self._synced = synced
        dirs = self.dirs
        if isinstance(dirs, Records):
            dirs.changed = set()
            self._synced_from = dirs
        else:
            self._synced_from = None

    def disk_stat(self) -> tuple[int, int, int] | None:
        return self._disk[1] if self._disk is not None else None


def cache_key(rel: bytes) -> tuple[str, str]:
    """(folder key, name key) of a workspace-relative path in a StatCache."""
    parts = [encode_name(p) for p in rel.split(b"/") if p]
    return "/".join(parts[:-1]), parts[-1] if parts else ""


def join_key(folder: str, key: str) -> str:
    return folder + "/" + key if folder else key


# -- the caches this process holds ------------------------------------------------------------

# Cache file -> the cache this process last read or wrote there. Reusing the object skips parsing
# the file again; its record of the file's stat tells when another process has written the file
# since. Process-wide, so short-lived Snapshots objects share it.
_CACHES: dict[Path, StatCache] = {}
_CACHES_MAX = 16  # workspaces remembered; a long-lived worker serves many runs
_CACHES_LOCK = threading.Lock()


def load_cache(cache_path: Path | None) -> StatCache:
    """The cache kept at `cache_path` (an empty one when there is none): the object this process
    last read or wrote there when the file has not changed since, else the file parsed again."""
    if cache_path is None:
        return StatCache()
    cache_path = Path(cache_path)
    try:
        st = os.stat(cache_path)
    except FileNotFoundError:
        return StatCache()
    known = _CACHES.get(cache_path)
    if known is not None and known.disk_stat() == (st.st_ino, st.st_size, st.st_mtime_ns):
        return known
    return StatCache.load(cache_path)


def keep_cache(cache: StatCache, new: dict[str, FolderRecord], cache_path: Path | None) -> None:
    """Make `new` (a scan's records) the content of `cache`, and of the file at `cache_path`."""
    cache.dirs = new
    cache.generation += 1
    if cache_path is not None:
        cache_path = Path(cache_path)
        cache.sync_to(cache_path)
        with _CACHES_LOCK:
            _CACHES.pop(cache_path, None)
            _CACHES[cache_path] = cache
            while len(_CACHES) > _CACHES_MAX:
                _CACHES.pop(next(iter(_CACHES)))
