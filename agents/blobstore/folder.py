"""The folder blob store (the embedded default): content-addressed (sha256) files in a folder.

A blob lives at `<root>/<first 2 hex digits>/<other 62>`. It is written to a temporary file in the
store (name starting ".tmp-"), fsynced and renamed into place, so a reader never sees half a blob
and a crash leaves at most a stray temporary file, which `iter_digests` ignores and
`remove_stray_temp` deletes. Renames become durable once `sync()` has fsynced the directories
they touched; callers that write blobs referencing other blobs (checkpoint trees) call it between
writing the children and writing the parent.

`batch()` writes many blobs with a constant number of durability barriers instead of one fsync
each (checkpoints use it; see Batch).

`lock()` is an advisory flock on `<root>/.lock`: writers and readers take it shared, a prune takes
it exclusive, so a prune never deletes a blob that a checkpoint in progress has just found to be
already stored.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from agents.blobstore.errors import BlobStoreUnavailable

_HEX = "0123456789abcdef"
_TMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


def _sync_file_range():
    """libc's sync_file_range (Linux), to start writing a file back without waiting; or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int) -> None:
    # Only a hint (the barrier's fsync is what makes the data durable): the disk starts on it
    # while the next files are read, so the barrier mostly finds it written already.
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def read_all(fd: int) -> bytes:
    """The whole of an open file's content (a stored blob: it does not change)."""
    size = os.fstat(fd).st_size
    parts = []
    while size > 0 and (chunk := os.read(fd, size)):
        parts.append(chunk)
        size -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)  # (no parts: an empty blob)


def _is_digest(name: str, length: int = 64) -> bool:
    # strip() leaves nothing exactly when every character is a lowercase hex digit.
    return len(name) == length and not name.strip(_HEX)


class BlobStore:
    """The folder backend of base.BlobStoreBackend (see the module docstring)."""

    remote = False  # reads are cheap: nothing gains from reading ahead in threads
    workers = 1  # (how many reads a remote store makes at once)

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
        return Path(self._where(digest))

    def _where(self, digest: str) -> str:
        # Plain strings: a checkpoint asks `exists` once per changed folder and a rewind `get`s
        # a tree per folder on its changed paths, so both have to be cheap.
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return f"{self._root_str}/{digest[:2]}/{digest[2:]}"

    def exists(self, digest: str) -> bool:
        return os.path.exists(self._where(digest))

    def describe(self) -> str:
        """Where the blobs are, for messages."""
        return self._root_str

    def check_ready(self) -> None:
        """Raise BlobStoreUnavailable unless the root is a folder this process can write to."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TMP_PREFIX)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise BlobStoreUnavailable(f"{self.root}: {e.strerror or e}") from None

    def mtime(self, digest: str) -> float:
        """When the blob was stored or last marked as used (FileNotFoundError if missing)."""
        return self.path(digest).stat().st_mtime

    def listing(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, mtime) of every stored blob (see iter_digests)."""
        for digest in self.iter_digests():
            with contextlib.suppress(FileNotFoundError):
                st = self.path(digest).stat()
                yield digest, st.st_size, st.st_mtime

    @contextlib.contextmanager
    def prefetched(self, digests: Iterable[str]) -> Iterator[None]:
        """Blobs about to be read one after another (a restore): nothing to do in a folder."""
        yield

    def put(self, data: bytes) -> str:
        """Store `data` for a row about to name it (an artifact, a protected file's original).

        A blob already stored is marked as just used: it may be old enough for a prune, which
        cannot see the row before it is committed, but its grace period covers it now; one that
        a prune deleted between the two is stored again.
        """
        digest, added = self.add(data)
        if not added:
            try:
                self.touch(digest)
            except FileNotFoundError:  # a prune took it after add() looked: store it again
                self.add(data)
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

    def batch(self, *, workers: int = 1) -> Batch:
        """A Batch of new blobs, made durable together by its commit()."""
        return Batch(self, workers=workers)

    def get(self, digest: str) -> bytes:
        # A plain descriptor: in a process that sat idle each system call is dear, and a
        # buffered file object makes twice as many as open, fstat, read and close.
        fd = os.open(self._where(digest), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return read_all(fd)
        finally:
            os.close(fd)

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
        _fsync_all([str(d) for d in dirs])

    @contextlib.contextmanager
    def lock(self, *, exclusive: bool = False) -> Iterator[None]:
        lock = f"{self._root_str}/.lock"
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(lock, flags, 0o644)
        except FileNotFoundError:  # a new store: its folder first
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, flags, 0o644)
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


