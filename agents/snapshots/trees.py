"""The tree format, and reading checkpoints' trees back from the store.

A directory is a tree blob: the line b"shiftlog-tree 1\\n" followed by canonical JSON (sorted
keys, compact, UTF-8) of {name: entry}, where an entry is
    {"t": "f", "h": <content blob>, "m": <st_mode & 0o7777>, "s": <size>}   regular file
    {"t": "d", "h": <child tree blob>, "m": <mode>}                         directory
    {"t": "l", "target": <link target, encoded like a name>}                symlink (never followed)
Names and link targets are encoded as names.py describes, so every name round-trips byte for
byte. A checkpoint is its root tree's digest; empty folders are empty trees. The magic line lets
maintenance code tell trees from file contents without any other index. The bytes of a tree (so
its digest) depend only on its entries: existing stores keep working only as long as
`tree_bytes` writes exactly these bytes.
"""

from __future__ import annotations

import json
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents.blobstore import BlobStoreBackend
from agents.snapshots.errors import CorruptBlob, MissingBlob
from agents.snapshots.names import decode_name, display, encode_name, join_path, to_bytes, to_str
from agents.snapshots.results import Entry

TREE_MAGIC = b"shiftlog-tree 1\n"


def tree_bytes(entries: dict[str, Any]) -> bytes:
    body = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return TREE_MAGIC + body.encode("utf-8")


def entries_of(keys: list[str], sig: list[tuple], vals: list[str | None]) -> dict[str, Any]:
    """The tree object of a folder from its stat cache record's parallel lists (see cache.py)."""
    entries: dict[str, Any] = {}
    for key, s, val in zip(keys, sig, vals, strict=True):
        if val is None:
            continue
        fmt = stat.S_IFMT(s[0])
        if fmt == stat.S_IFREG:
            entries[key] = {"t": "f", "h": val, "m": s[0] & 0o7777, "s": s[1]}
        elif fmt == stat.S_IFDIR:
            entries[key] = {"t": "d", "h": val, "m": s[0] & 0o7777}
        elif fmt == stat.S_IFLNK:
            entries[key] = {"t": "l", "target": val}
    return entries


def parse_tree(digest: str, data: bytes) -> dict[str, Any]:
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


def entry_of(path: str, e: dict[str, Any]) -> Entry:
    if e["t"] == "l":
        return Entry(path, "l", target=to_str(decode_name(e["target"])))
    return Entry(path, e["t"], hash=e["h"], mode=e["m"], size=e.get("s"))


class TreeReader:
    """Trees read from the store by digest, parsed and checked, the most recent ones kept in
    memory. Callers hold the store's lock (shared, or exclusive for prune)."""

    MAX_CACHED = 20_000

    def __init__(self, blobs: BlobStoreBackend):
        self.blobs = blobs
        self._cache: dict[str, dict[str, Any]] = {}

    def get(self, digest: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The entries of tree `digest`: from `extra` (trees of a live workspace, by digest:
        cache.FolderRecord objects, which need not be stored) if there, else from the store."""
        if extra is not None:
            rec = extra.get(digest)
            if rec is not None:
                return rec.entries
        cached = self._cache.get(digest)
        if cached is not None:
            return cached
        try:
            data = self.blobs.get(digest)
        except FileNotFoundError:
            raise MissingBlob(f"tree {digest} is not in the store") from None
        entries = parse_tree(digest, data)
        if len(self._cache) > self.MAX_CACHED:
            self._cache.clear()
        self._cache[digest] = entries
        return entries

    def warm(self, tree: str, skip: dict[str, Any], workers: int) -> None:
        """Read the trees under `tree` (not those in `skip`, nor below them) a level at a time,
        in `workers` threads: over a network (the S3 store) one round trip per level instead of
        one per tree. A tree that cannot be read is left for `get` to report."""
        level, seen = [tree], set()
        with ThreadPoolExecutor(workers) as pool:
            while level:
                todo = [d for d in level if d not in skip and d not in seen]
                seen.update(todo)
                level = []
                for entries in pool.map(self._get_quietly, todo):
                    level += [e["h"] for e in (entries or {}).values() if e["t"] == "d"]

    def _get_quietly(self, digest: str) -> dict[str, Any] | None:
        try:
            return self.get(digest)
        except Exception:
            return None

    def forget(self, digest: str) -> None:
        """Drop a tree the store no longer holds."""
        self._cache.pop(digest, None)

    def files(self, tree: str) -> dict[str, Entry]:
        """Every path in the checkpoint (folders included) -> its entry."""
        out: dict[str, Entry] = {}
        with self.blobs.lock():
            self._list(tree, b"", out)
        return out

    def _list(self, digest: str, rel: bytes, out: dict[str, Entry]) -> None:
        for key, e in sorted(self.get(digest).items(), key=lambda kv: decode_name(kv[0])):
            path = join_path(rel, decode_name(key))
            out[to_str(path)] = entry_of(to_str(path), e)
            if e["t"] == "d":
                self._list(e["h"], path, out)

    def read(self, tree: str, path: str | bytes) -> bytes:
        """Content of the file at `path` in the checkpoint."""
        parts = [p for p in to_bytes(path).split(b"/") if p]
        if not parts:
            raise IsADirectoryError(path)
        with self.blobs.lock():
            entries = self.get(tree)
            for i, part in enumerate(parts):
                e = entries.get(encode_name(part))
                if e is None:
                    raise FileNotFoundError(path)
                if i < len(parts) - 1:
                    if e["t"] != "d":
                        raise NotADirectoryError(path)
                    entries = self.get(e["h"])
                elif e["t"] == "d":
                    raise IsADirectoryError(path)
                elif e["t"] == "l":
                    raise ValueError(f"{display(to_str(to_bytes(path)))} is a symlink")
            return self.blobs.get(e["h"])
