"""Workspace checkpoints (agents.snapshots): rewind/fork exactness, stat cache, diff, store upkeep.

Plain pytest, no database: every store gets an explicit root.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.blobstore import BlobStore
from agents.snapshots import (
    TREE_MAGIC,
    CorruptBlob,
    MissingBlob,
    Snapshots,
    StatCache,
    decode_name,
    encode_name,
    iter_tree_blobs,
)

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer


# -- helpers -----------------------------------------------------------------------------------


def describe(root: Path) -> dict[bytes, tuple]:
    """Everything a checkpoint promises to keep: per path (bytes) type, mode, content or target."""
    out: dict[bytes, tuple] = {}

    def walk(path: bytes, rel: bytes) -> None:
        with os.scandir(path) as it:
            items = list(it)
        for item in items:
            r = rel + b"/" + item.name if rel else item.name
            st_ = item.stat(follow_symlinks=False)
            if stat.S_ISLNK(st_.st_mode):
                out[r] = ("l", os.readlink(item.path))
            elif stat.S_ISDIR(st_.st_mode):
                out[r] = ("d", stat.S_IMODE(st_.st_mode))
                walk(item.path, r)
            else:
                with open(item.path, "rb") as f:
                    out[r] = ("f", stat.S_IMODE(st_.st_mode), f.read())

    walk(os.fsencode(root), b"")
    return out


def write(root: Path, rel: str | bytes, data: bytes | str, mode: int | None = None) -> bytes:
    path = os.fsencode(root) + b"/" + (rel if isinstance(rel, bytes) else rel.encode())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)
    return path


def settle() -> None:
    """Let the filesystem clock tick past the last write, so the stat cache may trust it."""
    time.sleep(0.03)


@pytest.fixture
def snaps(tmp_path: Path) -> Snapshots:
    return Snapshots(BlobStore(tmp_path / "store"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    p = tmp_path / "ws"
    p.mkdir()
    return p


def sample_tree(ws: Path) -> None:
    write(ws, "README.md", "# hello\n")
    write(ws, "src/app.py", "print('hi')\n")
    write(ws, "src/lib/util.py", "def f():\n    return 1\n")
    write(ws, "bin/run.sh", "#!/bin/sh\necho run\n", 0o755)
    write(ws, "data/blob.bin", bytes(range(256)) * 8)
    (ws / "empty").mkdir()
    settle()


# -- property: any checkpoint can be restored exactly ------------------------------------------

NAMES = [b"a", b"b.txt", b"caf\xe9", "café".encode(), b"b64:x", b"sp ace", b"\xff\xfe"]
paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(b"/".join)
contents = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"\0\0\0", b"line\n" * 5]),
)
ops = st.one_of(
    st.tuples(st.just("write"), paths, contents, st.booleans()),
    st.tuples(st.just("flip"), paths),  # same size, new content: the racy stat case
    st.tuples(st.just("delete"), paths),
    st.tuples(st.just("mkdir"), paths),
    st.tuples(st.just("rmdir"), paths),
    st.tuples(st.just("rmtree"), paths),
    st.tuples(st.just("chmod"), paths, st.booleans()),
    st.tuples(st.just("symlink"), paths, st.sampled_from(["inside", "outside", "dangling", "dir"])),
    st.tuples(st.just("checkpoint")),
)


def _clear(path: bytes) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for n in filenames:
                os.unlink(os.path.join(dirpath, n))
            for n in dirnames:
                p = os.path.join(dirpath, n)
                (os.unlink if os.path.islink(p) else os.rmdir)(p)
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _parents(root: bytes, rel: bytes) -> None:
    """Make every parent of rel a real folder, removing whatever is in the way."""
    parts = rel.split(b"/")[:-1]
    cur = root
    for part in parts:
        cur = cur + b"/" + part
        if os.path.lexists(cur) and (os.path.islink(cur) or not os.path.isdir(cur)):
            os.unlink(cur)
        if not os.path.lexists(cur):
            os.mkdir(cur)


def apply_op(root: bytes, outside: bytes, op: tuple) -> None:
    kind, rel = op[0], op[1] if len(op) > 1 else b""
    path = root + b"/" + rel
    if kind == "write":
        _parents(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            _clear(path)
        elif os.path.islink(path):
            os.unlink(path)
        with open(path, "wb") as f:
            f.write(op[2])
        os.chmod(path, 0o755 if op[3] else 0o644)
    elif kind == "flip":
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                data = f.read()
            if data:
                with open(path, "r+b") as f:
                    f.write(bytes([data[0] ^ 0xFF]) + data[1:])
    elif kind == "delete":
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
    elif kind == "mkdir":
        _parents(root, rel)
        if not os.path.lexists(path):
            os.mkdir(path)
    elif kind == "rmdir":
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
    elif kind == "rmtree":
        _clear(path)
    elif kind == "chmod":
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, 0o755 if op[2] else 0o644)
    elif kind == "symlink":
        _parents(root, rel)
        _clear(path)
        target = {
            "inside": b"../a",
            "outside": outside + b"/victim.txt",
            "dangling": b"no/such\xe9file",
            "dir": outside + b"/dir",
        }[op[2]]
        os.symlink(target, path)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=st.lists(ops, min_size=1, max_size=30), data=st.data())
def test_any_checkpoint_restores_exactly(steps: list[tuple], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        ws, outside = base / "ws", base / "outside"
        ws.mkdir()
        (outside / "dir").mkdir(parents=True)
        (outside / "victim.txt").write_bytes(b"must not change")
        (outside / "dir" / "keep.txt").write_bytes(b"must stay")
        outside_before = describe(outside)
        snaps = Snapshots(BlobStore(base / "store"))
        cache = base / "meta" / "cache.json"
        use_cache = data.draw(st.booleans(), label="use stat cache")
        checkpoints: list[tuple[str, dict]] = []

        def checkpoint() -> None:
            res = snaps.snapshot(ws, cache_path=cache if use_cache else None)
            checkpoints.append((res.tree, describe(ws)))

        for op in steps:
            if op[0] == "checkpoint":
                checkpoint()
            else:
                apply_op(os.fsencode(ws), os.fsencode(outside), op)
        checkpoint()

        order = data.draw(st.permutations(range(len(checkpoints))), label="restore order")
        for i in order:
            tree, expected = checkpoints[i]
            snaps.restore(tree, ws, cache_path=cache if use_cache else None)
            assert describe(ws) == expected
            again = snaps.snapshot(ws, cache_path=cache if use_cache else None)
            assert again.tree == tree
        # Fork: the same tree into a folder that does not exist yet.
        tree, expected = checkpoints[data.draw(st.sampled_from(order), label="fork")]
        snaps.restore(tree, base / "fork")
        assert describe(base / "fork") == expected
        assert snaps.snapshot(base / "fork").tree == tree
        assert describe(outside) == outside_before
        assert snaps.verify([t for t, _ in checkpoints]) == []


@given(st.binary(max_size=40))
def test_name_encoding_round_trips(raw: bytes) -> None:
    key = encode_name(raw)
    assert decode_name(key) == raw
    json.dumps(key, ensure_ascii=False).encode("utf-8")  # no lone surrogates


# -- snapshot and the stat cache ---------------------------------------------------------------


def test_unchanged_tree_same_hash_and_nothing_added(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    cache = tmp_path / "meta" / "cache.json"
    first = snaps.snapshot(ws, cache_path=cache)
    assert first.files == 5 and first.dirs == 5 and first.hashed_files == 5
    second = snaps.snapshot(ws, cache_path=cache)
    assert second.tree == first.tree
    assert (second.blobs_added, second.bytes_added, second.hashed_files) == (0, 0, 0)
    # Without a cache everything is read again, but still nothing new is stored.
    third = snaps.snapshot(ws)
    assert third.tree == first.tree and third.hashed_files == 5 and third.blobs_added == 0


def test_one_changed_file_adds_its_blob_and_the_trees_on_its_path(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    first = snaps.snapshot(ws, cache_path=cache)
    write(ws, "src/lib/util.py", "def f():\n    return 2\n")
    res = snaps.snapshot(ws, cache_path=cache)
    assert res.tree != first.tree
    assert res.hashed_files == 1
    # util.py's blob + the trees of src/lib, src and the root.
    assert res.blobs_added == 4
    assert res.bytes_added < 2_000
    assert snaps.read(res.tree, "src/lib/util.py") == b"def f():\n    return 2\n"
    assert snaps.read(first.tree, "src/lib/util.py") == b"def f():\n    return 1\n"


def test_file_touched_but_same_content_is_rehashed_not_stored(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    first = snaps.snapshot(ws, cache_path=cache)
    os.utime(ws / "README.md")
    res = snaps.snapshot(ws, cache_path=cache)
    assert (res.tree, res.hashed_files, res.blobs_added) == (first.tree, 1, 0)


def test_racy_entries_are_not_trusted(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    # A timestamp at or after the checkpoint's start could be shared by a later write.
    future = time.time_ns() + 60 * 10**9
    os.utime(ws / "README.md", ns=(future, future))
    snaps.snapshot(ws, cache_path=cache)
    assert StatCache.load(cache).get("README.md") is None
    assert StatCache.load(cache).get("src/app.py") is not None
    res = snaps.snapshot(ws, cache_path=cache)
    assert res.hashed_files == 1


def test_same_size_rewrite_right_after_a_checkpoint_is_seen(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    cache = tmp_path / "cache.json"
    path = write(ws, "f.txt", "aaaa")
    # Write, checkpoint, rewrite at once: often all within one timestamp tick.
    for i in range(20):
        before = snaps.snapshot(ws, cache_path=cache)
        with open(path, "wb") as f:
            f.write(b"%04d" % i)
        after = snaps.snapshot(ws, cache_path=cache)
        assert after.tree != before.tree
        assert snaps.read(after.tree, "f.txt") == b"%04d" % i


def test_the_filesystem_s_clock_is_a_kept_file_s_mtime_set_to_now(tmp_path: Path):
    """Which records are trusted is decided by the filesystem's own "now" (its clock, its
    granularity): a file's mtime set to now, as a new file's would be. One file is kept for it
    per folder; it is not made again on every checkpoint."""
    from agents.snapshots import scan

    folder = tmp_path / "meta"
    dev = tmp_path.stat().st_dev
    clocks = []
    for _ in range(5):
        before = os.stat(write(tmp_path, f"before{len(clocks)}", "x")).st_mtime_ns
        clocks.append(scan.fs_clock(dev, [folder], create=True))
        after = os.stat(write(tmp_path, f"after{len(clocks)}", "x")).st_mtime_ns
        assert before <= clocks[-1] <= after
    assert clocks == sorted(clocks)
    assert [p.name for p in folder.iterdir()] == [".clock"]
    # A folder on another device is no clock for this one: the fallback (well in the past).
    assert scan.fs_clock(dev + 1, [folder], create=False) < time.time_ns() - 10**9
    # Its folder removed and made again: still the filesystem's clock.
    (folder / ".clock").unlink()
    folder.rmdir()
    now = scan.fs_clock(dev, [folder], create=True)
    assert clocks[-1] <= now <= os.stat(write(tmp_path, "last", "x")).st_mtime_ns


def test_rewrite_that_keeps_size_and_mtime_is_seen(snaps: Snapshots, ws: Path, tmp_path: Path):
    # What `cp -p` or `tar x` over an existing file does: same inode, size and mtime.
    cache = tmp_path / "cache.json"
    path = write(ws, "f.txt", "aaaa")
    old = os.stat(path)
    settle()
    first = snaps.snapshot(ws, cache_path=cache)
    with open(path, "r+b") as f:
        f.write(b"bbbb")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert os.stat(path).st_ino == old.st_ino
    second = snaps.snapshot(ws, cache_path=cache)
    assert second.tree != first.tree and snaps.read(second.tree, "f.txt") == b"bbbb"


def test_a_cache_file_replaced_by_another_process_is_read_again(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    snaps.snapshot(ws, cache_path=cache)
    assert Snapshots(snaps.blobs).snapshot(ws, cache_path=cache).hashed_files == 0
    StatCache().save(cache)  # what another worker process writing the same file looks like
    assert snaps.snapshot(ws, cache_path=cache).hashed_files == 5


def test_stat_cache_serialisation_and_bad_files(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    write(ws, b"caf\xe9/b64:x", "odd names")
    settle()
    c = StatCache()
    snaps.snapshot(ws, cache=c)
    again = StatCache.from_json(c.to_json())
    assert again.to_json() == c.to_json() and set(again.dirs) == set(c.dirs)
    assert again.get("src/app.py") == c.get("src/app.py") is not None
    assert again.get(b"caf\xe9/b64:x") is not None and len(again) == len(c) == 6
    assert snaps.snapshot(ws, cache=again).hashed_files == 0
    (tmp_path / "bad.json").write_text("{not json")
    assert len(StatCache.load(tmp_path / "bad.json")) == 0
    assert len(StatCache.load(tmp_path / "missing.json")) == 0
    # The format before per-folder records: ignored, so every file is read once more.
    assert len(StatCache.from_json('{"version": 2, "dirs": {"": {"a": [1, 2, 3, 4, "0"]}}}')) == 0
    # A damaged or torn line costs only its own folder.
    text = c.to_json().split("\n")
    text[2] = text[2][: len(text[2]) // 2]
    damaged = StatCache.from_json("\n".join(text))
    assert len(damaged.dirs) == len(c.dirs) - 1
    bad_record = json.loads(c.to_json().split("\n")[1])
    bad_record[5][0] = ["not", "a", "stat"]
    assert len(StatCache.from_json(StatCache.HEADER + "\n" + json.dumps(bad_record))) == 0


def folders(root: Path, depth: int, width: int) -> list[str]:
    """width**depth leaf folders (plus their parents), two files in each folder."""
    paths = [""]
    for _ in range(depth):
        paths = [f"{p}/d{i}" if p else f"d{i}" for p in paths for i in range(width)]
    for p in paths:
        write(root, f"{p}/a.txt", f"a of {p}\n")
        write(root, f"{p}/b.bin", bytes(range(40)) + p.encode())
    for p in {"/".join(x.split("/")[:-1]) for x in paths}:
        write(root, f"{p}/top.txt" if p else "top.txt", f"top of {p}\n")
    return paths


def test_unchanged_folders_are_reused_and_a_changed_child_is_still_seen(snaps: Snapshots, ws: Path):
    leaves = folders(ws, 3, 3)
    settle()
    cache = StatCache()
    first = snaps.snapshot(ws, cache=cache)
    before = dict(cache.dirs)
    # In place, same size, old mtime put back: only ctime (and the content) tell.
    path = ws / leaves[13] / "a.txt"
    old = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"A")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    res = snaps.snapshot(ws, cache=cache)
    assert res.tree != first.tree and res.hashed_files == 1
    assert snaps.read(res.tree, f"{leaves[13]}/a.txt") == b"A of " + leaves[13].encode() + b"\n"
    changed = {k for k in cache.dirs if cache.dirs[k] is not before[k]}
    # The leaf and every folder above it; every other folder's record is reused as is.
    assert changed == {"", "d1", "d1/d1", "d1/d1/d1"}
    assert res.tree == snaps.snapshot(ws).tree


CHANGES = [
    ("add a file", lambda ws: write(ws, "d2/d0/new.txt", "new")),
    ("remove a file", lambda ws: os.unlink(ws / "d0/d1/a.txt")),
    ("add an empty folder", lambda ws: os.mkdir(ws / "d1/d2/empty")),
    ("remove an empty folder", lambda ws: os.rmdir(ws / "d1/d2/empty")),
    ("make a file executable", lambda ws: os.chmod(ws / "d2/d2/b.bin", 0o755)),
    ("change a folder's mode", lambda ws: os.chmod(ws / "d0/d0", 0o750)),
    ("add a link", lambda ws: os.symlink("aaaa", ws / "d1/d1/link")),
    ("retarget a link, same length", lambda ws: _relink(ws / "d1/d1/link", "bbbb")),
    ("replace a file by a folder", lambda ws: _file_to_dir(ws / "d2/d1/a.txt")),
    ("add a non-UTF-8 name", lambda ws: write(ws, b"d0/d2/caf\xe9", "latin-1")),
    ("rename a file", lambda ws: os.rename(ws / "d0/d2/b.bin", ws / "d0/d2/c.bin")),
    ("remove a folder tree", lambda ws: _clear(os.fsencode(ws / "d2/d2"))),
    ("same-size rewrite", lambda ws: write(ws, "d1/d0/a.txt", "a of d1/d9\n")),
]


def _relink(path: Path, target: str) -> None:
    os.unlink(path)
    os.symlink(target, path)


def _file_to_dir(path: Path) -> None:
    os.unlink(path)
    path.mkdir()
    (path / "inner.txt").write_text("inner")


@pytest.mark.parametrize("wait", [True, False], ids=["settled", "same-tick"])
def test_every_kind_of_change_under_reused_folders_is_seen(tmp_path: Path, wait: bool):
    snaps = Snapshots(BlobStore(tmp_path / "store"))
    ws = tmp_path / "ws"
    folders(ws, 2, 3)
    cache = tmp_path / "meta" / "cache.json"
    snaps.snapshot(ws, cache_path=cache)
    for what, change in CHANGES:
        if wait:
            settle()  # the records are trusted: the reuse path is what sees the change
        change(ws)
        res = snaps.snapshot(ws, cache_path=cache)
        assert res.tree == snaps.snapshot(ws).tree, what  # the same as reading everything
        restored = tmp_path / "fork" / what
        snaps.restore(res.tree, restored)
        assert describe(restored) == describe(ws), what


def test_cache_file_is_appended_per_changed_folder_and_untouched_when_nothing_changed(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    leaves = folders(ws, 2, 3)
    settle()
    cache = tmp_path / "cache.json"
    first = snaps.snapshot(ws, cache_path=cache)
    st1 = os.stat(cache)
    assert snaps.snapshot(ws, cache_path=cache).hashed_files == 0
    st2 = os.stat(cache)
    assert (st2.st_ino, st2.st_size, st2.st_mtime_ns) == (st1.st_ino, st1.st_size, st1.st_mtime_ns)
    lines = cache.read_text().splitlines()
    write(ws, f"{leaves[4]}/a.txt", "changed")
    snaps.snapshot(ws, cache_path=cache)
    st3 = os.stat(cache)
    # Same file, one new line each for the leaf, its parent and the top.
    assert st3.st_ino == st1.st_ino
    assert cache.read_text().splitlines()[: len(lines)] == lines
    assert len(cache.read_text().splitlines()) == len(lines) + 3
    # What another process reads from the file is the same cache.
    settle()
    snaps.snapshot(ws, cache_path=cache)
    other = StatCache.load(cache)
    res = snaps.snapshot(ws, cache=other)
    assert res.hashed_files == 0 and res.tree != first.tree
    # A folder that is gone is dropped from the file too.
    _clear(os.fsencode(ws / "d1"))
    snaps.snapshot(ws, cache_path=cache)
    assert not any(k.startswith("d1") for k in StatCache.load(cache).dirs)


def test_cache_log_is_compacted(snaps: Snapshots, ws: Path, tmp_path: Path):
    write(ws, "a/f.txt", "0")
    cache = tmp_path / "cache.json"
    for i in range(150):
        write(ws, "a/f.txt", str(i))
        snaps.snapshot(ws, cache_path=cache)
    assert len(cache.read_text().splitlines()) <= 1 + 2 + 64 + 2
    settle()
    last = snaps.snapshot(ws, cache_path=cache)
    loaded = StatCache.load(cache)
    assert loaded.get("a/f.txt")[0] == 3 and len(loaded.dirs) == 2
    res = snaps.snapshot(ws, cache=loaded)
    assert (res.tree, res.hashed_files) == (last.tree, 0)
    assert snaps.read(res.tree, "a/f.txt") == b"149"


def test_torn_cache_file_is_rewritten_before_appending(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    snaps.snapshot(ws, cache_path=cache)
    # A crash in the middle of an append: half a line at the end.
    with open(cache, "a") as f:
        f.write('["src",')
    write(ws, "src/app.py", "print('changed')\n")
    res = snaps.snapshot(ws, cache_path=cache)
    text = cache.read_text()
    assert text.endswith("\n") and '["src",\n' not in text and '["src",[' not in text
    assert all(json.loads(line) for line in text.splitlines())
    assert StatCache.load(cache).get("README.md") is not None
    assert res.tree == snaps.snapshot(ws).tree


def test_a_cache_that_names_a_missing_blob_for_other_content_is_not_believed(
    snaps: Snapshots, ws: Path
):
    sample_tree(ws)
    cache = StatCache()
    truth = snaps.snapshot(ws, cache=cache).tree
    # A record whose stat matches but whose digest is wrong (and not stored).
    rec = cache.dirs["src"]
    i = rec.keys.index("app.py")
    rec.vals[i] = "f" * 64
    rec._entries = None
    rec.tree = "e" * 64
    res = snaps.snapshot(ws, cache=cache)
    assert res.tree == truth
    assert snaps.verify([res.tree]) == []
    # A record whose tree digest is not that of its entries (and not stored): not believed
    # either, so no stored tree ever names it.
    cache.dirs["src/lib"].tree = "d" * 64
    write(ws, "README.md", "# changed\n")
    res = snaps.snapshot(ws, cache=cache)
    assert res.tree == snaps.snapshot(ws).tree
    assert snaps.verify([res.tree]) == []


def test_cached_digest_whose_blob_was_pruned_is_stored_again(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    cache = tmp_path / "cache.json"
    write(ws, "keep.txt", "kept")
    write(ws, "sub/f.txt", "one")
    settle()
    a = snaps.snapshot(ws, cache_path=cache)
    write(ws, "sub/f.txt", "two")
    settle()
    b = snaps.snapshot(ws, cache_path=cache)  # cached: sub/f.txt -> blob of "two"
    snaps.prune([a.tree], grace_seconds=0)  # checkpoint b was never recorded
    assert not snaps.blobs.exists(b.tree)
    c = snaps.snapshot(ws, cache_path=cache)
    assert c.tree == b.tree
    assert snaps.verify([c.tree]) == []


def test_store_or_cache_inside_workspace_is_refused(ws: Path):
    with pytest.raises(ValueError, match="blob store"):
        Snapshots(BlobStore(ws / "store")).snapshot(ws)
    with pytest.raises(ValueError, match="stat cache"):
        Snapshots(BlobStore(ws.parent / "store")).snapshot(ws, cache_path=ws / ".cache")


def test_special_files_are_skipped(snaps: Snapshots, ws: Path):
    write(ws, "a.txt", "a")
    os.mkfifo(ws / "pipe")
    res = snaps.snapshot(ws)
    assert res.skipped == ["pipe"] and res.files == 1
    assert set(snaps.files(res.tree)) == {"a.txt"}


def test_large_file_is_streamed_and_round_trips(snaps: Snapshots, ws: Path, tmp_path: Path):
    big = random.Random(1).randbytes(3 * 2**20 + 5)
    write(ws, "big.bin", big)
    res = snaps.snapshot(ws)
    entry = snaps.files(res.tree)["big.bin"]
    assert entry.size == len(big) and entry.hash == hashlib.sha256(big).hexdigest()
    assert snaps.blobs.get(entry.hash) == big
    snaps.restore(res.tree, tmp_path / "fork")
    assert (tmp_path / "fork" / "big.bin").read_bytes() == big
    assert not snaps.blobs.stray_temp_files()


def test_files_and_read(snaps: Snapshots, ws: Path):
    sample_tree(ws)
    os.symlink("../README.md", ws / "src" / "link")
    write(ws, b"caf\xe9", b"latin-1 name")
    tree = snaps.snapshot(ws).tree
    listing = snaps.files(tree)
    assert listing["bin/run.sh"].mode == 0o755 and listing["bin/run.sh"].type == "f"
    assert listing["empty"].type == "d"
    assert listing["src/link"].type == "l" and listing["src/link"].target == "../README.md"
    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert listing[name].raw_path == b"caf\xe9"
    assert snaps.read(tree, b"caf\xe9") == b"latin-1 name"
    assert snaps.read(tree, name) == b"latin-1 name"
    with pytest.raises(FileNotFoundError):
        snaps.read(tree, "nope")
    with pytest.raises(IsADirectoryError):
        snaps.read(tree, "src")
    with pytest.raises(ValueError, match="symlink"):
        snaps.read(tree, "src/link")


def test_tree_objects_are_canonical_json(snaps: Snapshots, ws: Path):
    write(ws, "b", "2")
    write(ws, "a", "1", 0o600)
    tree = snaps.snapshot(ws).tree
    raw = snaps.blobs.get(tree)
    assert raw.startswith(TREE_MAGIC)
    entries = json.loads(raw[len(TREE_MAGIC) :])
    assert list(entries) == ["a", "b"]
    assert entries["a"] == {"t": "f", "h": hashlib.sha256(b"1").hexdigest(), "m": 0o600, "s": 1}
    body = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    assert raw == TREE_MAGIC + body


# -- symlinks and restore ----------------------------------------------------------------------


def test_symlink_outside_is_stored_as_link_and_never_written_through(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    victim = tmp_path / "victim.txt"
    victim.write_text("outside")
    write(ws, "config.txt", "inside")
    tree_file = snaps.snapshot(ws).tree
    (ws / "config.txt").unlink()
    os.symlink(victim, ws / "config.txt")
    os.symlink("/nonexistent/target", ws / "dangling")
    tree_link = snaps.snapshot(ws).tree
    entry = snaps.files(tree_link)["config.txt"]
    assert entry.type == "l" and entry.target == str(victim) and entry.hash is None

    res = snaps.restore(tree_file, ws)
    assert res.written == 1 and res.removed == 1
    assert not (ws / "config.txt").is_symlink()
    assert (ws / "config.txt").read_text() == "inside"
    assert victim.read_text() == "outside"

    snaps.restore(tree_link, ws)
    assert os.readlink(ws / "config.txt") == str(victim)
    assert os.readlink(ws / "dangling") == "/nonexistent/target"
    assert victim.read_text() == "outside"


def test_restore_removes_extras_without_following_links(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    tree = snaps.snapshot(ws).tree
    expected = describe(ws)
    outside = tmp_path / "outside"
    write(outside, "precious/data.txt", "keep me")
    write(ws, "extra.txt", "x")
    write(ws, "new/deeper/more/file.txt", "x")
    os.symlink(outside / "precious", ws / "new" / "link-to-outside")
    os.symlink(outside, ws / "src" / "lib" / "escape")
    write(ws, "locked/inner/f.txt", "x")
    os.chmod(ws / "locked" / "inner", 0o500)
    os.chmod(ws / "locked", 0o500)
    (ws / "empty").rmdir()
    write(ws, "empty", "now a file")

    res = snaps.restore(tree, ws)
    assert describe(ws) == expected
    assert (outside / "precious" / "data.txt").read_text() == "keep me"
    assert res.removed == 5 and res.written == 0
    assert snaps.snapshot(ws).tree == tree


def test_restore_only_touches_what_differs(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    cache = tmp_path / "cache.json"
    tree = snaps.snapshot(ws, cache_path=cache).tree
    write(ws, "src/app.py", "print('changed')\n")
    os.chmod(ws / "README.md", 0o600)
    inode = os.stat(ws / "data/blob.bin").st_ino
    res = snaps.restore(tree, ws, cache_path=cache)
    assert (res.written, res.modes_set, res.removed, res.unchanged) == (1, 1, 0, 4)
    assert os.stat(ws / "data/blob.bin").st_ino == inode
    assert stat.S_IMODE(os.stat(ws / "README.md").st_mode) == 0o644
    again = snaps.snapshot(ws, cache_path=cache)
    assert again.tree == tree and again.hashed_files <= 2


def test_restore_keeps_modes_including_read_only_folders(
    snaps: Snapshots, ws: Path, tmp_path: Path
):
    write(ws, "ro/inside.txt", "x", 0o444)
    write(ws, "tool", "#!/bin/sh\n", 0o750)
    os.chmod(ws / "ro", 0o555)
    tree = snaps.snapshot(ws).tree
    expected = describe(ws)
    try:
        snaps.restore(tree, tmp_path / "fork")
        assert describe(tmp_path / "fork") == expected
        os.chmod(ws / "ro", 0o755)
        write(ws, "ro/inside.txt", "changed", 0o644)
        write(ws, "ro/extra", "y")
        os.chmod(ws / "ro", 0o555)
        snaps.restore(tree, ws)
        assert describe(ws) == expected
    finally:
        for p in (ws / "ro", tmp_path / "fork" / "ro"):
            if p.exists():
                os.chmod(p, 0o755)


def test_dry_run_changes_nothing(snaps: Snapshots, ws: Path):
    sample_tree(ws)
    tree = snaps.snapshot(ws).tree
    write(ws, "extra.txt", "x")
    write(ws, "README.md", "changed")
    before = describe(ws)
    res = snaps.restore(tree, ws, dry_run=True)
    assert res.dry_run and describe(ws) == before
    assert sorted(res.actions) == [("rm", "extra.txt"), ("write", "README.md")]


def test_restore_fails_before_touching_anything_when_a_blob_is_missing(snaps: Snapshots, ws: Path):
    sample_tree(ws)
    tree = snaps.snapshot(ws).tree
    snaps.blobs.delete(snaps.files(tree)["src/app.py"].hash)
    write(ws, "README.md", "changed")
    write(ws, "src/app.py", "changed")
    before = describe(ws)
    with pytest.raises(MissingBlob):
        snaps.restore(tree, ws)
    assert describe(ws) == before


# -- diff --------------------------------------------------------------------------------------


def test_diff_between_checkpoints(snaps: Snapshots, ws: Path):
    sample_tree(ws)
    old = snaps.snapshot(ws).tree
    write(ws, "src/app.py", "print('hi')\nprint('there')\n")
    write(ws, "data/blob.bin", bytes(range(256)) * 9)
    write(ws, "NEW.txt", "brand new\n")
    (ws / "src" / "lib" / "util.py").unlink()
    os.chmod(ws / "README.md", 0o600)
    (ws / "empty").rmdir()
    write(ws, "empty", "was a folder")
    new = snaps.snapshot(ws).tree

    changes = {c.path: c for c in snaps.diff(old, new)}
    assert {p: c.status for p, c in changes.items()} == {
        "NEW.txt": "added",
        "README.md": "mode_changed",
        "data/blob.bin": "changed",
        "empty": "type_changed",
        "src/app.py": "changed",
        "src/lib/util.py": "removed",
    }
    app = changes["src/app.py"]
    assert app.binary is False
    assert app.diff == (
        "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1,2 @@\n print('hi')\n+print('there')\n"
    )
    blob = changes["data/blob.bin"]
    assert blob.binary is True and blob.diff is None
    assert (blob.old_size, blob.new_size) == (2048, 2304)
    assert blob.old_hash != blob.new_hash
    assert changes["README.md"].old_mode == 0o644 and changes["README.md"].new_mode == 0o600
    assert changes["NEW.txt"].diff.endswith("+brand new\n")
    assert "-    return 1\n" in changes["src/lib/util.py"].diff
    assert (changes["empty"].old_type, changes["empty"].new_type) == ("d", "f")
    assert snaps.diff(old, old) == []


def test_diff_is_cut_with_a_note(snaps: Snapshots, ws: Path):
    write(ws, "big.txt", "".join(f"line {i}\n" for i in range(5000)))
    old = snaps.snapshot(ws).tree
    write(ws, "big.txt", "".join(f"LINE {i}\n" for i in range(5000)))
    write(ws, "noeol.txt", "no newline")
    (c, n) = snaps.diff(old, snaps.snapshot(ws).tree, max_diff_bytes=1000)
    assert c.note == "diff truncated"
    assert len(c.diff.encode()) < 1100 and c.diff.endswith(
        "[diff cut here: longer than 1000 bytes]\n"
    )
    assert n.diff.endswith("+no newline\n\\ No newline at end of file\n")


def test_diff_against_the_live_workspace(snaps: Snapshots, ws: Path, tmp_path: Path):
    sample_tree(ws)
    tree = snaps.snapshot(ws).tree
    blobs_before = set(snaps.blobs.iter_digests())
    write(ws, "README.md", "# hello\nworld\n")
    write(ws, "scratch/notes.txt", "todo\n")
    os.symlink("README.md", ws / "alias")
    changes = {c.path: c for c in snaps.diff(tree, ws)}
    assert {p: c.status for p, c in changes.items()} == {
        "README.md": "changed",
        "alias": "added",
        "scratch": "added",
        "scratch/notes.txt": "added",
    }
    assert changes["README.md"].diff.endswith(" # hello\n+world\n")
    assert changes["alias"].new_target == "README.md"
    assert set(snaps.blobs.iter_digests()) == blobs_before  # looking stores nothing
    everything = snaps.diff(None, tree, text_diffs=False)
    assert {c.status for c in everything} == {"added"} and len(everything) == 10


# -- store maintenance -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [5, (1 << 20) + 7])  # read whole, and streamed in chunks
def test_a_restore_refuses_a_stored_file_that_does_not_match_its_digest(
    snaps: Snapshots, ws: Path, tmp_path: Path, size: int
):
    write(ws, "big.bin", b"x" * size)
    write(ws, "keep.txt", "as it was")
    tree = snaps.snapshot(ws).tree
    digest = snaps.files(tree)["big.bin"].hash
    snaps.blobs.path(digest).write_bytes(b"y" * size)  # same size, other content
    write(ws, "big.bin", "changed since")
    with pytest.raises(CorruptBlob, match=digest):
        snaps.restore(tree, ws)
    assert (ws / "big.bin").read_bytes() == b"changed since"  # never the damaged content
    assert sorted(p.name for p in ws.iterdir()) == ["big.bin", "keep.txt"]  # no temp file left
    with pytest.raises(CorruptBlob, match=digest):
        snaps.restore(tree, tmp_path / "fork")
    assert not (tmp_path / "fork" / "big.bin").exists()


def test_verify_finds_corrupt_and_missing_blobs(snaps: Snapshots, ws: Path):
    sample_tree(ws)
    tree = snaps.snapshot(ws).tree
    assert snaps.verify([tree]) == []
    listing = snaps.files(tree)
    corrupt, missing = listing["src/app.py"].hash, listing["data/blob.bin"].hash
    snaps.blobs.path(corrupt).write_bytes(b"tampered")
    snaps.blobs.delete(missing)
    problems = snaps.verify([tree])
    assert len(problems) == 2
    assert any(f"corrupt blob {corrupt}" in p and "src/app.py" in p for p in problems)
    assert any(f"missing blob {missing}" in p and "data/blob.bin" in p for p in problems)
    snaps.blobs.delete(listing["src/lib"].hash)
    assert any("missing tree" in p for p in snaps.verify([tree]))
    assert "missing tree" in snaps.verify(["0" * 64])[0]


def test_prune_never_deletes_a_referenced_blob(snaps: Snapshots, ws: Path):
    rng = random.Random(7)
    trees = []
    for i in range(12):
        write(ws, f"d{i % 3}/f{rng.randrange(6)}.txt", f"version {i}")
        if i % 4 == 0:
            write(ws, f"big{i}.bin", rng.randbytes(2**20 + 10))
        trees.append(snaps.snapshot(ws).tree)
    artifact = snaps.blobs.put(b"an artifact, no checkpoint names it")
    keep = rng.sample(trees, 4)
    referenced = snaps.referenced_blobs(keep)
    assert set(keep) <= referenced
    stored = set(snaps.blobs.iter_digests())
    assert snaps.prune(keep, [artifact], dry_run=True, grace_seconds=0).deleted > 0
    assert set(snaps.blobs.iter_digests()) == stored

    # Within the grace period nothing is deleted, whatever is kept.
    assert snaps.prune([], grace_seconds=3600).deleted == 0
    res = snaps.prune(keep, [artifact], grace_seconds=0)
    left = set(snaps.blobs.iter_digests())
    assert referenced | {artifact} == left
    assert res.deleted == len(stored - left) and res.kept == len(left)
    assert snaps.verify(keep) == []
    for tree in keep:
        snaps.restore(tree, ws)
    for _, entries in iter_tree_blobs(snaps.blobs):
        for e in entries.values():
            assert e["t"] == "l" or e["h"] in left


def test_blobstore_helpers(tmp_path: Path):
    store = BlobStore(tmp_path / "store")
    assert list(store.iter_digests()) == [] and store.size_bytes() == 0
    a, b = store.put(b"a"), store.put(b"bb")
    assert store.add(b"a") == (a, False)
    (tmp_path / "store" / ".tmp-stray").write_bytes(b"x")
    (store.path(a).parent / ".tmp-stray").write_bytes(b"x")
    assert sorted(store.iter_digests()) == sorted([a, b])
    assert store.size_bytes() == 3
    assert len(store.stray_temp_files()) == 2
    assert store.remove_stray_temp(older_than_seconds=3600) == 0
    assert store.remove_stray_temp(older_than_seconds=0) == 2
    assert store.delete(a) and not store.delete(a) and not store.exists(a)
    with pytest.raises(ValueError):
        store.path("../etc/passwd")


def test_modules_do_not_need_django(tmp_path: Path):
    code = (
        "import sys; from pathlib import Path\n"
        "from agents.snapshots import Snapshots; from agents.blobstore import BlobStore\n"
        f"Path({str(tmp_path)!r}, 'w').mkdir(); Path({str(tmp_path)!r}, 'w', 'f').write_text('x')\n"
        f"Snapshots(BlobStore({str(tmp_path / 's')!r})).snapshot(Path({str(tmp_path)!r}, 'w'))\n"
        "assert 'django' not in sys.modules, 'django was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True)


# -- crash safety ------------------------------------------------------------------------------

CHILD = """
import sys, time
from pathlib import Path
from agents.blobstore import BlobStore
from agents.snapshots import Snapshots

