"""The blob store's two backends: the folder and S3 (moto's server over real HTTP, tests/s3.py).

Checkpoints, restores, diffs, verify and prune on both; then what only S3 has: reads that check
digests against a tampered object, multipart uploads, a store that is down or refuses, the
refresh of an old blob a checkpoint relies on. The commands and /readyz at the end.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from agents.blobstore import BlobCorrupt, BlobStore, BlobStoreUnavailable, configured
from agents.blobstore.s3 import S3BlobStore
from agents.snapshots import ChangeFeed, CorruptBlob, MissingBlob, Snapshots
from tests import s3 as moto

pytestmark = pytest.mark.no_services


def write(root: Path, rel: str, data: bytes | str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def listing(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def sample(ws: Path) -> None:
    write(ws, "README.md", "# hello\n")
    write(ws, "src/app.py", "print('hi')\n" * 50)
    write(ws, "src/lib/util.py", "def f():\n    return 1\n")
    write(ws, "data/blob.bin", bytes(range(256)) * 4096)  # 1 MiB + : streamed, spooled
    (ws / "empty").mkdir()
    (ws / "alias").symlink_to("README.md")


def tamper(store, digest: str, data: bytes) -> None:
    """Replace a stored blob's content behind the store's back."""
    if isinstance(store, S3BlobStore):
        moto.client().put_object(Bucket=store.bucket, Key=store.key(digest), Body=data)
    else:
        store.path(digest).write_bytes(data)


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path: Path):
    if request.param == "folder":
        return BlobStore(tmp_path / "store")
    return S3BlobStore(request.getfixturevalue("s3_url"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


# -- on both backends ----------------------------------------------------------------------------


def test_snapshot_restore_and_diff_round_trip(store, ws: Path, tmp_path: Path):
    snaps = Snapshots(store)
    sample(ws)
    first = snaps.snapshot(ws, cache_path=tmp_path / "cache.json")
    write(ws, "src/app.py", "print('changed')\n")
    (ws / "README.md").unlink()
    second = snaps.snapshot(ws, cache_path=tmp_path / "cache.json")
    assert second.tree != first.tree and second.blobs_added >= 1

    fork = tmp_path / "fork"
    snaps.restore(first.tree, fork)
    (ws / "README.md").write_text("# hello\n")
    write(ws, "src/app.py", "print('hi')\n" * 50)
    assert listing(fork) == listing(ws)

    changes = {c.path: c for c in snaps.diff(first.tree, second.tree)}
    assert changes["README.md"].status == "removed"
    assert changes["src/app.py"].status == "changed"
    assert "+print('changed')" in changes["src/app.py"].diff
    assert snaps.read(second.tree, "src/app.py") == b"print('changed')\n"
    assert snaps.verify([first.tree, second.tree]) == []


def test_an_incremental_checkpoint_through_a_change_feed(store, ws: Path, tmp_path: Path):
    snaps = Snapshots(store)
    sample(ws)
    feed = ChangeFeed(ws)
    try:
        cache = tmp_path / "cache.json"
        snaps.snapshot(ws, cache_path=cache, feed=feed)
        write(ws, "src/lib/util.py", "def f():\n    return 2\n")
        res = snaps.snapshot(ws, cache_path=cache, feed=feed)
        assert res.incremental
        # The file's blob and the three trees on its path.
        assert res.blobs_added == 4
        assert snaps.read(res.tree, "src/lib/util.py").endswith(b"return 2\n")
    finally:
        feed.close()


def test_verify_names_corrupt_and_missing_blobs(store, ws: Path):
    snaps = Snapshots(store)
    sample(ws)
    tree = snaps.snapshot(ws).tree
    files = snaps.files(tree)
    corrupt, missing = files["src/app.py"].hash, files["data/blob.bin"].hash
    tamper(store, corrupt, b"tampered")
    assert store.delete(missing) and not store.delete(missing)
    problems = snaps.verify([tree])
    assert len(problems) == 2, problems
    assert any(f"corrupt blob {corrupt}" in p and "src/app.py" in p for p in problems)
    assert any(f"missing blob {missing}" in p and "data/blob.bin" in p for p in problems)
    tamper(store, files["src/lib"].hash, b"not a tree")
    assert any("corrupt tree" in p for p in snaps.verify([tree]))
    assert store.check(corrupt) == (
        f"blob {corrupt} is corrupt: its content hashes to {hashlib.sha256(b'tampered').hexdigest()}"
    )


def test_prune_keeps_what_is_referenced_or_young(store, ws: Path):
    snaps = Snapshots(store)
    trees = []
    for i in range(4):
        write(ws, f"d{i % 2}/f{i}.txt", f"version {i}")
        trees.append(snaps.snapshot(ws).tree)
    artifact = store.put(b"an artifact no checkpoint names")
    stray = store.put(b"nothing names this one")
    referenced = snaps.referenced_blobs(trees[-1:])
    before = set(store.iter_digests())
    assert {artifact, stray} | referenced <= before

    assert snaps.prune([], grace_seconds=3600).deleted == 0  # all young: all kept
    assert snaps.prune(trees[-1:], [artifact], grace_seconds=0, dry_run=True).deleted > 0
    assert set(store.iter_digests()) == before
    res = snaps.prune(trees[-1:], [artifact], grace_seconds=0)
    left = set(store.iter_digests())
    assert left == referenced | {artifact}
    assert res.deleted == len(before - left) and stray not in left
    assert snaps.verify(trees[-1:]) == []


def test_a_checkpoint_that_finds_its_tree_stored_makes_it_young_again(store, ws: Path):
    # Dedup-touch: the stored tree (and so its subtree) gets a fresh grace period.
    sample(ws)
    snaps = Snapshots(store)
    tree = snaps.snapshot(ws).tree
    if isinstance(store, S3BlobStore):
        store.refresh_after = 0.5
        time.sleep(1.1)  # LastModified has whole seconds and cannot be set back
    else:
        os.utime(store.path(tree), (time.time() - 7200, time.time() - 7200))
    before = store.mtime(tree)
    assert snaps.snapshot(ws).tree == tree
    assert store.mtime(tree) > before


class ListedLongAgo:
    """The store as a prune that listed it long ago saw it: every blob old. Everything else is
    the store itself."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def listing(self):
        for digest, size, _ in self._store.listing():
            yield digest, size, 0.0


