"""Export a checkpoint: its workspace as a .tar.gz, and the change between two checkpoints (or a
checkpoint and the live workspace) as a patch `git apply` accepts.

    workspace_tar(cp, out)        write the .tar.gz to a binary file; returns the bytes written
    tar_chunks(cp)                the same, in pieces (a web response streams them)
    patch(a, b) / patch_chunks(a, b)   b=None: a's run's live workspace; a and b may be of two runs
    tar_name(cp), patch_name(a, b)     file names without their extension

Both check before their first byte that the trees can be read and every blob is in the store, and
raise ExportError if not; later problems (a blob not matching its digest, a live file that changed
or was swapped for a symlink) raise ExportError while streaming, so a download breaks off instead
of ending with wrong content.

The tar is read from the blob store only (it works after the workspace is gone): entries in the
tree's order under one folder named after the checkpoint, modes kept, symlinks as symlinks, empty
folders, names byte for byte (GNU format), owner 0:0 and every mtime the checkpoint's time, gzip
without a name or time: two exports of one checkpoint are the same bytes. Files are streamed in
pieces and their digest checked as they go, so memory stays small whatever their size.

The patch is what `git diff --binary --full-index` would write (see the `git*` helpers): text
files (UTF-8, no NUL, at most 1 MiB a side) as unified hunks, everything else as `GIT binary
patch` literals both ways (so `git apply -R` works), symlinks as mode 120000 with the target as
content, a change of type as a deletion and a creation, paths quoted as git quotes them. What a
git patch cannot carry (empty folders, folder modes, permission bits other than the owner's x
bit, anything inside a `.git` folder) is listed in the lines before the first `diff --git`, which
`git apply` skips.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import errno
import hashlib
import os
import tarfile
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agents import workspaces
from agents.models import Checkpoint
from agents.snapshots import TEXT_DIFF_MAX_INPUT, Change, SnapshotError
from agents.snapshots.beneath import open_beneath
from agents.snapshots.names import to_bytes

CHUNK = 1 << 16
# Bytes of deflated data turned into base85 at once (pure Python: its lists are large).
B85_BATCH = 52 * 128
GZIP_LEVEL = 6
NOTES_LISTED = 20
ZERO_ID = "0" * 40


class ExportError(Exception):
    """The export cannot be made (before the first byte) or cannot go on (while streaming)."""


# --- names ------------------------------------------------------------------------------------
def _number(cp: Checkpoint) -> int:
    return cp.number  # its number within its run, as pages and commands name it


def tar_name(cp: Checkpoint) -> str:
    return f"run-{cp.run_id}-checkpoint-{_number(cp)}"


def patch_name(a: Checkpoint, b: Checkpoint | None) -> str:
    if b is None:
        return f"{tar_name(a)}-to-live"
    if b.run_id == a.run_id:
        return f"{tar_name(a)}-to-{_number(b)}"
    return f"{tar_name(a)}-to-{tar_name(b)}"


# --- the tar ----------------------------------------------------------------------------------
def workspace_tar(cp: Checkpoint, out: BinaryIO) -> int:
    """Write checkpoint `cp`'s workspace to `out` as a .tar.gz; returns the bytes written."""
    written = 0
    for chunk in tar_chunks(cp):
        out.write(chunk)
        written += len(chunk)
    return written


def tar_chunks(cp: Checkpoint) -> Generator[bytes, None, None]:
    """The .tar.gz of checkpoint `cp`'s workspace, in pieces. Checks the store first."""
    snaps = workspaces.store()
    try:
        entries = list(snaps.files(cp.tree).values())
    except (SnapshotError, OSError) as e:
        raise ExportError(f"checkpoint {_number(cp)}'s tree cannot be read: {e}") from None
    for e in entries:
        if e.type == "f" and not snaps.blobs.exists(e.hash):
            raise ExportError(f"{_shown(e.path)}: blob {e.hash} is not in the store")
    return _tar_stream(snaps.blobs, entries, tar_name(cp), int(cp.created_at.timestamp()))


