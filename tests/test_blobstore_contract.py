"""The blob store's contract (agents/blobstore/base.py), run against every backend.

Each test takes `h`, one backend's harness: the store under test, plus what only a backend knows
how to do behind the store's back (corrupt a blob in its own storage, leave what a crashed
writer leaves, make blobs old, give a store nobody can reach). The folder store works in a tmp
folder; the S3 store talks to moto's server over real HTTP (tests/s3.py). Where backends differ
on purpose, BACKENDS says so, once; the tests read those flags and skip no backend (S3 only
where moto's server cannot start, and then saying so). A new backend adds a harness and a row,
and passes every test here.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.blobstore import (
    BlobBatch,
    BlobCorrupt,
    BlobStore,
    BlobStoreBackend,
    BlobStoreUnavailable,
    configured,
)
from agents.blobstore.folder import _CHUNK as CHUNK
from agents.blobstore.s3 import S3BlobStore
from tests import s3 as moto

pytestmark = pytest.mark.no_services


@dataclass(frozen=True)
class Differences:
    """Where a backend departs, on purpose, from the strictest reading of the contract."""

    # get/open/read_head hash what they read and raise BlobCorrupt. S3: the content crossed a
    # network. The folder returns the bytes: its callers that need it hash what they read
    # anyway (restore, diff, verify_store), and check() finds a corrupt blob on both.
    verifies_reads: bool
    # Every blob of a batch is invisible until commit() and gone after abort(). S3: file blobs
    # upload while the checkpoint scans, so one may be visible early and stays after abort(),
    # unreferenced, until a prune; blobs added with ordered=True (trees) keep the rule on both.
    batch_names_at_commit: bool
    # lock(exclusive=True) waits for shared holders and they for it. S3: object storage has no
    # lock; instead exists() makes an old blob young (below), so a prune cannot take it.
    exclusive_lock: bool
    # exists() marks an old blob as just used (S3's stand-in for the lock, see s3.py).
    exists_refreshes: bool
    # exists() and touch() answer without asking for a blob this store object stored or saw
    # younger than its refresh_after (S3: a round trip saved per blob), so a blob another
    # process deleted meanwhile still exists to it. A prune takes only blobs older than its
    # grace, which is longer than refresh_after: what the answer promises still holds.
    remembers_young_blobs: bool
    # mtime's resolution in seconds (S3's LastModified has whole seconds).
    mtime_resolution: float


BACKENDS = {
    "folder": Differences(
        verifies_reads=False,
        batch_names_at_commit=True,
        exclusive_lock=True,
        exists_refreshes=False,
        remembers_young_blobs=False,
        mtime_resolution=0.0,
    ),
    "s3": Differences(
        verifies_reads=True,
        batch_names_at_commit=False,
        exclusive_lock=False,
        exists_refreshes=True,
        remembers_young_blobs=True,
        mtime_resolution=1.0,
    ),
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FolderHarness:
    name = "folder"

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.spec = str(tmp_path / "store")
        self.differs = BACKENDS[self.name]
        self.store = BlobStore(self.spec)

    def reopen(self) -> BlobStoreBackend:
        """Another store on the same storage (what another process would see)."""
        return BlobStore(self.spec)

    def corrupt(self, digest: str, data: bytes) -> None:
        self.store.path(digest).write_bytes(data)

    def leave_strays(self) -> int:
        """What writers killed mid-blob leave: temporary files in the root and a fan-out folder."""
        (self.store.root / ".tmp-killed-add-file").write_bytes(b"half of a big file")
        fanout = self.store.root / "ab"
        fanout.mkdir(parents=True, exist_ok=True)
        (fanout / ".tmp-killed-add").write_bytes(b"half")
        return 2

    def leave_foreign(self) -> None:
        """Files in the store's folder that are not blobs, and a blob of a neighbouring store."""
        root = self.store.root
        (root / "ab").mkdir(parents=True, exist_ok=True)
        (root / "README").write_bytes(b"not a blob")
        (root / "ab" / "not-a-blob").write_bytes(b"not a blob")
        (root / "ab" / ("0" * 61)).write_bytes(b"too short a name")
        neighbour = root.parent / (root.name + "-other") / "ab" / ("0" * 62)
        neighbour.parent.mkdir(parents=True)
        neighbour.write_bytes(b"another store's")

    def stray_age(self) -> float:
        """The youngest stray's age in seconds, as the folder says (its mtime)."""
        strays = [*self.store.root.glob(".tmp-*"), *self.store.root.glob("??/.tmp-*")]
        return time.time() - max(p.stat().st_mtime for p in strays)

    def pruned_while_put_looks(self) -> BlobStoreBackend:
        """A store where a prune deletes a stored blob right after put() found it there."""

        class Racing(BlobStore):
            def touch(self, digest: str) -> None:
                self.delete(digest)
                super().touch(digest)

        return Racing(self.spec)

    def aged(self, digests: list[str]) -> BlobStoreBackend:
        """A store to which `digests` look old (stored two hours ago)."""
        old = time.time() - 7200
        for digest in digests:
            os.utime(self.store.path(digest), (old, old))
        return self.store

    def unreachable(self) -> BlobStoreBackend:
        a_file = self.tmp_path / "a-file"
        a_file.write_bytes(b"")
        return BlobStore(a_file / "store")  # a folder that cannot be made