class Batch:
    """New blobs written together and made durable together: two barriers per batch, however many
    blobs, where `add` costs one fsync per blob.

    `add` and `add_file` write each new blob to a temporary file (named ".tmp-" in the store, so
    a crash leaves only stray temporary files) and start its write-back; nothing is named yet, so
    readers and `exists` see no blob of the batch until `commit`. `commit`: 1. fsyncs every
    temporary file (the first fsync commits the filesystem's journal for all of them, so the
    others mostly only check), 2. renames them into place in the order they were added, 3.
    fsyncs the directories the renames touched. A blob is never named before its content is
    durable. Renames become durable in the order they are made on filesystems that journal
    metadata in order (ext4, XFS): a caller that adds children before the blobs naming them (a
    checkpoint adds file blobs, then trees children first) never leaves a named blob whose
    children are missing after a power cut. `abort` deletes what was written. Thread-safe: a
    checkpoint's hashing threads add to one batch.
    """

    def __init__(self, store: BlobStore, *, workers: int = 1):
        self.store = store
        self.workers = workers
        self._pending: dict[str, str] = {}  # digest -> its temporary file, in the order added
        self._lock = threading.Lock()
        self.added_bytes = 0

    def __len__(self) -> int:
        return len(self._pending)

    def exists(self, digest: str, *, ask: bool = True) -> bool:
        """Stored, or written by this batch (`ask` is the S3 batch's: asking a folder is
        cheap)."""
        return digest in self._pending or self.store.exists(digest)

    def add(self, data: bytes, *, ordered: bool = False) -> tuple[str, bool]:
        """Add `data`; returns (digest, whether this batch writes it). Every blob of a folder
        batch is named in the order added (`ordered` is for stores that otherwise would not)."""
        digest = hashlib.sha256(data).hexdigest()
        if self.exists(digest):
            return digest, False
        target = self.store.path(digest)
        self.store._mkdir(target.parent)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TMP_PREFIX)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            _start_writeback(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return digest, self._register(digest, tmp, len(data))

    def add_file(self, f: BinaryIO, *, small: int = _CHUNK) -> tuple[str, int, bool]:
        """Add the rest of the open file `f`, streamed: returns (digest, size, whether this batch
        writes it). Like BlobStore.add_file, a large file never sits in memory."""
        head = f.read(small + 1)
        if len(head) <= small:
            digest, added = self.add(head)
            return digest, len(head), added
        self.store.root.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256(head)
        size = len(head)
        fd, tmp = tempfile.mkstemp(dir=self.store.root, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(head)
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                _start_writeback(out.fileno())
            digest = h.hexdigest()
            if self.exists(digest):
                os.unlink(tmp)
                return digest, size, False
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest, size, self._register(digest, tmp, size)

    def _register(self, digest: str, tmp: str, size: int) -> bool:
        with self._lock:
            if digest not in self._pending:
                self._pending[digest] = tmp
                self.added_bytes += size
                return True
        os.unlink(tmp)  # another thread of this batch wrote the same content meanwhile
        return False

    def commit(self) -> None:
        """Make every blob of the batch durable and named (see the class docstring)."""
        with self._lock:
            pending, self._pending = list(self._pending.items()), {}
        if not pending:
            return
        try:
            _fsync_all([tmp for _, tmp in pending], self.workers)
            store = self.store
            for digest, tmp in pending:
                target = store.path(digest)
                if not tmp.startswith(str(target.parent) + "/"):
                    store._mkdir(target.parent)  # a large file's temporary file is in the root
                os.replace(tmp, target)
                store._mark_unsynced(target.parent)
        except BaseException:
            for _, tmp in pending:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        self.store.sync()

    def abort(self) -> None:
        """Forget the batch: delete what it wrote (nothing of it was named)."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for tmp in pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _fsync_all(paths: list[str], workers: int = 4) -> None:
    """fsync every path, from a few threads when there is more than one: the filesystem then
    commits them together (one journal commit, not one each)."""
    if len(paths) <= 1:
        for path in paths:
            _fsync_path(path)
        return
    with ThreadPoolExecutor(max(2, min(len(paths), workers, 8))) as pool:
        list(pool.map(_fsync_path, paths))


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