def _tar_stream(blobs, entries, top: str, mtime: int) -> Generator[bytes, None, None]:
    gz = _Gzip()
    yield gz.feed(_header(top, tarfile.DIRTYPE, 0o755, mtime))
    for e in entries:
        name = f"{top}/{e.path}"
        if e.type == "d":
            yield gz.feed(_header(name, tarfile.DIRTYPE, e.mode, mtime))
        elif e.type == "l":
            yield gz.feed(_header(name, tarfile.SYMTYPE, 0o777, mtime, linkname=e.target))
        else:
            yield gz.feed(_header(name, tarfile.REGTYPE, e.mode, mtime, size=e.size))
            for piece in _blob_pieces(blobs, e.hash, e.size, e.path):
                yield gz.feed(piece)
            yield gz.feed(b"\0" * (-e.size % tarfile.BLOCKSIZE))
    # Two empty blocks end the archive; tar pads it to a whole record.
    yield gz.feed(b"\0" * (2 * tarfile.BLOCKSIZE))
    yield gz.finish()


def _header(name: str, kind: bytes, mode: int, mtime: int, *, size=0, linkname="") -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.size = size
    info.linkname = linkname
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    # GNU format writes names as their raw bytes (surrogateescape gives them back), any length.
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


class _Gzip:
    """gzip without a file name or time in its header, handed out in pieces of about CHUNK."""

    def __init__(self):
        # wbits 31: a gzip wrapper whose header zlib writes with mtime 0 and no name.
        self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        self._tar_bytes = 0

    def feed(self, data: bytes) -> bytes:
        self._tar_bytes += len(data)
        return self._z.compress(data)

    def finish(self) -> bytes:
        pad = -self._tar_bytes % tarfile.RECORDSIZE
        return self._z.compress(b"\0" * pad) + self._z.flush()


def _blob_pieces(blobs, digest: str, size: int, path: str) -> Iterator[bytes]:
    """A stored file's content in pieces, checked against its digest and size as it goes."""
    h = hashlib.sha256()
    got = 0
    try:
        f = blobs.open(digest)
    except FileNotFoundError:
        raise ExportError(f"{_shown(path)}: blob {digest} went missing from the store") from None
    with f:
        while piece := f.read(CHUNK):
            got += len(piece)
            if got > size:
                break
            h.update(piece)
            yield piece
    if got != size or h.hexdigest() != digest:
        raise ExportError(f"{_shown(path)}: blob {digest} is corrupt (its content does not match)")


# --- the patch --------------------------------------------------------------------------------
@dataclass
class _Side:
    """One side of a file's change: a regular file or a symlink, where its content comes from."""

    kind: str  # "f" or "l"
    mode: int  # git's: 100644, 100755 or 120000
    size: int
    digest: str | None = None  # sha256 of the content (files)
    link: bytes | None = None  # the target (symlinks)
    live: Path | None = None  # a live workspace the file is read from (the new side only)
    path: bytes = b""

    def pieces(self, blobs) -> Iterator[bytes]:
        if self.link is not None:
            yield self.link
        elif self.live is not None:
            yield from _live_pieces(self.live, self.path, self.digest)
        else:
            yield from _blob_pieces(blobs, self.digest, self.size, _to_str(self.path))

    def read(self, blobs) -> bytes:
        return b"".join(self.pieces(blobs))


def patch(a: Checkpoint, b: Checkpoint | None) -> bytes:
    """The patch from checkpoint a to b (b=None: a's run's workspace as it is now)."""
    return b"".join(patch_chunks(a, b))