@dataclass(frozen=True)
class Bucket:
    name: str
    client: Any  # boto3's, for what the tests do behind the store's back


class S3Harness:
    name = "s3"

    def __init__(self, bucket: Bucket):
        self.spec = f"s3://{bucket.name}/{uuid.uuid4().hex[:12]}"  # a new, empty store
        self.differs = BACKENDS[self.name]
        self.bucket = bucket
        self.store = S3BlobStore(self.spec)

    def reopen(self) -> BlobStoreBackend:
        return S3BlobStore(self.spec)

    def corrupt(self, digest: str, data: bytes) -> None:
        self.bucket.client.put_object(
            Bucket=self.store.bucket, Key=self.store.key(digest), Body=data
        )

    def leave_strays(self) -> int:
        """What a process killed mid-upload leaves: an unfinished multipart upload."""
        key = self.store.key(sha(b"a big blob never finished"))
        self.bucket.client.create_multipart_upload(Bucket=self.store.bucket, Key=key)
        return 1

    def leave_foreign(self) -> None:
        """Objects under the prefix that are not blobs, and a blob of a neighbouring prefix."""
        prefix = self.store.prefix
        for key in (
            f"{prefix}README",
            f"{prefix}ab/not-a-blob",
            f"{prefix}ab/{'0' * 61}",
            f"{prefix}ab{'0' * 62}",
            f"{prefix[:-1]}-other/ab/{'0' * 62}",
        ):
            self.bucket.client.put_object(Bucket=self.bucket.name, Key=key, Body=b"not ours")

    def stray_age(self) -> float:
        """The youngest unfinished upload's age in seconds, as the bucket says (moto says every
        upload was initiated on 2010-11-10, so its strays are all old)."""
        got = self.bucket.client.list_multipart_uploads(
            Bucket=self.bucket.name, Prefix=self.store.prefix
        )
        return time.time() - max(up["Initiated"].timestamp() for up in got["Uploads"])

    def pruned_while_put_looks(self) -> BlobStoreBackend:
        """A store where a prune deletes a stored blob right after put() found it there (and
        old: refresh_after=0, so put() refreshes it)."""

        class Racing(S3BlobStore):
            def _force_touch(self, digest: str) -> None:
                self.delete(digest)
                super()._force_touch(digest)

        return Racing(self.spec, refresh_after=0.0)

    def aged(self, digests: list[str]) -> BlobStoreBackend:
        """LastModified cannot be set: wait past a store's `refresh_after` of one second."""
        time.sleep(1.1)
        return S3BlobStore(self.spec, refresh_after=1.0)

    def unreachable(self) -> BlobStoreBackend:
        with pytest.MonkeyPatch.context() as env:  # (the client reads it when made)
            env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{moto.free_port()}")
            return S3BlobStore(self.spec, timeout=0.5)  # an endpoint nobody listens on