def test_prune_spares_a_blob_made_young_after_it_was_listed_and_all_it_reaches(store, ws: Path):
    # A checkpoint relied on an old tree (touched it) between the prune's listing and its delete.
    sample(ws)
    tree = Snapshots(store).snapshot(ws).tree
    old_stray = store.put(b"unreferenced")
    res = Snapshots(ListedLongAgo(store)).prune([], grace_seconds=60)
    assert res.deleted == 0
    assert Snapshots(store).verify([tree]) == []
    assert store.exists(old_stray)


# -- S3 only ---------------------------------------------------------------------------------------


def test_every_read_checks_the_digest_and_names_the_blob(s3_url: str, ws: Path, tmp_path: Path):
    store = S3BlobStore(s3_url)
    snaps = Snapshots(store)
    sample(ws)
    tree = snaps.snapshot(ws).tree
    digest = snaps.files(tree)["src/app.py"].hash
    tamper(store, digest, b"print('evil')\n")
    for read in (store.get, store.open, lambda d: store.read_head(d, 5)):
        with pytest.raises(BlobCorrupt, match=f"blob {digest} is corrupt"):
            read(digest)
    assert store.check(digest).startswith(f"blob {digest} is corrupt")
    with pytest.raises(BlobCorrupt, match=digest):
        snaps.read(tree, "src/app.py")
    with pytest.raises((BlobCorrupt, CorruptBlob), match=digest):
        snaps.restore(tree, tmp_path / "elsewhere")


def test_a_missing_blob_fails_a_restore_before_it_touches_anything(s3_url: str, ws: Path, tmp_path):
    store = S3BlobStore(s3_url)
    snaps = Snapshots(store)
    sample(ws)
    tree = snaps.snapshot(ws).tree
    store.delete(snaps.files(tree)["src/app.py"].hash)
    target = tmp_path / "target"
    with pytest.raises(MissingBlob):
        snaps.restore(tree, target)
    assert not target.exists()