def patch_chunks(a: Checkpoint, b: Checkpoint | None) -> Generator[bytes, None, None]:
    """The patch from a to b in pieces. Checks trees, blobs and the workspace first."""
    snaps = workspaces.store()
    live = None
    try:
        if b is None and workspaces.cached() and (tree := workspaces.committed_tree(a.run)):
            changes = snaps.diff(a.tree, tree, text_diffs=False)  # the last committed state
        elif b is None:
            live = Path(a.run.workspace_path)
            if not live.is_dir():
                raise ExportError(f"run {a.run_id}'s workspace is not there any more")
            changes = workspaces.diff_live(a.run, a.tree, text_diffs=False)
        else:
            changes = snaps.diff(a.tree, b.tree, text_diffs=False)
    except (SnapshotError, OSError) as e:
        raise ExportError(f"the checkpoints cannot be compared: {e}") from None
    plan = _Plan(changes, live)
    for side in plan.stored_sides():
        if not snaps.blobs.exists(side.digest):
            raise ExportError(
                f"{_shown(_to_str(side.path))}: blob {side.digest} is not in the store"
            )
    head = _notes(a, b, plan)
    return _patch_stream(snaps.blobs, head, plan)


class _Plan:
    """What goes into the patch: (path, old side, new side) per file, and what cannot."""

    def __init__(self, changes: list[Change], live: Path | None):
        self.files: list[tuple[bytes, _Side | None, _Side | None]] = []
        self.empty_dirs: list[str] = []
        self.dir_modes: list[str] = []
        self.perms: list[str] = []
        self.git_paths = 0
        paths = [to_bytes(c.path) for c in changes]
        for i, c in enumerate(changes):
            raw = paths[i]
            if _in_dot_git(raw):
                self.git_paths += 1
                continue
            old = _side(c, "old", raw, None)
            new = _side(c, "new", raw, live)
            if c.old_type == "d" or c.new_type == "d":
                self._folder(c, raw, paths[i + 1] if i + 1 < len(paths) else b"")
            if old is None and new is None:
                continue
            if old and new and old.mode == new.mode and c.old_mode != c.new_mode:
                self.perms.append(f"{git_quote(raw)} {c.old_mode:04o} -> {c.new_mode:04o}")
                if old.digest == new.digest and old.link == new.link:
                    continue
            elif new is not None and new.kind == "f" and c.new_mode not in (0o644, 0o755):
                self.perms.append(f"{git_quote(raw)} {c.new_mode:04o} (git gives {new.mode:o})")
            self.files.append((raw, old, new))

    def _folder(self, c: Change, raw: bytes, following: bytes) -> None:
        # Changes come depth first: what a folder holds follows it at once.
        empty = not following.startswith(raw + b"/")
        if c.status == "mode_changed":
            self.dir_modes.append(f"{git_quote(raw)} {c.old_mode:04o} -> {c.new_mode:04o}")
        elif empty and c.new_type == "d":
            self.empty_dirs.append(f"{git_quote(raw)} (empty, added)")
        elif empty and c.old_type == "d":
            self.empty_dirs.append(f"{git_quote(raw)} (empty, removed)")

    def stored_sides(self) -> Iterator[_Side]:
        for _, old, new in self.files:
            for side in (old, new):
                if side is not None and side.kind == "f" and side.live is None:
                    yield side


def _side(c: Change, prefix: str, raw: bytes, live: Path | None) -> _Side | None:
    kind = getattr(c, f"{prefix}_type")
    if kind == "l":
        target = to_bytes(getattr(c, f"{prefix}_target"))
        return _Side("l", 0o120000, len(target), link=target, path=raw)
    if kind != "f":
        return None
    mode = 0o100755 if getattr(c, f"{prefix}_mode") & 0o100 else 0o100644
    return _Side(
        "f",
        mode,
        getattr(c, f"{prefix}_size"),
        digest=getattr(c, f"{prefix}_hash"),
        live=live,
        path=raw,
    )


def _in_dot_git(raw: bytes) -> bool:
    # git refuses to touch these (case-insensitively, and NTFS's spellings of them too).
    for part in raw.split(b"/"):
        low = part.lower().rstrip(b" .")
        if low in (b".git", b"git~1"):
            return True
    return False


