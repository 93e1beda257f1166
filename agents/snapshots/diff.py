"""Diff: what changed between two checkpoints, or a checkpoint and a live workspace.

Only subtrees whose digests differ are walked. A live side is scanned without storing anything:
its trees are kept by digest, and its files' contents are read from the workspace when the store
does not hold them.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from pathlib import Path
from typing import Any

from agents.blobstore import BlobStoreBackend
from agents.snapshots.beneath import FILE_FLAGS
from agents.snapshots.cache import FolderRecord, load_cache
from agents.snapshots.errors import MissingBlob
from agents.snapshots.names import decode_name, display, join_path, to_str
from agents.snapshots.results import Change
from agents.snapshots.scan import Scanner
from agents.snapshots.trees import TreeReader

TEXT_DIFF_MAX_INPUT = 1 << 20


class ChangedMeanwhile(Exception):
    """A live file no longer holds what the scan read from it."""


def _live_content(path: bytes, digest: str) -> bytes:
    """A live file's content, as the scan hashed it: opened without following a link at its
    end, and shown only if it still hashes to `digest` (the scan only hashes files inside the
    workspace, so whatever a link swapped in since is never shown)."""
    try:
        fd = os.open(path, FILE_FLAGS)
    except OSError as e:
        raise ChangedMeanwhile(str(e)) from None
    with open(fd, "rb", buffering=0) as f:
        data = f.read(TEXT_DIFF_MAX_INPUT + 1)
    if hashlib.sha256(data).hexdigest() != digest:
        raise ChangedMeanwhile(to_str(path))
    return data


class Differ:
    """Compares two sides, each a checkpoint, a live workspace or nothing."""

    def __init__(self, blobs: BlobStoreBackend, trees: TreeReader, scanner: Scanner):
        self.blobs = blobs
        self.trees = trees
        self.scanner = scanner

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
        scan = self.scanner.scan(Path(side), cache, cache_path, store=False, live_paths=True)
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
        old = self.trees.get(a, extra) if a else {}
        new = self.trees.get(b, extra) if b else {}
        for key in sorted(old.keys() | new.keys(), key=decode_name):
            o, n = old.get(key), new.get(key)
            if o == n:
                continue
            path = join_path(rel, decode_name(key))
            c = change_of(to_str(path), o, n)
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
                return _live_content(live[digest], digest)
            raise MissingBlob(f"blob {digest} is not in the store") from None

    def _text_diff(self, c: Change, live: dict[str, bytes], limit: int) -> None:
        if max(c.old_size or 0, c.new_size or 0) > TEXT_DIFF_MAX_INPUT:
            c.note = f"too large for a text diff (over {TEXT_DIFF_MAX_INPUT} bytes)"
            return
        try:
            old = self._content(c.old_hash, live) if c.old_hash else b""
            new = self._content(c.new_hash, live) if c.new_hash else b""
        except ChangedMeanwhile:
            c.note = "changed in the workspace while the diff was made: reload to see it"
            return
        old_text, new_text = is_text(old), is_text(new)
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


def is_text(data: bytes) -> str | None:
    """`data` as text when it is UTF-8 without NUL bytes, else None (compared as binary)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def change_of(path: str, o: dict[str, Any] | None, n: dict[str, Any] | None) -> Change:
    """The change at `path` from tree entry `o` to `n` (either may be None: added, removed)."""
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
