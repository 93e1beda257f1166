"""Reading files' contents during a scan: hashed (sha256 hex, as the blob store names blobs) and,
for a checkpoint, written to the scan's blob batch (made durable with the trees, see scan.py)."""

from __future__ import annotations

import errno
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from agents.blobstore import BlobBatch, BlobStoreBackend
from agents.snapshots.beneath import FILE_FLAGS, open_beneath
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

    def __init__(self, blobs: BlobStoreBackend, workers: int):
        self.blobs = blobs
        self.workers = workers

    def hash_pending(self, scan: ScanState) -> None:
        """Read every file the walk queued: add its content to `scan.batch` (or, without one,
        only hash it) and record its digest in its folder, or leave it out when it is gone."""
        pending, scan.pending = scan.pending, []
        batch = scan.batch
        if len(pending) >= PARALLEL_MIN_FILES and self.workers > 1:
            # hashlib and file reads release the GIL: the threads overlap on both cores.
            with ThreadPoolExecutor(self.workers) as pool:
                results = list(pool.map(lambda f: self.read(f, batch, scan.strip), pending))
        else:
            results = [self.read(f, batch, scan.strip) for f in pending]
        for f, result in zip(pending, results, strict=True):
            self._record(scan, f, result)

    def read(
        self, f: PendingFile, batch: BlobBatch | None, strip: int
    ) -> tuple[str, int, bool, os.stat_result] | None:
        """(digest, size, whether `batch` writes a new blob for it, stat after reading), or None
        when the file is gone or has become a link. Without a batch it is only hashed. `strip`:
        the length of the workspace's path and its slash, at the start of `f.path`."""
        try:
            fd = os.open(f.path, FILE_FLAGS)
            opened = os.fstat(fd)
            if opened.st_ino != f.st.st_ino or opened.st_dev != f.st.st_dev:
                # Not the file the walk listed: replaced since, or reached through a folder
                # swapped for a link (which would read a file outside the workspace). Open
                # what is at that path now, following no link at any level.
                os.close(fd)
                fd = open_beneath(f.path[: strip - 1], f.path[strip:])
        except OSError as e:
            # Gone, or replaced by a link or something not a file, since the folder was listed:
            # leave it out.
            if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
                return None
            raise
        with open(fd, "rb", buffering=0) as fh:
            if batch is not None:
                digest, size, added = batch.add_file(fh)
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