def _notes(a: Checkpoint, b: Checkpoint | None, plan: _Plan) -> bytes:
    to = "the live workspace" if b is None else f"run {b.run_id} checkpoint {_number(b)}"
    lines = [
        f"Shiftlog patch: run {a.run_id} checkpoint {_number(a)} to {to}.",
        "Apply it with `git apply` (`git apply -R` undoes it); these lines are skipped.",
    ]
    lost = [
        ("Empty folders (not created or removed by git apply)", plan.empty_dirs),
        ("Folder modes (not carried)", plan.dir_modes),
        ("Permission bits other than the owner's x bit (not carried)", plan.perms),
    ]
    if any(items for _, items in lost) or plan.git_paths:
        lines.append("What this patch cannot carry:")
    for title, items in lost:
        if not items:
            continue
        lines.append(f"  {title}: {len(items)}")
        lines += [f"    {item}" for item in items[:NOTES_LISTED]]
        if len(items) > NOTES_LISTED:
            lines.append(f"    and {len(items) - NOTES_LISTED} more")
    if plan.git_paths:
        lines.append(f"  Changes inside .git folders, left out: {plan.git_paths}")
    if not plan.files:
        lines.append("No file changes: `git apply` finds no patch in it (it says so).")
    return ("\n".join(lines) + "\n\n").encode("ascii", "backslashreplace")


def _patch_stream(blobs, head: bytes, plan: _Plan) -> Generator[bytes, None, None]:
    yield head
    for raw, old, new in plan.files:
        if old is not None and new is not None and old.kind != new.kind:
            yield from _file_diff(blobs, raw, old, None)
            yield from _file_diff(blobs, raw, None, new)
        else:
            yield from _file_diff(blobs, raw, old, new)


def _file_diff(blobs, raw: bytes, old: _Side | None, new: _Side | None) -> Iterator[bytes]:
    a_name, b_name = git_quote(b"a/" + raw), git_quote(b"b/" + raw)
    head = [f"diff --git {a_name} {b_name}"]
    if old is None:
        head.append(f"new file mode {new.mode:o}")
    elif new is None:
        head.append(f"deleted file mode {old.mode:o}")
    elif old.mode != new.mode:
        head += [f"old mode {old.mode:o}", f"new mode {new.mode:o}"]
    same = old is not None and new is not None and old.digest == new.digest and old.link == new.link
    if same:  # only the x bit changed
        yield _ascii(head)
        return
    small = max(old.size if old else 0, new.size if new else 0) <= TEXT_DIFF_MAX_INPUT
    old_data = old.read(blobs) if old is not None and small else b""
    new_data = new.read(blobs) if new is not None and small else b""
    if small:
        old_id, new_id = git_blob_id(old_data, old), git_blob_id(new_data, new)
    else:
        old_id, new_id = _streamed_id(blobs, old), _streamed_id(blobs, new)
    mode = f" {new.mode:o}" if old is not None and new is not None and old.mode == new.mode else ""
    head.append(f"index {old_id}..{new_id}{mode}")
    old_text = _text(old_data) if small else None
    new_text = _text(new_data) if small else None
    if old_text is not None and new_text is not None:
        if old_data == new_data:  # an empty file created or deleted: no hunk
            yield _ascii(head)
            return
        tab = "\t" if b" " in raw else ""
        head.append(f"--- {a_name if old else '/dev/null'}{tab if old else ''}")
        head.append(f"+++ {b_name if new else '/dev/null'}{tab if new else ''}")
        yield _ascii(head)
        yield unified_hunks(old_text, new_text).encode("utf-8")
        return
    head.append("GIT binary patch")
    yield _ascii(head)
    if small:
        yield from binary_literal([new_data], len(new_data))
        yield from binary_literal([old_data], len(old_data))
    else:
        yield from binary_literal(new.pieces(blobs) if new else [], new.size if new else 0)
        yield from binary_literal(old.pieces(blobs) if old else [], old.size if old else 0)


