"""Content-addressed blob storage (sha256), shared by artifacts and checkpoints.

A blob lives at `<root>/<first 2 hex digits>/<other 62>`. It is written to a temporary file in the
store (name starting ".tmp-"), fsynced and renamed into place, so a reader never sees half a blob
and a crash leaves at most a stray temporary file, which `iter_digests` ignores and
`remove_stray_temp` deletes. Renames become durable once `sync()` has fsynced the directories
they touched; callers that write blobs referencing other blobs (checkpoint trees) call it between
writing the children and writing the parent.

`lock()` is an advisory flock on `<root>/.lock`: writers and readers take it shared, a prune takes
it exclusive, so a prune never deletes a blob that a checkpoint in progress has just found to be
already stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_HEX = "0123456789abcdef"
_TMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


def _is_digest(name: str, length: int = 64) -> bool:
    # strip() leaves nothing exactly when every character is a lowercase hex digit.
    return len(name) == length and not name.strip(_HEX)


class BlobStore:
    def __init__(self, root: str | Path | None = None):
        if root is None:
            # Imported here so the store (and the snapshots built on it) work without Django:
            # benchmarks and the snapshot tests use it on plain folders.
            from django.conf import settings  # noqa: PLC0415

            root = settings.SHIFTLOG["BLOB_ROOT"]
        self.root = Path(root)
        self._root_str = str(self.root)
        self._unsynced: set[Path] = set()
        self._unsynced_lock = threading.Lock()

    def path(self, digest: str) -> Path:
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return self.root / digest[:2] / digest[2:]

    def exists(self, digest: str) -> bool:
        # Plain strings: a checkpoint asks this once per changed folder, so it has to be cheap.
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return os.path.exists(f"{self._root_str}/{digest[:2]}/{digest[2:]}")

    def put(self, data: bytes) -> str:
        """Store `data` for a row about to name it (an artifact, a protected file's original).

        A blob already stored is marked as just used: it may be old enough for a prune, which
        cannot see the row before it is committed, but its grace period covers it now.
        """
        digest, added = self.add(data)
        if not added:
            with contextlib.suppress(FileNotFoundError):
                self.touch(digest)
        return digest

    def add(self, data: bytes) -> tuple[str, bool]:
        """Store `data`; returns (digest, whether it was newly written)."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        if target.exists():
            return digest, False
        self._mkdir(target.parent)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._mark_unsynced(target.parent)
        return digest, True

    def add_file(self, f: BinaryIO, *, small: int = _CHUNK) -> tuple[str, int, bool]:
        """Store the rest of the open file `f`, streamed: returns (digest, size, newly written).

        Content up to `small` bytes is handled in memory; anything longer is hashed while being
        copied to a temporary file, so a 100 MB file never sits in memory.
        """
        head = f.read(small + 1)
        if len(head) <= small:
            digest, added = self.add(head)
            return digest, len(head), added
        self.root.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256(head)
        size = len(head)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(head)
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                digest = h.hexdigest()
                target = self.path(digest)
                if target.exists():
                    os.unlink(tmp)
                    return digest, size, False
                out.flush()
                os.fsync(out.fileno())
            self._mkdir(target.parent)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._mark_unsynced(target.parent)
        return digest, size, True

    def get(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def open(self, digest: str) -> BinaryIO:
        return self.path(digest).open("rb")

    def check(self, digest: str) -> str | None:
        """What is wrong with a stored blob: missing, or content not hashing to its digest."""
        h = hashlib.sha256()
        try:
            with self.open(digest) as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        except FileNotFoundError:
            return f"blob {digest} is missing"
        if h.hexdigest() != digest:
            return f"blob {digest} is corrupt: its content hashes to {h.hexdigest()}"
        return None

    def read_head(self, digest: str, n: int) -> bytes:
        with self.open(digest) as f:
            return f.read(n)

    def touch(self, digest: str) -> None:
        """Mark a blob as recently used, so a prune's grace period covers it."""
        os.utime(self.path(digest))

    def delete(self, digest: str) -> bool:
        """Remove a blob; returns whether it was there. See Snapshots.prune for a safe order."""
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def iter_digests(self) -> Iterator[str]:
        """Every stored blob's digest; temporary files and anything else in the root are skipped."""
        try:
            top = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        for prefix in top:
            if not _is_digest(prefix, 2):
                continue
            try:
                names = sorted(os.listdir(self.root / prefix))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                if _is_digest(name, 62):
                    yield prefix + name

    def size_bytes(self) -> int:
        """Total size of the stored blobs (not counting directories or temporary files)."""
        total = 0
        for digest in self.iter_digests():
            with contextlib.suppress(FileNotFoundError):
                total += self.path(digest).stat().st_size
        return total

    def stray_temp_files(self) -> list[Path]:
        found = []
        for folder in [self.root, *self._fanout_dirs()]:
            with contextlib.suppress(FileNotFoundError):
                found += [p for p in folder.iterdir() if p.name.startswith(_TMP_PREFIX)]
        return found

    def remove_stray_temp(self, older_than_seconds: float = 3600.0) -> int:
        """Delete temporary files left by crashed writers (old enough not to be in use)."""
        cutoff = time.time() - older_than_seconds
        removed = 0
        for p in self.stray_temp_files():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed += 1
        return removed

    def sync(self) -> None:
        """Make the renames done so far durable (fsync the directories they touched)."""
        with self._unsynced_lock:
            dirs, self._unsynced = self._unsynced, set()
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def lock(self, *, exclusive: bool = False) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def _fanout_dirs(self) -> Iterator[Path]:
        with contextlib.suppress(FileNotFoundError):
            for p in self.root.iterdir():
                if _is_digest(p.name, 2) and p.is_dir():
                    yield p

    def _mkdir(self, folder: Path) -> None:
        if folder.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        folder.mkdir(exist_ok=True)
        # A new fan-out directory is itself a rename-like change to the root.
        self._mark_unsynced(self.root)

    def _mark_unsynced(self, folder: Path) -> None:
        with self._unsynced_lock:
            self._unsynced.add(folder)