@pytest.fixture(scope="module")
def s3_bucket(moto_server: moto.MotoServer) -> Iterator[Bucket]:
    """One bucket for the module, each test's store under a prefix of its own (tests/s3.py's
    s3_url makes a bucket per test, which costs a second of setup each on a busy machine)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("AWS_PROFILE", raising=False)
        for k, v in moto_server.env().items():
            env.setenv(k, v)
        bucket = Bucket(f"shiftlog-contract-{uuid.uuid4().hex[:12]}", moto.client())
    bucket.client.create_bucket(Bucket=bucket.name)
    yield bucket
    with pytest.MonkeyPatch.context() as env:
        for k, v in moto_server.env().items():
            env.setenv(k, v)
        moto.empty_and_delete(bucket.name)


@pytest.fixture(params=list(BACKENDS))
def h(request, tmp_path: Path):
    if request.param == "folder":
        return FolderHarness(tmp_path)
    try:
        request.getfixturevalue("moto_server")
    except RuntimeError as e:  # only when moto's server cannot start on this machine
        pytest.skip(f"S3 backend not tested: moto's S3 server could not start ({e})")
    request.getfixturevalue("s3_env")  # boto3's standard environment, as in production
    return S3Harness(request.getfixturevalue("s3_bucket"))


# -- the interface --------------------------------------------------------------------------------


def _parameters(fn) -> list[tuple[str, object, bool]]:
    return [
        (p.name, p.kind, p.default is inspect.Parameter.empty)
        for p in inspect.signature(fn).parameters.values()
    ]


def test_it_has_every_method_of_the_protocol_with_its_parameters(h):
    for obj, protocol in ((h.store, BlobStoreBackend), (h.store.batch(), BlobBatch)):
        assert isinstance(obj, protocol)
        for name, member in vars(protocol).items():
            if inspect.isfunction(member) and (not name.startswith("_") or name == "__len__"):
                assert _parameters(getattr(type(obj), name)) == _parameters(member), name
    assert isinstance(configured(h.spec), BlobStoreBackend)


def test_its_properties_have_their_types(h):
    store = h.store
    assert store.root is None or isinstance(store.root, Path)
    assert isinstance(store.remote, bool) and isinstance(store.workers, int) and store.workers >= 1
    assert isinstance(store.describe(), str) and store.describe()
    assert isinstance(store.batch().added_bytes, int)


# -- content addressing ---------------------------------------------------------------------------


def test_a_blob_is_named_by_the_sha256_of_its_content(h):
    store = h.store
    contents = [b"", b"hello", bytes(range(256)) * 40]
    for data in contents:
        digest, new = store.add(data)
        assert digest == sha(data) and new is True
        assert store.add(data) == (digest, False)  # idempotent, and says so
        assert store.put(data) == digest
        assert store.exists(digest) and store.check(digest) is None
        assert store.get(digest) == data
        with store.open(digest) as f:
            assert f.read() == data
        assert store.read_head(digest, 3) == data[:3]
        assert store.read_head(digest, len(data) + 100) == data
    store.sync()
    other = h.reopen()  # on the storage, not only in this object
    assert all(other.get(sha(data)) == data for data in contents)


def test_put_stores_new_content(h):
    digest = h.store.put(b"an artifact")
    assert digest == sha(b"an artifact") and h.store.add(b"an artifact") == (digest, False)


def test_put_stores_again_a_blob_a_prune_took_while_it_looked(h):
    digest = h.store.put(b"an artifact")
    assert h.pruned_while_put_looks().put(b"an artifact") == digest
    assert h.reopen().get(digest) == b"an artifact"  # the row about to name it finds it


class CountingReader(io.BytesIO):
    """A file that remembers how much each read asked for (None or -1: everything)."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.asked: list[int | None] = []

    def read(self, n: int | None = -1) -> bytes:
        self.asked.append(n)
        return super().read(n)


