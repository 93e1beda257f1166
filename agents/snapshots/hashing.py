"""Hashing streamed content the way the blob store names it (sha256, hex)."""

from __future__ import annotations

import hashlib
from typing import BinaryIO

CHUNK = 1 << 20


def hash_stream(f: BinaryIO) -> tuple[str, int]:
    """(digest, size) of what is left to read in `f`."""
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size
