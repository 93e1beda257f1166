"""Content-addressed blob storage (sha256), shared by artifacts and checkpoints.

Two backends behind one interface, the typed Protocol in base.py (BlobStoreBackend, and
BlobBatch for its batches), which every backend passes tests/test_blobstore_contract.py against:
    folder.py   BlobStore: files in a folder (the embedded default)
    s3.py       S3BlobStore: S3-compatible object storage, configured through boto3's own
                environment and config files
`configured()` gives the one settings.SHIFTLOG["BLOB_STORE"] names. A missing blob raises
FileNotFoundError; errors.py has the rest (BlobCorrupt, BlobStoreUnavailable).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from agents.blobstore.base import BlobBatch, BlobStoreBackend
from agents.blobstore.errors import UNREACHABLE, BlobCorrupt, BlobStoreUnavailable
from agents.blobstore.folder import Batch, BlobStore, _is_digest

if TYPE_CHECKING:
    from agents.blobstore.s3 import S3BlobStore

__all__ = [
    "UNREACHABLE",
    "Batch",
    "BlobBatch",
    "BlobCorrupt",
    "BlobStore",
    "BlobStoreBackend",
    "BlobStoreUnavailable",
    "_is_digest",
    "configured",
    "is_s3",
]

_s3_stores: dict[tuple, S3BlobStore] = {}
_s3_lock = threading.Lock()


def is_s3(spec: str) -> bool:
    return spec.startswith("s3://")


def configured(spec: str | None = None) -> BlobStoreBackend:
    """The blob store settings.SHIFTLOG["BLOB_STORE"] (or `spec`) names: "s3://BUCKET/PREFIX" is
    S3 (one store per process and endpoint: a boto3 client is costly to make and thread-safe);
    anything else is the folder store, at that path or, when empty, at SHIFTLOG["BLOB_ROOT"]."""
    if spec is None:
        # Here, not at the top: the store and the snapshots built on it work without Django.
        from django.conf import settings  # noqa: PLC0415

        spec = settings.SHIFTLOG.get("BLOB_STORE", "")
    if not is_s3(spec):
        return BlobStore(spec or None)
    from agents.blobstore.s3 import S3BlobStore  # noqa: PLC0415 (boto3 only when used)

    key = (spec, os.getpid(), os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_PROFILE"))
    with _s3_lock:
        store = _s3_stores.get(key)
        if store is None:
            store = _s3_stores[key] = S3BlobStore(spec)
    return store
