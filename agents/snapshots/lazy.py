"""A stat cache file read on demand, by a process that does not keep it (journal.borrow): the
file is indexed once per process and only what it gained since is indexed again (it is a log
that grows by appends), and a folder's record is parsed only when a scan asks for it: a rewind
from the web's process looks at a handful of the 611 folders of a 10,000-file workspace.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from agents.snapshots.cache import FolderRecord, StatCache

# A stat cache line's key (JSON-escaped); then, for a record (not a folder gone), its tree.
_LINE = re.compile(rb'\["((?:[^"\\]|\\.)*)",(?:"([0-9a-f]{64})",\[(\d+),(\d+),(\d+),(\d+)\])?')


def identity(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class LazyDirs(MutableMapping):
    """A stat cache's records by folder key as the file was at one size (a view of the process's
    index of it, which later reads only add to), each parsed from its line only when asked for.
    `stale` is the set of folders whose records hold entries not to be trusted (the journal's
    baseline says which)."""

    def __init__(self, index: _Index, size: int):
        self._index = index
        self._size = size
        self._recs: dict[str, FolderRecord] = {}  # parsed here, or given by the scan
        self._gone: set[str] = set()  # keys deleted here
        self.stale: set[str] = set()
        self._set: set[str] = set()  # keys given a new record (not their line's)

    @property
    def by_tree(self) -> dict[str, frozenset[str]]:
        """Tree digest -> keys of lines that named it (at any size: check the record's tree)."""
        return self._index.by_tree

    def __getitem__(self, key: str) -> FolderRecord:
        rec = self._recs.get(key)
        if rec is not None:
            return rec
        line = None if key in self._gone else self._index.line(key, self._size)
        if line is None:
            raise KeyError(key)
        parsed = self._index.parsed
        rec = parsed.get(key)
        if rec is None or rec._line is not line:
            m = _LINE.match(line)
            if m is None or m.group(2) is None:
                raise KeyError(key)  # a damaged line: the folder is looked at for real
            rec = _LineRecord(line, m.group(2).decode(), tuple(map(int, m.group(3, 4, 5, 6))))
            parsed[key] = rec
        self._recs[key] = rec
        return rec

    def __setitem__(self, key: str, rec: FolderRecord) -> None:
        self._recs[key] = rec
        self._gone.discard(key)
        self._set.add(key)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._recs.pop(key, None)
        self._gone.add(key)

    def __contains__(self, key: object) -> bool:
        if key in self._recs:
            return True
        return (
            isinstance(key, str)
            and key not in self._gone
            and self._index.line(key, self._size) is not None
        )

    def _all(self) -> set[str]:
        index, size = self._index, self._size
        keys = {k for k in list(index.lines) if index.line(k, size) is not None}
        return (keys - self._gone) | set(self._recs)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def copy(self) -> LazyDirs:
        new = LazyDirs(self._index, self._size)
        new._recs = dict(self._recs)
        new._gone = set(self._gone)
        new.stale = self.stale
        new._set = set(self._set)
        return new

    def stale_keys(self) -> set[str]:
        return set(self.stale)


class _LineRecord(FolderRecord):
    """A folder's record as its cache line gives it: its tree digest and totals read at once,
    the rest parsed when first asked for (a folder a scan only passes by never is)."""

    __slots__ = ("_full", "_line")

    def __init__(self, line: bytes, tree: str, totals: tuple[int, int, int, int]):
        self._line = line
        self._full: FolderRecord | None = None
        self.tree = tree
        self.totals = totals

    def _parsed(self) -> FolderRecord:
        if self._full is None:
            self._full = FolderRecord.from_json(json.loads(self._line))
        return self._full

    names = property(lambda self: self._parsed().names)
    keys = property(lambda self: self._parsed().keys)
    sig = property(lambda self: self._parsed().sig)
    vals = property(lambda self: self._parsed().vals)
    stale = property(lambda self: self._parsed().stale)
    subdirs = property(lambda self: self._parsed().subdirs)
    _entries = property(lambda self: self._parsed()._entries)
    entries = property(lambda self: self._parsed().entries)


class TreesOf:
    """Folder records by tree digest (what restore and diff look live trees up by) over LazyDirs,
    parsing a record only when its digest is asked for; `known` holds those a scan rebuilt."""

    def __init__(self, dirs: LazyDirs, known: dict[str, FolderRecord]):
        self.dirs = dirs
        self.known = known

    def get(self, digest: str, default: FolderRecord | None = None) -> FolderRecord | None:
        rec = self.known.get(digest)
        if rec is not None:
            return rec
        dirs = self.dirs
        for key in dirs.by_tree.get(digest, ()):
            if key in dirs._set:
                continue  # replaced by the scan: in `known` if it still has that digest
            try:
                rec = dirs[key]
            except KeyError:
                continue
            if rec.tree == digest:
                return rec
        return default

    def __getitem__(self, digest: str) -> FolderRecord:
        rec = self.get(digest)
        if rec is None:
            raise KeyError(digest)
        return rec

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, str) and self.get(digest) is not None


