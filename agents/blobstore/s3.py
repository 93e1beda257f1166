"""The S3 blob store: content-addressed (sha256) objects in S3-compatible object storage.

A blob is the object `PREFIX/ab/cdef…` (its digest split as in the folder store) of the bucket
in SHIFTLOG_BLOB_STORE=s3://BUCKET/PREFIX. The boto3 client comes only from boto3's standard
environment and config files (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, AWS_PROFILE...), so AWS S3, MinIO, Ceph RGW and R2 are configured alike.

Reads: every read (get, open, check, read_head) hashes the whole object and raises BlobCorrupt
naming the blob when it does not match its digest; a missing object is FileNotFoundError.
`prefetched(digests)` downloads many blobs at once (a bounded pool) to temporary files, which the
following `open`s read: a restore of 10k files is not 10k round trips one after another.

Writes: an object appears whole or not at all, so there are no temporary objects to clean up
(an interrupted multipart upload is aborted by boto3; `remove_stray_temp` aborts ones left by a
killed process). Blobs over the multipart threshold go up in parts (TransferConfig). A Batch
uploads file blobs in a bounded pool as they are added (with a bound on those in flight, so a big
workspace never sits in memory; content over 1 MiB is spooled to a temporary file outside any
workspace), and blobs added with `ordered=True` (trees) only at commit, after every blob added
before them has landed, in the order added: a tree is never stored before its children.

Failures: a connection error, a timeout, a 5xx, a refusal (AccessDenied, NoSuchBucket...) raises
BlobStoreUnavailable ("blob store unreachable: ENDPOINT: CODE"). Retries and timeouts are
bounded (a few attempts, seconds each), so a dead store fails in seconds, not minutes.

Prune without a lock. The folder store's prune takes an exclusive flock that checkpoints hold
shared; object storage has none. Prune keeps the grace-period design on LastModified: a blob
younger than the grace, and everything reachable from a tree that young, is kept. The danger is a
checkpoint that finds an OLD unreferenced blob already stored (dedup) and names it in a new tree
while a prune deletes it. So `exists()` refreshes (copies in place, which sets LastModified) any
blob older than `refresh_after` seconds before it answers True: after a checkpoint has relied on
a blob, that blob is younger than `refresh_after` until the checkpoint's tree (new, or touched
when already stored) is written, and that tree then keeps the blob young through prune's "reachable
from a young tree" rule until the run's row names it. A prune (grace > refresh_after + the
longest checkpoint) therefore never finds such a blob old. What is left is the prune that listed
the blob as old just before the refresh: prune asks for each doomed blob's LastModified again
right before deleting it and spares one that became young, leaving one round trip between that
check and the delete. `put()` (an artifact, a protected original) refreshes the same way.

Fewer round trips. Each store remembers, per blob, a lower bound of its LastModified (from its
own uploads and refreshes, and from HEADs and GETs): `exists()` answers True without a request
while that is younger than `refresh_after`, which keeps the argument above (a prune deletes only
blobs older than its grace; a positive answer still means "younger than refresh_after"). So an
incremental checkpoint asks only about what it has not seen: one HEAD and one PUT for the
changed file, one of each per new tree on its path. A prune must therefore use a grace longer
than refresh_after plus the longest checkpoint (prune_store's default: an hour, vs 10 minutes).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import boto3
import boto3.exceptions
import botocore.exceptions as bce
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from agents.blobstore.errors import BlobCorrupt, BlobStoreUnavailable
from agents.blobstore.folder import _CHUNK, _is_digest

MULTIPART_THRESHOLD = 16 << 20
# A blob that a checkpoint relies on is made young again if older than this (see the docstring):
# a sixth of prune_store's default grace of an hour.
REFRESH_AFTER_SECONDS = 600.0
_MISSING = {"404", "NoSuchKey", "NotFound"}
_IN_MEMORY = 1 << 20  # a batch keeps content up to this in memory; more goes to a temp file
SMALL_PUT = 64 << 10  # a batch puts content up to this without asking whether it is stored


def client_config(workers: int, timeout: float = 5.0) -> Config:
    """Bounded: three attempts, each waiting `timeout` seconds at most to connect or between
    two reads, so a dead or hung store fails in seconds (a hung one in about 3 * timeout)."""
    return Config(
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"total_max_attempts": 3, "mode": "standard"},
        max_pool_connections=max(10, workers * 2),
    )


class S3BlobStore:
    """The S3 backend of base.BlobStoreBackend: the blob store in a bucket (see the module
    docstring)."""

    root = None  # no folder: nothing of it can be inside a workspace
    remote = True  # each read is a round trip: restores read trees and blobs ahead, in a pool

    def __init__(
        self,
        url: str,
        *,
        workers: int = 8,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        refresh_after: float = REFRESH_AFTER_SECONDS,
        timeout: float = 5.0,
    ):
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://BUCKET/PREFIX address: {url!r}")
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.workers = workers
        self.refresh_after = refresh_after
        self.client = boto3.session.Session().client("s3", config=client_config(workers, timeout))
        self.endpoint = self.client.meta.endpoint_url
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=max(5 << 20, multipart_threshold),
            max_concurrency=workers,
        )
        self._local: dict[str, str] = {}  # prefetched digest -> its verified temporary file
        self._local_lock = threading.Lock()
        # digest -> a lower bound of its LastModified, learnt from an upload, a refresh, a HEAD
        # or a GET: a blob known to be younger than refresh_after needs no request to exist().
        self._known: dict[str, float] = {}

    # --- names and errors ------------------------------------------------------------------
    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, digest: str) -> str:
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return f"{self.prefix}{digest[:2]}/{digest[2:]}"

    def path(self, digest: str) -> Path:
        raise NotImplementedError("an S3 blob store has no paths: use open() or get()")

    @contextlib.contextmanager
    def _calling(self, digest: str | None = None) -> Iterator[None]:
        """botocore's errors as ours: FileNotFoundError for a missing blob, else unavailable."""
        try:
            yield
        except bce.ClientError as e:
            err = e.response.get("Error", {})
            code = str(
                err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            )
            if digest is not None and code in _MISSING:
                raise FileNotFoundError(f"blob {digest} is not in {self.describe()}") from None
            if code == "404":
                code = "404 (no such bucket?)"
            raise BlobStoreUnavailable(f"{self._where()}: {code}") from None
        except (bce.BotoCoreError, bce.HTTPClientError) as e:
            raise BlobStoreUnavailable(f"{self._where()}: {type(e).__name__}") from None
        except boto3.exceptions.S3UploadFailedError as e:
            raise BlobStoreUnavailable(f"{self._where()}: upload failed ({_short(e)})") from None

    def _where(self) -> str:
        return f"{self.endpoint or 'S3'} bucket {self.bucket}"

    def check_ready(self) -> None:
        """Raise BlobStoreUnavailable unless the bucket answers (a HEAD and a one-key list)."""
        with self._calling():
            self.client.head_bucket(Bucket=self.bucket)
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

    # --- writing ---------------------------------------------------------------------------
    def exists(self, digest: str) -> bool:
        """Whether the blob is stored; one older than `refresh_after` is made young first (see
        the module docstring: a checkpoint about to name it must not lose it to a prune)."""
        key = self.key(digest)
        if time.time() - self._known.get(digest, 0.0) < self.refresh_after:
            return True  # young, as far as this process knows: a prune cannot take it yet
        try:
            with self._calling(digest):
                head = self.client.head_object(Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            self._known.pop(digest, None)
            return False
        modified = head["LastModified"].timestamp()
        if time.time() - modified > self.refresh_after:
            try:
                self._force_touch(digest)
            except FileNotFoundError:
                return False  # deleted meanwhile: the caller stores it again
        else:
            self._learn(digest, modified)
        return True

    def known_young(self, digest: str) -> bool:
        """Known to this process to be stored and younger than `refresh_after` (no request)."""
        return time.time() - self._known.get(digest, 0.0) < self.refresh_after

    def _learn(self, digest: str, modified: float) -> None:
        if len(self._known) > 200_000:
            self._known.clear()  # a bound on memory; the next exists() asks again
        self._known[digest] = modified

    def put(self, data: bytes) -> str:
        """Store `data` for a row about to name it (exists() refreshes an old copy)."""
        return self.add(data)[0]

    def add(self, data: bytes) -> tuple[str, bool]:
        digest = hashlib.sha256(data).hexdigest()
        if self.exists(digest):
            return digest, False
        self._upload(digest, data)
        return digest, True

    def add_file(self, f: BinaryIO, *, small: int = _CHUNK) -> tuple[str, int, bool]:
        head = f.read(small + 1)
        if len(head) <= small:
            digest, added = self.add(head)
            return digest, len(head), added
        digest, size, tmp = _spool(head, f)
        try:
            if self.exists(digest):
                return digest, size, False
            self._upload(digest, tmp)
        finally:
            os.unlink(tmp)
        return digest, size, True

    def _upload(self, digest: str, content: bytes | str) -> None:
        """Upload bytes or a file's content (multipart over the threshold)."""
        key = self.key(digest)
        started = time.time()
        with self._calling():
            if isinstance(content, bytes) and len(content) < self.transfer.multipart_threshold:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=content)
            elif isinstance(content, bytes):
                self.client.upload_fileobj(
                    io.BytesIO(content), self.bucket, key, Config=self.transfer
                )
            else:
                self.client.upload_file(content, self.bucket, key, Config=self.transfer)
        self._learn(digest, started)

    def batch(self, *, workers: int = 1) -> S3Batch:
        return S3Batch(self, workers=max(workers, self.workers))

    def touch(self, digest: str) -> None:
        """Make the blob young again (a copy onto itself sets LastModified), unless this process
        knows it is younger than refresh_after already (then a prune cannot take it for at least
        its grace minus refresh_after: a checkpoint touching the trees it found stored costs no
        request per tree)."""
        if time.time() - self._known.get(digest, 0.0) < self.refresh_after:
            return
        self._force_touch(digest)

    def _force_touch(self, digest: str) -> None:
        key = self.key(digest)
        started = time.time()
        with self._calling(digest):
            self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
                Metadata={"refreshed": str(int(started))},
            )
        self._learn(digest, started)

    def delete(self, digest: str) -> bool:
        key = self.key(digest)
        self._known.pop(digest, None)
        try:
            with self._calling(digest):
                self.client.head_object(Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            return False
        with self._calling(digest):
            self.client.delete_object(Bucket=self.bucket, Key=key)
        return True

    # --- reading ---------------------------------------------------------------------------
    def get(self, digest: str) -> bytes:
        local = self._local.get(digest)
        if local is not None:
            data = Path(local).read_bytes()
        else:
            with self._calling(digest):
                got = self.client.get_object(Bucket=self.bucket, Key=self.key(digest))
                data = got["Body"].read()
            self._learn(digest, got["LastModified"].timestamp())
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise BlobCorrupt(digest, actual)
        return data

    def open(self, digest: str) -> BinaryIO:
        """The blob's content, downloaded and checked, as a file positioned at its start."""
        local = self._local.get(digest)
        if local is not None:
            return open(local, "rb")
        out = tempfile.SpooledTemporaryFile(max_size=_IN_MEMORY)  # noqa: SIM115
        try:
            self._download(digest, out)
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out

    def _download(self, digest: str, out: BinaryIO) -> None:
        h = hashlib.sha256()
        with self._calling(digest):
            got = self.client.get_object(Bucket=self.bucket, Key=self.key(digest))
            for chunk in got["Body"].iter_chunks(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != digest:
            raise BlobCorrupt(digest, h.hexdigest())
        self._learn(digest, got["LastModified"].timestamp())

    def check(self, digest: str) -> str | None:
        try:
            with self.open(digest):
                pass
        except FileNotFoundError:
            return f"blob {digest} is missing"
        except BlobCorrupt as e:
            return str(e)
        return None

    def read_head(self, digest: str, n: int) -> bytes:
        with self.open(digest) as f:  # the whole blob is checked, not only its head
            return f.read(n)

    @contextlib.contextmanager
    def prefetched(self, digests: Iterable[str]) -> Iterator[None]:
        """Download `digests` in a bounded pool (checked, to temporary files) for the `open`s
        and `get`s that follow; FileNotFoundError or BlobCorrupt before any is read."""
        wanted = sorted(set(digests) - set(self._local))
        for digest in wanted:
            self.key(digest)  # ValueError for anything but a digest: it names a file below
        if not wanted:
            yield
            return
        folder = tempfile.mkdtemp(prefix="shiftlog-s3-")
        try:

            def fetch(digest: str) -> None:
                path = os.path.join(folder, digest)
                with open(path, "wb") as out:
                    self._download(digest, out)

            with ThreadPoolExecutor(self.workers) as pool:
                for _ in pool.map(fetch, wanted):
                    pass
            with self._local_lock:
                for digest in wanted:
                    self._local[digest] = os.path.join(folder, digest)
            yield
        finally:
            with self._local_lock:
                for digest in wanted:
                    self._local.pop(digest, None)
            shutil.rmtree(folder, ignore_errors=True)

    # --- listing ---------------------------------------------------------------------------
    def listing(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, LastModified as a timestamp) of every stored blob."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        with self._calling():
            for page in pages:
                for obj in page.get("Contents", ()):
                    name = obj["Key"][len(self.prefix) :]
                    if len(name) == 65 and name[2] == "/" and _is_digest(name[:2] + name[3:]):
                        yield name[:2] + name[3:], obj["Size"], obj["LastModified"].timestamp()

    def iter_digests(self) -> Iterator[str]:
        for digest, _, _ in self.listing():
            yield digest

    def mtime(self, digest: str) -> float:
        with self._calling(digest):
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
        return head["LastModified"].timestamp()

    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self.listing())

    # --- what a folder needs and a bucket does not -----------------------------------------
    def stray_temp_files(self) -> list[str]:
        """Unfinished multipart uploads under the prefix ("KEY (upload ID)"): what
        remove_stray_temp aborts once they are old enough."""
        return [f"{up['Key']} (upload {up['UploadId']})" for up in self._uploads()]

    def remove_stray_temp(self, older_than_seconds: float = 3600.0) -> int:
        """Abort multipart uploads under the prefix left by killed processes (old enough)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_seconds)
        aborted = 0
        for up in self._uploads():
            if up["Initiated"] < cutoff:
                with self._calling():
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                    )
                aborted += 1
        return aborted

    def _uploads(self) -> list[dict]:
        with self._calling():
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            return [up for page in pages for up in page.get("Uploads", ())]

    def sync(self) -> None:
        """An object is durable once its upload returns."""

    @contextlib.contextmanager
    def lock(self, *, exclusive: bool = False) -> Iterator[None]:
        """No lock: see the module docstring on prune."""
        yield


class S3Batch:
    """New blobs of one checkpoint (see the module docstring): file blobs upload in a bounded
    pool as they are added, `ordered` ones (trees) at commit, after the rest, in the order
    added. Thread-safe, like the folder Batch. `abort` waits for what is in flight; a blob that
    landed stays, unreferenced (a prune takes it after the grace period)."""

    def __init__(self, store: S3BlobStore, *, workers: int):
        self.store = store
        self.workers = workers
        self.added_bytes = 0
        self._names: set[str] = set()
        self._absent: set[str] = set()  # found missing by this batch: not asked again
        self._ordered: list[tuple[str, bytes]] = []
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(workers * 4)  # uploads queued or in flight
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._names)

    def exists(self, digest: str, *, ask: bool = True) -> bool:
        """Stored, or written by this batch. `ask=False`: only what is known without a request
        (a tree this scan has just built is almost never stored: storing it again is harmless,
        and asking first would cost a round trip per folder on the changed path)."""
        if digest in self._names:
            return True
        if digest in self._absent:
            return False
        if not ask:
            return self.store.known_young(digest)
        if self.store.exists(digest):
            return True
        self._absent.add(digest)
        return False

    def add(self, data: bytes, *, ordered: bool = False) -> tuple[str, bool]:
        digest = hashlib.sha256(data).hexdigest()
        # Small content is put without asking first: a PUT costs the round trip a HEAD would,
        # and makes an old copy young as exists() would (trees are small too).
        ask = len(data) > SMALL_PUT
        if self.exists(digest, ask=ask) or not self._claim(digest, len(data)):
            return digest, False
        if ordered:
            with self._lock:
                self._ordered.append((digest, data))
        elif len(data) > _IN_MEMORY:
            tmp = tempfile.NamedTemporaryFile(prefix="shiftlog-s3-", delete=False)  # noqa: SIM115
            with tmp:
                tmp.write(data)
            self._submit(digest, tmp.name)
        else:
            self._submit(digest, data)
        return digest, True

    def add_file(self, f: BinaryIO, *, small: int = _CHUNK) -> tuple[str, int, bool]:
        head = f.read(small + 1)
        if len(head) <= small:
            digest, added = self.add(head)
            return digest, len(head), added
        digest, size, tmp = _spool(head, f)
        if self.exists(digest) or not self._claim(digest, size):
            os.unlink(tmp)
            return digest, size, False
        self._submit(digest, tmp)
        return digest, size, True

    def _claim(self, digest: str, size: int) -> bool:
        with self._lock:
            if digest in self._names:
                return False  # another thread of this batch has it
            self._names.add(digest)
            self.added_bytes += size
            return True

    def _submit(self, digest: str, content: bytes | str) -> None:
        self._slots.acquire()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="s3-upload")
            try:
                self._futures.append(self._pool.submit(self._upload, digest, content))
            except BaseException:
                self._slots.release()
                raise

    def _upload(self, digest: str, content: bytes | str) -> None:
        try:
            self.store._upload(digest, content)
        finally:
            self._slots.release()
            if isinstance(content, str):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(content)

    def commit(self) -> None:
        """Wait for every upload; then store the ordered blobs, one after another."""
        try:
            self._wait()
            for digest, data in self._ordered:
                self.store._upload(digest, data)
        finally:
            self._reset()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._wait()
        self._reset()

    def _wait(self) -> None:
        with self._lock:
            futures, self._futures = self._futures, []
        error = None
        for fut in futures:
            try:
                fut.result()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _reset(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._names, self._ordered, self._absent = set(), [], set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _spool(head: bytes, f: BinaryIO) -> tuple[str, int, str]:
    """Copy `head` and the rest of `f` to a temporary file (outside any workspace), hashing it:
    (digest, size, the file's path; the caller removes it)."""
    h = hashlib.sha256(head)
    size = len(head)
    fd, tmp = tempfile.mkstemp(prefix="shiftlog-s3-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except BaseException:
        os.unlink(tmp)
        raise
    return h.hexdigest(), size, tmp


def _short(e: BaseException) -> str:
    text = str(e)
    return text if len(text) < 120 else text[:117] + "..."