def test_a_big_blob_goes_up_in_parts(s3_url: str, ws: Path, tmp_path: Path):
    store = S3BlobStore(s3_url, multipart_threshold=5 << 20)
    big = os.urandom(12 << 20)
    write(ws, "big.bin", big)
    snaps = Snapshots(store)
    tree = snaps.snapshot(ws).tree
    digest = hashlib.sha256(big).hexdigest()
    head = moto.client().head_object(Bucket=store.bucket, Key=store.key(digest))
    assert head["ETag"].strip('"').endswith("-3")  # three parts of 5 MiB at most
    assert store.add(big) == (digest, False)
    snaps.restore(tree, tmp_path / "back")
    assert (tmp_path / "back" / "big.bin").read_bytes() == big


def test_a_batch_names_no_tree_when_aborted(s3_url: str):
    store = S3BlobStore(s3_url)
    batch = store.batch(workers=2)
    files = [batch.add(os.urandom(100))[0] for _ in range(20)]
    tree, added = batch.add(b"a tree naming them", ordered=True)
    assert added and batch.exists(tree) and len(batch) == 21
    batch.abort()
    assert not store.exists(tree)
    batch = store.batch(workers=2)
    batch.add(b"a tree naming them", ordered=True)
    batch.commit()
    assert store.exists(tree) and all(store.exists(d) for d in files)


def test_exists_makes_an_old_blob_young_again(s3_url: str):
    store = S3BlobStore(s3_url, refresh_after=3600)
    digest = store.put(b"deduplicated against")
    first = store.mtime(digest)
    time.sleep(1.1)  # LastModified has whole seconds
    assert store.exists(digest) and store.mtime(digest) == first  # young: left alone
    store.refresh_after = 0.5
    assert store.exists(digest) and store.mtime(digest) > first
    assert store.get(digest) == b"deduplicated against"


def test_a_store_that_is_down_fails_fast_with_one_error(s3_env, monkeypatch):
    server = moto.MotoServer()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        moto.client().create_bucket(Bucket="going-down")
        store = S3BlobStore("s3://going-down/p")
        digest = store.put(b"stored before")
    finally:
        server.stop()
    started = time.monotonic()
    for call in (
        lambda: store.get(digest),
        lambda: store.exists("1" * 64),  # (one it knows to be young needs no request)
        lambda: store.put(b"new"),
        lambda: list(store.listing()),
        store.check_ready,
    ):
        with pytest.raises(BlobStoreUnavailable) as e:
            call()
        assert str(e.value).startswith(
            f"blob store unreachable: {server.endpoint} bucket going-down"
        )
        assert "testing" not in str(e.value)  # no secret in the message
    print(f"five calls against a dead store failed in {time.monotonic() - started:.1f} s")


def test_a_store_that_hangs_times_out_with_the_same_error(s3_env, monkeypatch):
    import socket

    with socket.socket() as hung:  # accepts connections, never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        endpoint = f"http://127.0.0.1:{hung.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        store = S3BlobStore("s3://hung/p", timeout=0.3)
        started = time.monotonic()
        with pytest.raises(BlobStoreUnavailable, match="ReadTimeoutError"):
            store.get("0" * 64)
        print(f"a hung store (timeout 0.3 s) failed in {time.monotonic() - started:.1f} s")


def test_a_bucket_that_does_not_exist_is_refused(s3_env):
    store = S3BlobStore("s3://no-such-bucket-here/p")
    with pytest.raises(BlobStoreUnavailable, match="NoSuchBucket"):
        store.put(b"x")
    with pytest.raises(BlobStoreUnavailable, match="blob store unreachable: "):
        store.check_ready()
    with pytest.raises(BlobStoreUnavailable, match="NoSuchBucket"):
        store.get("0" * 64)


def test_configured_picks_the_backend(s3_url: str, tmp_path: Path):
    s3 = configured(s3_url)
    assert isinstance(s3, S3BlobStore) and configured(s3_url) is s3  # one client per process
    assert s3.describe() == s3_url + "/"
    folder = configured(str(tmp_path / "blobs"))
    assert isinstance(folder, BlobStore) and folder.root == tmp_path / "blobs"
    with pytest.raises(NotImplementedError):
        s3.path("0" * 64)
    with pytest.raises(ValueError):
        S3BlobStore("s3:///no-bucket")
