"""Content-addressed blob storage (sha256), shared by artifacts and checkpoints.

A blob is written to a temporary file in the store and renamed into place, so a reader never
sees half a blob and a crash leaves at most a stray temporary file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from django.conf import settings


class BlobStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root or settings.SHIFTLOG["BLOB_ROOT"])

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return self.root / digest[:2] / digest[2:]

    def exists(self, digest: str) -> bool:
        return self.path(digest).exists()

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        if target.exists():
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def get(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()