snaps = Snapshots(BlobStore(sys.argv[1]))
print("ready", flush=True)
started = time.perf_counter()
snaps.snapshot(Path(sys.argv[2]))
print("done", time.perf_counter() - started, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_snapshot_never_leaves_a_tree_naming_a_missing_blob(tmp_path: Path):
    rng = random.Random(1234)
    ws, store_root = tmp_path / "ws", tmp_path / "store"
    # One file per folder: as many trees as files, so kills land in the tree-writing phase too.
    small = [f"d{d}/e{f}/f.txt" for d in range(30) for f in range(30)]

    def mutate(round_: int) -> None:
        # New content everywhere, so every round has a whole checkpoint's worth of blobs to write.
        for rel in small:
            write(ws, rel, f"round {round_} {rel}\n" * rng.randrange(1, 40))
        write(ws, "large/blob.bin", rng.randbytes(3 * 2**20))

    def child(store: Path) -> subprocess.Popen:
        """A process that snapshots `ws` into `store`, once it has said it is ready: the kill
        is timed from there, so the interpreter's start-up (slow on a busy machine) is not in
        the window."""
        cmd = [sys.executable, "-c", CHILD, str(store), str(ws)]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\n"
        return proc

    mutate(-1)
    # How long the snapshot itself takes, into an empty store as round 0's is.
    full = float(child(tmp_path / "scratch-store").communicate()[0].split()[1])

    killed = rounds = 0
    seen: set[str] = set()
    # At least 4 snapshots killed part way: on a loaded machine the first timing can be long,
    # so a snapshot that finished before its kill says how long one takes now (aim earlier).
    while killed < 4 and rounds < 16:
        mutate(rounds)
        rounds += 1
        proc = child(store_root)
        time.sleep(rng.uniform(0.1, 0.9) * full)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        if b"done" in out:
            full = min(full, float(out.split()[1]))
        else:
            killed += 1

        store = BlobStore(store_root)
        digests = set(store.iter_digests())
        for digest, entries in iter_tree_blobs(store):
            for e in entries.values():
                if e["t"] != "l":
                    assert e["h"] in digests, f"tree {digest} names missing {e['h']}"
        # Every stored blob is whole: its content hashes to its name.
        for digest in digests - seen:
            assert hashlib.sha256(store.get(digest)).hexdigest() == digest
        seen = digests
    assert killed >= 4, f"only {killed} of {rounds} children were killed before finishing"

    snaps = Snapshots(BlobStore(store_root))
    (store_root / ".tmp-left-by-a-crash").write_bytes(b"half a blob")
    tree = snaps.snapshot(ws).tree
    assert snaps.verify([tree]) == []
    assert all(len(d) == 64 for d in snaps.blobs.iter_digests())
    snaps.restore(tree, tmp_path / "fork")
    assert describe(tmp_path / "fork") == describe(ws)
