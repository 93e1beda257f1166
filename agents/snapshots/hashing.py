"""Reading files' contents during a scan: hashed (sha256 hex, as the blob store names blobs) and,
for a checkpoint, stored."""

from __future__ import annotations

import errno
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from agents.blobstore import BlobStore
from agents.snapshots.scan_state import PendingFile, ScanState

CHUNK = 1 << 20
# Below this many files to read, a thread pool costs more than it saves.
PARALLEL_MIN_FILES = 64


def hash_stream(f: BinaryIO) -> tuple[str, int]:
    """(digest, size) of what is left to read in `f`."""
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


class FileHasher:
    """Reads the files a walk queued, with `workers` threads when there are many."""

    def __init__(self, blobs: BlobStore, workers: int):
        self.blobs = blobs
        self.workers = workers

    def hash_pending(self, scan: ScanState, store: bool) -> None:
        """Read every file the walk queued: store (or, with store=False, only hash) its content
        and record its digest in its folder, or leave it out when it is gone."""
        pending, scan.pending = scan.pending, []
        if len(pending) >= PARALLEL_MIN_FILES and self.workers > 1:
            with ThreadPoolExecutor(self.workers) as pool:
                results = list(pool.map(lambda f: self.read(f, store), pending))
        else:
            results = [self.read(f, store) for f in pending]
        for f, result in zip(pending, results, strict=True):
            self._record(scan, f, result)

    def read(self, f: PendingFile, store: bool) -> tuple[str, int, bool, os.stat_result] | None:
        """(digest, size, whether a new blob was added, stat after reading), or None when the
        file is gone or has become a link."""
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

    def _record(self, scan: ScanState, f: PendingFile, result: tuple | None) -> None:
        """Put a read file's digest in its folder; trusted next time only if its stat did not
        change while it was read and its timestamps are older than the scan's clock."""
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