def test_add_file_streams_a_file_bigger_than_the_chunk_size(h):
    store = h.store
    big = os.urandom(2 * CHUNK + 123)
    f = CountingReader(b"already read" + big)
    f.seek(len(b"already read"))  # the rest of the file is stored, from where it stands
    assert store.add_file(f) == (sha(big), len(big), True)
    assert all(n is not None and 0 < n <= CHUNK + 1 for n in f.asked)  # never all at once
    assert store.get(sha(big)) == big and store.check(sha(big)) is None
    assert store.add_file(io.BytesIO(big)) == (sha(big), len(big), False)
    assert store.stray_temp_files() == []  # the streamed copy's temporary file is gone


def test_add_file_stores_a_small_file_and_obeys_its_threshold(h, tmp_path: Path):
    store = h.store
    (tmp_path / "small").write_bytes(b"small content")
    with open(tmp_path / "small", "rb") as f:
        assert store.add_file(f) == (sha(b"small content"), 13, True)
    assert store.add(b"small content") == (sha(b"small content"), False)
    # Past `small` bytes it streams, to the same blob as add() would make.
    assert store.add_file(io.BytesIO(b"over the threshold"), small=4) == (
        sha(b"over the threshold"),
        18,
        True,
    )
    assert store.add(b"over the threshold") == (sha(b"over the threshold"), False)
    assert store.add_file(io.BytesIO(b"")) == (sha(b""), 0, True)


# -- missing, corrupt, refused --------------------------------------------------------------------


def test_a_missing_blob_raises_file_not_found(h):
    store = h.store
    missing = sha(b"never stored")
    assert store.exists(missing) is False
    for read in (
        store.get,
        store.open,
        lambda d: store.read_head(d, 10),
        store.mtime,
        store.touch,
    ):
        with pytest.raises(FileNotFoundError):
            read(missing)
    with pytest.raises(FileNotFoundError), store.prefetched([missing]):
        store.get(missing)
    assert store.check(missing) == f"blob {missing} is missing"
    assert store.delete(missing) is False
    assert list(store.iter_digests()) == []  # nothing made by asking


def test_check_finds_a_blob_corrupted_in_the_backends_own_storage(h):
    store = h.store
    digest = store.put(b"the original content")
    h.corrupt(digest, b"tampered")
    actual = sha(b"tampered")
    assert store.check(digest) == f"blob {digest} is corrupt: its content hashes to {actual}"
    reads = (store.get, lambda d: store.open(d).read(), lambda d: store.read_head(d, 100))
    for read in reads:
        if h.differs.verifies_reads:
            with pytest.raises(BlobCorrupt) as e:
                read(digest)
            assert (e.value.digest, e.value.actual) == (digest, actual)
        else:
            assert read(digest) == b"tampered"
    assert store.delete(digest) is True and store.check(digest) == f"blob {digest} is missing"


BAD_DIGESTS = [
    "",
    "0" * 63,
    "0" * 65,
    "A" * 64,  # upper case
    "g" * 64,
    "../" + "0" * 61,
    "00/" + "0" * 61,
    " " + "0" * 63,
    "0" * 63 + "\n",
]


def test_a_bad_digest_is_refused_before_the_store_is_touched(h, tmp_path: Path):
    store = h.store
    calls = (
        store.exists,
        store.get,
        store.open,
        lambda d: store.read_head(d, 1),
        store.check,
        store.touch,
        store.delete,
        store.mtime,
        store.batch().exists,
    )
    before = set(Path(tempfile.gettempdir()).iterdir())
    for bad in BAD_DIGESTS:
        for call in calls:
            with pytest.raises(ValueError, match="not a sha256 hex digest"):
                call(bad)
        # (S3's prefetched named a download file after it: "../" wrote outside its folder.)
        with pytest.raises(ValueError, match="not a sha256 hex digest"), store.prefetched([bad]):
            store.get(bad)
    assert list(store.iter_digests()) == [] and store.stray_temp_files() == []
    made = {p.name for p in set(Path(tempfile.gettempdir()).iterdir()) - before}
    assert not {name for name in made if name.startswith("0" * 8)}


# -- delete, listing, sizes, times ----------------------------------------------------------------


def test_delete_says_whether_it_deleted(h):
    store = h.store
    digest = store.put(b"doomed")
    assert store.delete(digest) is True
    assert store.delete(digest) is False
    assert not store.exists(digest) and not h.reopen().exists(digest)
    with pytest.raises(FileNotFoundError):
        store.get(digest)
    assert store.add(b"doomed") == (digest, True)  # stored again, not remembered as stored