class CountsOf:
    """Files under each tree digest, for TreesOf."""

    def __init__(self, trees: TreesOf):
        self.trees = trees

    def get(self, digest: str, default: int = 0) -> int:
        rec = self.trees.get(digest)
        return rec.totals[0] if rec is not None else default


class _Index:
    """A stat cache file as indexed by this process, kept per file while its inode stays the
    same: the cache is a log that grows by appends (cache.StatCache.sync_to), so a read indexes
    only the lines added since the last. For each folder key, every line that named it with the
    offset where that line ends (None for "gone"); a view of the file at size S (LazyDirs) sees
    a key's last line ending at or before S. Lines are only ever added, so a read never copies
    the index and never changes what an earlier view sees. `by_tree`: tree digest -> keys of the
    lines that named it (a view checks the record it finds)."""

    __slots__ = ("by_tree", "ino", "lines", "parsed", "size")

    def __init__(self, ino: int):
        self.ino = ino
        self.size = 0
        self.lines: dict[str, list[tuple[int, bytes | None]]] = {}
        self.by_tree: dict[str, frozenset[str]] = {}
        self.parsed: dict[str, _LineRecord] = {}  # records parsed from a key's line, by key

    def line(self, key: str, size: int) -> bytes | None:
        """`key`'s line in the file as it was at `size` bytes (None: no such folder then)."""
        for end, line in reversed(self.lines.get(key, ())):
            if end <= size:
                return line
        return None

    def add(self, data: bytes, start: int) -> bool:
        """Index the complete lines `data` found at offset `start`; False when one cannot be read
        so (the caller drops the index: what this added is past every view's size)."""
        lines = self.lines
        new: dict[str, set[str]] = {}
        end = start
        for line in data.split(b"\n")[:-1]:
            end += len(line) + 1
            m = _LINE.match(line)
            if m is None:
                return False
            key = m.group(1)
            try:
                text = json.loads(b'"' + key + b'"') if b"\\" in key else key.decode()
            except ValueError:
                return False
            if m.group(2) is None:
                if len(line) != m.end() or not line.endswith(b"null]"):
                    return False
                lines.setdefault(text, []).append((end, None))
                continue
            lines.setdefault(text, []).append((end, line))
            new.setdefault(m.group(2).decode(), set()).add(text)
        by_tree = self.by_tree
        for digest, keys in new.items():  # replaced, never changed: a view may be iterating
            by_tree[digest] = by_tree.get(digest, _NONE) | keys
        return True


_NONE: frozenset[str] = frozenset()
_INDEXES: dict[Path, _Index] = {}
_INDEXES_MAX = 16
_INDEXING = threading.Lock()  # one thread adds to the indexes at a time


def _indexed(path: Path, f, st: os.stat_result) -> _Index | None:
    """The index of the open cache file `f` (stat `st`), this process's last one with the lines
    added since when the file has only grown."""
    header = StatCache.HEADER.encode() + b"\n"
    with _INDEXING:
        index = _INDEXES.get(path)
        if index is not None and index.ino == st.st_ino and 0 < index.size <= st.st_size:
            if index.size < st.st_size:
                f.seek(index.size - 1)
                tail = f.read()
                if len(tail) != st.st_size - index.size + 1 or not tail.startswith(b"\n"):
                    return None
                if not tail.endswith(b"\n") or not index.add(tail[1:], index.size):
                    _INDEXES.pop(path, None)
                    return None
        else:
            data = f.read()
            if len(data) != st.st_size or not data.startswith(header) or not data.endswith(b"\n"):
                return None
            index = _Index(st.st_ino)
            if not index.add(data[len(header) :], len(header)):
                return None
        index.size = st.st_size
        _INDEXES.pop(path, None)
        _INDEXES[path] = index
        while len(_INDEXES) > _INDEXES_MAX:
            _INDEXES.pop(next(iter(_INDEXES)))
        return index


def load_lazy(
    cache_path: Path, cache_id: tuple[int, int, int], stale: set[str] = frozenset()
) -> StatCache | None:
    """The cache file at `cache_path` as a StatCache whose records are parsed on demand, if it is
    still exactly `cache_id`; else None. Never used to write the file."""
    cache_path = Path(cache_path)
    try:
        with open(cache_path, "rb") as f:
            st = os.fstat(f.fileno())
            if tuple(identity(st)) != tuple(cache_id):
                return None
            index = _indexed(cache_path, f, st)
    except OSError:
        return None
    if index is None or index.line("", st.st_size) is None:
        return None
    dirs = LazyDirs(index, st.st_size)
    dirs.stale = set(stale)
    cache = StatCache()
    cache.dirs = dirs  # type: ignore[assignment]
    return cache
