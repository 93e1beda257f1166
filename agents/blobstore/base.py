"""The blob store's contract: what every backend (folder.py, s3.py) offers, one line each.

A blob is immutable content named by its digest: the sha256 of its bytes in lowercase hex (64
characters). Every method taking a digest raises ValueError for anything else (upper case, a
path, a short one) before it touches the store. Errors, on every backend alike:
    FileNotFoundError       the blob is not stored (get, open, read_head, mtime, touch)
    BlobCorrupt             a read found content not hashing to its digest (errors.py; which reads
                            check is a backend's choice: see `verifies_reads` below)
    BlobStoreUnavailable    the store cannot be used now: unreachable, refusing, failing (errors.py;
                            its message starts "blob store unreachable: ", never with a secret)
Durability: a blob is durable once `add`/`put`/`add_file` returned and then `sync()` returned (the
folder store fsyncs the directories then; an object store's upload is durable when it returns),
or once a batch's `commit()` returned. A blob is never visible (exists, get, listing) half written.

Every backend passes tests/test_blobstore_contract.py, which says in one table (BACKENDS) where
backends differ on purpose. Backend-only extras stay off the contract: the folder's `path()`, the
S3 store's `key()`, `bucket` and `known_young()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable


@runtime_checkable
class BlobBatch(Protocol):
    """New blobs written together (a checkpoint's): `commit` makes them durable and visible in
    one go, children before the blobs added with `ordered=True` that name them; thread-safe."""

    added_bytes: int  # bytes of content this batch has taken to write (not those found stored)

    def __len__(self) -> int:
        """How many blobs this batch writes (0 again after commit or abort)."""

    def exists(self, digest: str, *, ask: bool = True) -> bool:
        """Stored or taken by this batch; `ask=False` may answer False rather than ask a remote store."""

    def add(self, data: bytes, *, ordered: bool = False) -> tuple[str, bool]:
        """(digest, whether this batch writes it): False when stored or already in the batch."""

    def add_file(self, f: BinaryIO, *, small: int = ...) -> tuple[str, int, bool]:
        """add() for the rest of the open file `f`, streamed past `small` bytes: (digest, size, new)."""

    def commit(self) -> None:
        """Every blob of the batch durable and visible on return; `ordered` ones last, in order."""

    def abort(self) -> None:
        """Drop the batch: no `ordered` blob of it is ever visible (see `batch_names_at_commit`)."""


@runtime_checkable
class BlobStoreBackend(Protocol):
    """A content-addressed blob store (see the module docstring for digests, errors, durability)."""

    @property
    def root(self) -> Path | None:
        """The folder holding the blobs, or None (a workspace must never contain it)."""

    @property
    def remote(self) -> bool:
        """Whether each read is a round trip (restores then read ahead with `prefetched`)."""

    @property
    def workers(self) -> int:
        """How many requests a remote store makes at once (reads ahead in a pool that size)."""

    def describe(self) -> str:
        """Where the blobs are, for messages (a folder, s3://BUCKET/PREFIX/): never a secret."""

    def check_ready(self) -> None:
        """Return if blobs can be written now; else raise BlobStoreUnavailable saying why."""

    def exists(self, digest: str) -> bool:
        """Stored, and a prune will not take it right away (may answer from memory: S3)."""

    def put(self, data: bytes) -> str:
        """Store `data` for a row about to name it: its digest; one already stored is made young."""

    def add(self, data: bytes) -> tuple[str, bool]:
        """Store `data`: (digest, whether it was newly written); idempotent."""

    def add_file(self, f: BinaryIO, *, small: int = ...) -> tuple[str, int, bool]:
        """Store the rest of open file `f`, streamed past `small` bytes: (digest, size, new)."""

    def batch(self, *, workers: int = 1) -> BlobBatch:
        """A new BlobBatch on this store (`workers`: threads that may add to it)."""

    def get(self, digest: str) -> bytes:
        """The blob's content; FileNotFoundError if missing."""

    def open(self, digest: str) -> BinaryIO:
        """The blob's content as a binary file at its start (caller closes); FileNotFoundError."""

    def check(self, digest: str) -> str | None:
        """None if the blob is there and hashes to its digest, else what is wrong (never raises it)."""

    def read_head(self, digest: str, n: int) -> bytes:
        """The first `n` bytes of the blob (fewer if it is shorter); FileNotFoundError if missing."""

    def touch(self, digest: str) -> None:
        """Mark the blob as just used (a prune's grace covers it); FileNotFoundError, as exists."""

    def delete(self, digest: str) -> bool:
        """Remove the blob: whether it was there (a missing one is not an error)."""

    def iter_digests(self) -> Iterator[str]:
        """Every stored blob's digest, sorted; never a temporary file or half-written blob."""

    def listing(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size in bytes, mtime as a timestamp) for each blob iter_digests yields."""

    def mtime(self, digest: str) -> float:
        """When the blob was stored or last marked as used (a timestamp); FileNotFoundError."""

    def size_bytes(self) -> int:
        """Total size of the stored blobs' content (nothing else counted)."""

    def prefetched(self, digests: Iterable[str]) -> AbstractContextManager[None]:
        """Within it, get/open of `digests` are cheap; a missing one raises FileNotFoundError."""

    def stray_temp_files(self) -> list:
        """What crashed writers left (temporary files, unfinished uploads): what is cleanable."""

    def remove_stray_temp(self, older_than_seconds: float = 3600.0) -> int:
        """Remove stray_temp_files older than that (younger ones may be in use): how many."""

    def sync(self) -> None:
        """Make every blob added so far durable (see the module docstring)."""

    def lock(self, *, exclusive: bool = False) -> AbstractContextManager[None]:
        """Writers and readers hold it shared, a prune exclusive (see `exclusive_lock`)."""