def test_a_blob_deleted_by_another_process(h):
    store = h.store
    digest = store.put(b"deleted elsewhere")
    assert h.reopen().delete(digest) is True
    assert store.exists(digest) is h.differs.remembers_young_blobs
    if h.differs.remembers_young_blobs:
        store.touch(digest)  # (no request)
    else:
        with pytest.raises(FileNotFoundError):
            store.touch(digest)
    with pytest.raises(FileNotFoundError):
        store.get(digest)  # reads always ask
    assert store.delete(digest) is False
    assert store.exists(digest) is False  # forgotten once this store deleted it itself
    assert store.add(b"deleted elsewhere") == (digest, True)


def test_listing_is_exactly_what_was_added(h):
    store = h.store
    assert list(store.iter_digests()) == [] and list(store.listing()) == []
    assert store.size_bytes() == 0
    contents = [b"a", b"bb", os.urandom(3000), b""]
    added = {store.add(data)[0]: data for data in contents}
    h.leave_strays()  # never listed, never counted
    h.leave_foreign()
    assert list(store.iter_digests()) == sorted(added)
    rows = list(store.listing())
    assert [digest for digest, _, _ in rows] == sorted(added)
    for digest, size, mtime in rows:
        assert size == len(added[digest])
        assert abs(mtime - store.mtime(digest)) <= h.differs.mtime_resolution
        assert abs(mtime - time.time()) < 60
    assert store.size_bytes() == sum(map(len, contents))
    assert list(h.reopen().iter_digests()) == sorted(added)


def test_touch_and_put_mark_an_old_blob_as_just_used(h):
    store = h.store
    touched, put_again, asked = (store.put(x) for x in (b"touched", b"put again", b"asked"))
    assert abs(store.mtime(touched) - time.time()) < 5 + h.differs.mtime_resolution
    old = h.aged([touched, put_again, asked])
    before = {d: old.mtime(d) for d in (touched, put_again, asked)}
    assert all(t < time.time() - 1 for t in before.values())
    old.touch(touched)
    assert old.put(b"put again") == put_again
    assert old.exists(asked)
    for digest in (touched, put_again):
        assert old.mtime(digest) > before[digest]
        assert old.mtime(digest) >= time.time() - 1 - h.differs.mtime_resolution
    assert (old.mtime(asked) > before[asked]) is h.differs.exists_refreshes
    assert old.get(touched) == b"touched"  # touching keeps the content


def test_prefetched_blobs_read_alike(h):
    store = h.store
    blobs = {store.add(x)[0]: x for x in (b"one", b"two", os.urandom(CHUNK + 7))}
    with store.prefetched([*blobs, *blobs]):
        for digest, data in blobs.items():
            assert store.get(digest) == data
            with store.open(digest) as f:
                assert f.read() == data
            assert store.read_head(digest, 2) == data[:2]
    assert all(store.get(d) == data for d, data in blobs.items())  # and after it too
    with store.prefetched([]):
        pass


# -- batches --------------------------------------------------------------------------------------


def test_a_batch_commit_makes_its_blobs_visible_and_durable(h):
    store = h.store
    stored = store.put(b"stored before")
    batch = store.batch(workers=2)
    assert isinstance(batch, BlobBatch)
    a, new = batch.add(b"file a")
    assert new and batch.add(b"file a") == (a, False)
    assert batch.add(b"stored before") == (stored, False)
    big = os.urandom(CHUNK + 5)
    assert batch.add_file(io.BytesIO(big)) == (sha(big), len(big), True)
    assert batch.add_file(io.BytesIO(b"small file")) == (sha(b"small file"), 10, True)
    tree, new = batch.add(b"a tree naming them", ordered=True)
    assert new and len(batch) == 4
    assert batch.added_bytes == 6 + len(big) + 10 + len(b"a tree naming them")
    assert all(batch.exists(d) for d in (a, sha(big), tree, stored))
    assert not store.exists(tree)  # an ordered blob: never before its commit
    if h.differs.batch_names_at_commit:
        assert not any(store.exists(d) for d in (a, sha(big), sha(b"small file")))
    batch.commit()
    assert len(batch) == 0
    other = h.reopen()
    for digest, data in ((a, b"file a"), (sha(big), big), (tree, b"a tree naming them")):
        assert other.get(digest) == data and store.exists(digest)
    assert store.stray_temp_files() == []
    assert sorted(store.iter_digests()) == sorted([stored, a, sha(big), sha(b"small file"), tree])
    batch.add(b"the batch is used again")
    batch.commit()
    assert store.get(sha(b"the batch is used again")) == b"the batch is used again"