def _streamed_id(blobs, side: _Side | None) -> str:
    if side is None:
        return ZERO_ID
    h = hashlib.sha1(f"blob {side.size}\0".encode())
    for piece in side.pieces(blobs):
        h.update(piece)
    return h.hexdigest()


def _text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _ascii(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("ascii")


# --- git's formats ----------------------------------------------------------------------------
def git_blob_id(data: bytes, side: _Side | None = None) -> str:
    """git's object id of a blob holding `data` (all zeros for a side that does not exist)."""
    if side is None:
        return ZERO_ID
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def git_quote(raw: bytes) -> str:
    """A path as git writes it with core.quotePath on: as is, or in double quotes with C escapes
    for control characters, `"`, `\\`, DEL and every byte above 0x7f (octal)."""
    if not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in raw):
        return raw.decode("ascii")
    out = []
    for b in raw:
        if b in _ESCAPES:
            out.append("\\" + _ESCAPES[b])
        elif b < 0x20 or b >= 0x7F:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    return '"' + "".join(out) + '"'


_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 0x22: '"', 0x5C: "\\"}


def _lines(text: str) -> list[str]:
    """Lines split on "\\n" only, as git does (not on \\r or the other breaks Python knows)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_hunks(old: str, new: str) -> str:
    """The hunks of a unified diff (three lines of context), with git's no-newline marker."""
    out = []
    hunks = difflib.unified_diff(_lines(old), _lines(new), lineterm="\n", n=3)
    for i, line in enumerate(hunks):
        if i < 2:  # difflib's own ---/+++ lines: the caller writes git's
            continue
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def binary_literal(pieces, size: int) -> Iterator[bytes]:
    """A `literal` hunk of a GIT binary patch: the size, then the zlib-deflated content in
    base85 lines of 52 bytes (a length letter, then the encoded bytes), then a blank line.
    Streamed: `size` leads the hunk, so it is given (and checked at the end)."""
    z = zlib.compressobj(9)
    got = 0
    pending = b""
    yield f"literal {size}\n".encode("ascii")
    for piece in pieces:
        got += len(piece)
        pending += z.compress(piece)
        while len(pending) >= B85_BATCH:
            yield _b85_lines(pending[:B85_BATCH])
            pending = pending[B85_BATCH:]
    if got != size:
        raise ExportError(f"a file's size changed from {size} to {got} bytes while exporting")
    yield _b85_lines(pending + z.flush()) + b"\n"


def _b85_lines(data: bytes) -> bytes:
    # Whole lines of 52 bytes are 13 words: encoded at once, they cut into lines of 65 characters.
    whole = len(data) - len(data) % 52
    text = base64.b85encode(data[:whole])
    out = [b"z" + text[i : i + 65] + b"\n" for i in range(0, len(text), 65)]
    if whole < len(data):
        n = len(data) - whole
        letter = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)
        out.append(letter.encode("ascii") + base64.b85encode(data[whole:], pad=True) + b"\n")
    return b"".join(out)


# --- the live workspace -----------------------------------------------------------------------
def _live_pieces(root: Path, raw: bytes, digest: str | None) -> Iterator[bytes]:
    """A live file's content, opened without following a symlink at any level and checked
    against the hash the diff saw: an agent may change it, or swap a folder for a symlink."""
    shown = _shown(_to_str(raw))
    try:
        fd = open_beneath(root, raw)
    except OSError as e:
        raise ExportError(f"{shown} cannot be read from the workspace: {_why(e)}") from None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while piece := f.read(CHUNK):
            h.update(piece)
            yield piece
    if h.hexdigest() != digest:
        raise ExportError(f"{shown} changed in the workspace while it was being exported")


def _why(e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symlink stands where a folder or file was"
    return e.strerror or str(e)


def _to_str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _shown(path: str) -> str:
    with contextlib.suppress(UnicodeEncodeError):
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return repr(path)