def test_a_batch_takes_blobs_from_many_threads(h):
    batch = h.store.batch(workers=4)
    contents = [b"the same in every thread"] * 8 + [b"own %d" % i for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(batch.add, contents))
    assert [new for digest, new in results if digest == sha(contents[0])].count(True) == 1
    assert len(batch) == 9 and batch.added_bytes == sum(map(len, set(contents)))
    batch.commit()
    assert list(h.store.iter_digests()) == sorted({sha(c) for c in contents})


def test_a_batch_abort_leaves_no_blob_it_was_to_name(h):
    store = h.store
    batch = store.batch(workers=2)
    a = batch.add(b"file a")[0]
    big = os.urandom(CHUNK + 5)
    batch.add_file(io.BytesIO(big))
    tree = batch.add(b"a tree naming them", ordered=True)[0]
    batch.abort()
    assert len(batch) == 0
    assert not store.exists(tree) and not h.reopen().exists(tree)
    left = set(store.iter_digests())
    if h.differs.batch_names_at_commit:
        assert left == set()
    else:
        assert left <= {a, sha(big)}  # uploads that landed stay, unreferenced, for a prune
    assert store.stray_temp_files() == []
    batch.commit()  # nothing left to commit
    assert not store.exists(tree)


# -- lock, stray temporary files, readiness -------------------------------------------------------


def _waits(store, *, holding_exclusive: bool, wanting_exclusive: bool) -> bool:
    """Whether lock(exclusive=wanting_exclusive) waits while another holder has the other."""
    got = threading.Event()

    def take() -> None:
        with store.lock(exclusive=wanting_exclusive):
            got.set()

    with store.lock(exclusive=holding_exclusive):
        thread = threading.Thread(target=take)
        thread.start()
        waited = not got.wait(0.3)
    thread.join(5)
    assert got.is_set()  # and it has the lock once the holder let go
    return waited


def test_lock_exclusive_against_shared(h):
    store = h.store
    assert not _waits(store, holding_exclusive=False, wanting_exclusive=False)  # shared + shared
    assert _waits(store, holding_exclusive=False, wanting_exclusive=True) is (
        h.differs.exclusive_lock
    )
    assert _waits(store, holding_exclusive=True, wanting_exclusive=False) is (
        h.differs.exclusive_lock
    )
    with store.lock():
        digest = store.put(b"written under the shared lock")
    assert store.exists(digest) and list(store.iter_digests()) == [digest]


def test_stray_temporary_files_are_found_and_removed_by_age(h):
    store = h.store
    kept = store.put(b"a blob, not a stray")
    assert store.stray_temp_files() == []
    n = h.leave_strays()
    assert len(store.stray_temp_files()) == n
    age = h.stray_age()
    # Younger than the limit: maybe still being written, kept.
    assert store.remove_stray_temp(older_than_seconds=age + 3600) == 0
    assert len(store.stray_temp_files()) == n
    time.sleep(0.05)
    assert store.remove_stray_temp(older_than_seconds=max(age - 3600, 0)) == n
    assert store.stray_temp_files() == [] and store.remove_stray_temp(0) == 0
    assert list(store.iter_digests()) == [kept] and store.get(kept) == b"a blob, not a stray"


def test_check_ready_passes_on_a_usable_store_and_fails_on_one_out_of_reach(h):
    assert h.store.check_ready() is None
    started = time.monotonic()
    with pytest.raises(BlobStoreUnavailable, match=r"^blob store unreachable: "):
        h.unreachable().check_ready()
    assert time.monotonic() - started < 10
