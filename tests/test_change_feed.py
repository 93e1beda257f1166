"""The workspace change feed (agents/snapshots/feed.py): incremental checkpoints and rewinds that
look only at what changed, and equal a full scan's tree in every case.

Plain pytest on real folders and real inotify; the runtime test at the end drives a real run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.blobstore import BlobStore
from agents.sandbox import Workspace, isolation_available, run_command
from agents.snapshots import ChangeFeed, Snapshots
from agents.snapshots import feed as feeds
from tests.test_snapshots import describe, settle, write

REPO = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap", reason="bubblewrap is not usable here"
)


class Box:
    """A workspace with a store, a stat cache file and a change feed, as a worker has them."""

    def __init__(self, tmp: Path):
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.snaps = Snapshots(BlobStore(tmp / "store"))
        self.cache = tmp / "meta" / "cache.json"
        self.feed = ChangeFeed(self.ws)

    def checkpoint(self, *, incremental: bool | None = True):
        """A checkpoint through the feed, checked against a scan of every file (no cache)."""
        result = self.snaps.snapshot(self.ws, cache_path=self.cache, feed=self.feed)
        full = self.snaps.snapshot(self.ws)
        assert result.tree == full.tree
        assert (result.files, result.dirs, result.links) == (full.files, full.dirs, full.links)
        if incremental is not None:
            assert result.incremental is incremental
        return result

    def close(self) -> None:
        self.feed.close()


@pytest.fixture
def box(tmp_path: Path):
    b = Box(tmp_path)
    write(b.ws, "src/app.py", "print('hi')\n")
    write(b.ws, "src/lib/util.py", "x = 1\n")
    write(b.ws, "docs/readme.md", "# readme\n")
    settle()
    b.checkpoint(incremental=False)  # the first one scans everything: the feed's baseline
    yield b
    b.close()


def test_nothing_changed_costs_no_scan(box: Box) -> None:
    assert not box.feed.pending()
    r = box.checkpoint()
    assert r.listed_dirs == 0 and r.hashed_files == 0 and r.blobs_added == 0


def test_one_change_lists_one_folder_and_reads_one_file(box: Box) -> None:
    write(box.ws, "src/lib/util.py", "x = 2\n")
    assert box.feed.pending()
    r = box.checkpoint()
    assert r.listed_dirs == 1 and r.hashed_files == 1
    assert box.snaps.read(r.tree, "src/lib/util.py") == b"x = 2\n"


def test_files_in_freshly_made_nested_folders_are_caught(box: Box) -> None:
    # Made by another process in one go, before any watch on the new folders can exist.
    subprocess.run(
        ["sh", "-c", "mkdir -p a/b/c/d && echo deep > a/b/c/d/f && echo mid > a/b/m"],
        cwd=box.ws,
        check=True,
    )
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "a/b/c/d/f") == b"deep\n"
    # Watched from now on: a later write inside is seen.
    write(box.ws, "a/b/c/d/g", "later")
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "a/b/c/d/g") == b"later"
    assert box.feed.watched() == 8  # top, src, src/lib, docs, a, a/b, a/b/c, a/b/c/d


def test_renames_and_deletes_of_folders(box: Box) -> None:
    write(box.ws, "src/lib/deeper/x.txt", "x")
    box.checkpoint()
    os.rename(box.ws / "src/lib", box.ws / "moved")
    r = box.checkpoint()
    assert "moved/deeper/x.txt" in box.snaps.files(r.tree)
    assert "src/lib/util.py" not in box.snaps.files(r.tree)
    # Inside the moved folder: still watched, under its new name.
    write(box.ws, "moved/deeper/y.txt", "y")
    box.checkpoint()
    # Swap two folders' names.
    os.rename(box.ws / "moved", box.ws / "tmp")
    os.rename(box.ws / "docs", box.ws / "moved")
    os.rename(box.ws / "tmp", box.ws / "docs")
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "docs/deeper/y.txt") == b"y"
    # Deleted, then made again with the same name and other content.
    shutil.rmtree(box.ws / "docs")
    box.checkpoint()
    write(box.ws, "docs/deeper/z.txt", "z")
    shutil.rmtree(box.ws / "src")
    write(box.ws, "src", "now a file")
    r = box.checkpoint()
    assert set(box.snaps.files(r.tree)) == {
        "docs",
        "docs/deeper",
        "docs/deeper/z.txt",
        "moved",
        "moved/readme.md",
        "src",
    }
    # A folder moved out of the workspace, and one moved in from outside.
    outside = box.ws.parent / "outside"
    write(outside, "in/deep/w.txt", "w")
    os.rename(box.ws / "docs", box.ws.parent / "gone")
    os.rename(outside / "in", box.ws / "in")
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "in/deep/w.txt") == b"w"
    assert not any(p.startswith("docs") for p in box.snaps.files(r.tree))


def test_modes_symlinks_and_special_cases(box: Box) -> None:
    os.chmod(box.ws / "src/app.py", 0o755)
    box.checkpoint()
    os.chmod(box.ws / "src/lib", 0o700)
    box.checkpoint()
    os.symlink("src/lib", box.ws / "link-to-dir")
    os.symlink("/etc", box.ws / "link-out")
    r = box.checkpoint()
    assert box.snaps.files(r.tree)["link-to-dir"].target == "src/lib"
    # Writing through a link into a watched folder is seen in that folder.
    write(box.ws, "link-to-dir/through.txt", "t")
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "src/lib/through.txt") == b"t"
    # A folder replaced by a link to it.
    os.rename(box.ws / "docs", box.ws / "docs-real")
    os.symlink("docs-real", box.ws / "docs")
    box.checkpoint()
    os.mkfifo(box.ws / "src/pipe")
    r = box.checkpoint()
    assert r.skipped == ["src/pipe"]
    # Same size, rewritten right after a checkpoint (within one timestamp tick).
    write(box.ws, "src/app.py", "print('ho')\n")
    box.checkpoint()
    write(box.ws, "src/app.py", "print('hu')\n")
    r = box.checkpoint()
    assert box.snaps.read(r.tree, "src/app.py") == b"print('hu')\n"


@pytest.mark.parametrize("seed", range(3))
def test_random_changes_match_a_full_scan(tmp_path: Path, seed: int) -> None:
    """Random edits, moves, deletes and new folders: every incremental checkpoint's tree equals
    a scan of every file."""
    rng = random.Random(seed)
    b = Box(tmp_path)
    try:
        b.checkpoint(incremental=False)
        for _ in range(25):
            for _ in range(rng.randrange(1, 6)):
                _random_change(b.ws, rng)
            b.checkpoint()
    finally:
        b.close()


@pytest.mark.parametrize("seed", range(3))
def test_the_cache_file_holds_what_each_checkpoint_and_rewind_kept(
    tmp_path: Path, seed: int, monkeypatch
) -> None:
    """A checkpoint appends only the lines of the folders its records changed (cache.Records
    keeps which), and keeps which records are stale and the trees by digest the same way. After
    every checkpoint and rewind of random changes, the file read afresh must hold exactly the
    records in memory (another process trusts it without looking), the stale keys must be
    those of the stale records, and every record must be in the index by its digest."""
    from agents.snapshots import cache as caches

    fast: list[bool] = []
    real = caches.StatCache._changed_since_sync
    monkeypatch.setattr(
        caches.StatCache,
        "_changed_since_sync",
        lambda self, dirs: fast.append((got := real(self, dirs)) is not None) or got,
    )
    rng = random.Random(seed)
    b = Box(tmp_path)

    def check() -> None:
        mem = caches.load_cache(b.cache)
        assert isinstance(mem.dirs, caches.Records)
        disk = caches.StatCache.load(b.cache)
        assert disk.dirs is not mem.dirs
        assert {k: r.to_line(k) for k, r in disk.dirs.items()} == {
            k: r.to_line(k) for k, r in mem.dirs.items()
        }
        assert mem.dirs.stale_keys() == {k for k, r in mem.dirs.items() if r.stale}
        if mem.dirs.trees is not None:
            assert all(mem.dirs.trees[r.tree].tree == r.tree for r in mem.dirs.values())

    try:
        trees = [b.checkpoint(incremental=False).tree]
        for n in range(30):
            for _ in range(rng.randrange(1, 4)):
                with contextlib.suppress(OSError):  # (a move onto a dangling link, a link loop)
                    _random_change(b.ws, rng)
            if n % 4 == 3:
                # A rewind through the feed: what it wrote is marked stale in its records.
                target = rng.choice(trees)
                b.snaps.restore(target, b.ws, cache_path=b.cache, feed=b.feed)
                assert b.snaps.snapshot(b.ws).tree == target
            else:
                trees.append(b.checkpoint().tree)
            check()
            if n % 3 == 2:
                # A record changed in place (StatCache.discard), written at once or only with
                # the next checkpoint, which starts from these records.
                mem = caches.load_cache(b.cache)
                some = sorted(mem.dirs)[rng.randrange(len(mem.dirs))]
                rec = mem.dirs[some]
                if rec.keys:
                    mem.dirs[some] = rec.with_stale([0])
                    if n % 2:
                        mem.sync_to(b.cache)
                        check()
    finally:
        b.close()
    assert fast.count(True) >= 20  # (each checkpoint after the first compared what changed)


def test_the_records_of_earlier_checkpoints_are_freed(box: Box) -> None:
    """Each incremental checkpoint's records are a copy of the last one's that knows what it
    changed (cache.Records): a copy must not keep the records it came from alive (a worker
    checkpoints a run thousands of times)."""
    import gc
    import weakref

    from agents.snapshots import cache as caches

    first = weakref.ref(caches.load_cache(box.cache).dirs)
    for n in range(3):
        write(box.ws, f"src/n{n}.py", "x")
        box.checkpoint()
    gc.collect()
    assert first() is None


def _random_change(ws: Path, rng: random.Random) -> None:
    dirs = [ws] + [p for p in ws.rglob("*") if p.is_dir() and not p.is_symlink()]
    files = [p for p in ws.rglob("*") if p.is_file() and not p.is_symlink()]
    op = rng.choice(["new", "new", "edit", "edit", "rm", "mkdir", "mvdir", "rmdir", "chmod", "ln"])
    d = rng.choice(dirs)
    name = f"n{rng.randrange(1000)}"
    if op == "new" or (op in ("edit", "rm", "chmod") and not files):
        (d / name).write_bytes(rng.randbytes(rng.randrange(0, 300)))
    elif op == "edit":
        rng.choice(files).write_bytes(rng.randbytes(rng.randrange(0, 300)))
    elif op == "rm":
        rng.choice(files).unlink()
    elif op == "chmod":
        os.chmod(rng.choice(files), rng.choice([0o644, 0o600, 0o755]))
    elif op == "mkdir":
        sub = d / name / f"s{rng.randrange(10)}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "f").write_text(name)
    elif op == "ln":
        if not (d / name).exists():
            os.symlink(rng.choice(["x", "..", name]), d / name)
    elif d != ws:
        if op == "rmdir":
            shutil.rmtree(d)
        else:
            target = rng.choice([p for p in dirs if d not in p.parents and p != d])
            if not (target / name).exists():
                os.rename(d, target / name)


@needs_bwrap
def test_the_feed_sees_writes_made_inside_the_sandbox(box: Box) -> None:
    """bash under bwrap writes through a bind mount of the workspace: the host's watches see it."""
    result = run_command(
        "mkdir -p new/deep && echo inside > new/deep/f.txt && echo more >> src/app.py "
        "&& mv docs docs2 && rm src/lib/util.py && ln -s new l",
        workspace=Workspace(box.ws),
        isolation="bwrap",
    )
    assert result.exit_code == 0, result.output
    r = box.checkpoint()
    files = box.snaps.files(r.tree)
    assert box.snaps.read(r.tree, "new/deep/f.txt") == b"inside\n"
    assert box.snaps.read(r.tree, "src/app.py") == b"print('hi')\nmore\n"
    assert "docs2/readme.md" in files and "src/lib/util.py" not in files
    assert files["l"].target == "new"


def test_a_queue_overflow_means_a_full_scan(box: Box) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    a, b = box.ws / "src/app.py", box.ws / "docs/readme.md"
    # The feed's thread (it keeps the shared journal) reads events as they come: held off
    # here, as a worker too busy to read would be, so the kernel's queue overflows.
    with box.feed._lock:
        for n in range(limit // 2 + 100):  # alternating, so the kernel cannot merge them
            os.utime(a, ns=(n, n))
            os.utime(b, ns=(n, n))
    write(box.ws, "src/after.txt", "after")
    assert box.feed.pending()
    r = box.checkpoint(incremental=False)
    assert box.snaps.read(r.tree, "src/after.txt") == b"after"
    assert box.feed.rebuilds == 1
    # The full scan is the new baseline: the feed is trusted again.
    write(box.ws, "src/again.txt", "again")
    box.checkpoint(incremental=True)


def test_no_watch_left_means_a_full_scan(box: Box, monkeypatch) -> None:
    """Past fs.inotify.max_user_watches (ENOSPC from inotify_add_watch) a new folder cannot be
    watched: the feed is lost and checkpoints scan everything until a watch can be added."""
    from inotify_simple import INotify

    real = INotify.add_watch

    def add_watch(self, path, mask):
        if os.fsencode(path).endswith(b"/full"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, path, mask)

    monkeypatch.setattr(INotify, "add_watch", add_watch)
    write(box.ws, "full/f.txt", "f")
    r = box.checkpoint(incremental=False)
    assert box.snaps.read(r.tree, "full/f.txt") == b"f"
    write(box.ws, "full/g.txt", "g")  # unwatched: only a full scan can see it
    r = box.checkpoint(incremental=False)
    assert box.snaps.read(r.tree, "full/g.txt") == b"g"
    monkeypatch.undo()  # watches can be added again: after one more full scan, trusted again
    write(box.ws, "full/h.txt", "h")
    box.checkpoint(incremental=False)
    write(box.ws, "full/i.txt", "i")
    r = box.checkpoint(incremental=True)
    assert box.snaps.read(r.tree, "full/i.txt") == b"i"


def test_a_failed_checkpoint_is_followed_by_a_full_scan(box: Box, monkeypatch) -> None:
    from agents.blobstore import Batch

    write(box.ws, "src/new.txt", "new")

    def fail(self):
        raise OSError(errno.EIO, "disk on fire")

    monkeypatch.setattr(Batch, "commit", fail)
    with pytest.raises(OSError, match="disk on fire"):
        box.snaps.snapshot(box.ws, cache_path=box.cache, feed=box.feed)
    monkeypatch.undo()
    r = box.checkpoint(incremental=False)
    assert box.snaps.read(r.tree, "src/new.txt") == b"new"
    # Nothing of the failed one was named in the store: only temporary files were written, and
    # they are gone.
    assert box.snaps.blobs.stray_temp_files() == []


def test_a_new_process_does_not_trust_the_feed_and_another_writer_breaks_it(box: Box) -> None:
    """A worker restart: the stat cache on disk is the same, but a new process has no feed that
    watched since it was written, so its first checkpoint scans everything. And a cache written
    by another process since this one's last checkpoint makes this one scan everything too."""
    write(box.ws, "src/x.txt", "x")
    code = (
        "import sys; from pathlib import Path\n"
        "from agents.blobstore import BlobStore\n"
        "from agents.snapshots import ChangeFeed, Snapshots\n"
        "ws, store, cache = map(Path, sys.argv[1:4])\n"
        "s = Snapshots(BlobStore(store)); f = ChangeFeed(ws)\n"
        "r1 = s.snapshot(ws, cache_path=cache, feed=f)\n"
        "r2 = s.snapshot(ws, cache_path=cache, feed=f)\n"
        "print(r1.incremental, r2.incremental, r1.tree == r2.tree, r1.tree)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(box.ws), str(box.snaps.blobs.root), str(box.cache)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[:3] == ["False", "True", "True"]
    # This process's feed saw the write, but the cache file is now the other process's.
    r = box.checkpoint(incremental=False)
    assert r.tree == out[3]
    box.checkpoint(incremental=True)


def test_rewind_through_the_feed_is_exact(box: Box) -> None:
    first = box.checkpoint().tree
    before = describe(box.ws)
    write(box.ws, "src/app.py", "changed")
    os.chmod(box.ws / "src/lib/util.py", 0o700)
    write(box.ws, "new/deeper/f.txt", "new")
    os.symlink("src", box.ws / "ln")
    shutil.rmtree(box.ws / "docs")
    os.rename(box.ws / "src/lib", box.ws / "lib2")
    changed = box.checkpoint().tree
    r = box.snaps.restore(first, box.ws, cache_path=box.cache, feed=box.feed)
    assert r.incremental
    assert describe(box.ws) == before
    box.checkpoint()  # the restore's own writes are reported to the next checkpoint
    assert box.checkpoint().tree == first
    # And forward again, with more changes made after the last checkpoint (not checkpointed).
    write(box.ws, "stray/file", "made after the last checkpoint")
    r = box.snaps.restore(changed, box.ws, cache_path=box.cache, feed=box.feed)
    assert r.incremental and ("rm", "stray") in r.actions
    assert box.checkpoint().tree == changed
    assert not (box.ws / "stray").exists()


def test_the_registry_shares_one_feed_and_lets_it_linger(tmp_path: Path, monkeypatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        a = feeds.acquire(ws)
        assert feeds.acquire(tmp_path / "." / "ws") is a
        feeds.release(a)
        feeds.release(a)
        assert feeds.active(ws) is a and not a.closed  # lingering
        monkeypatch.setattr(feeds, "LINGER_SECONDS", 0.0)
        time.sleep(0.01)
        feeds.release(None)
        feeds.acquire(tmp_path / "other-missing")  # expires idle feeds on the way
        assert a.closed and feeds.active(ws) is None
        assert feeds.acquire(tmp_path / "missing") is None  # nothing to watch
    finally:
        feeds.close_all()


def test_the_workspace_folder_removed_loses_the_feed(tmp_path: Path) -> None:
    b = Box(tmp_path)
    try:
        b.checkpoint(incremental=False)
        shutil.rmtree(b.ws)
        changes = b.feed.take()
        assert changes.lost is not None
        b.ws.mkdir()
        assert b.feed.take().lost is not None  # not the same folder: never trusted again
    finally:
        b.close()


@pytest.mark.django_db
def test_a_worker_slice_watches_the_run_workspace(settings, monkeypatch) -> None:
    """Through the runtime: the slice starts the feed, checkpoints after the first are
    incremental, and every checkpoint's tree is what a full scan finds."""
    from agents import workspaces
    from agents.models import Run
    from tests.helpers import call, drive_until_idle, finish_turn, make_run

    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 1}
    results = []
    real = workspaces.snapshot

    def observed(run):
        results.append(real(run))
        return results[-1]

    monkeypatch.setattr(workspaces, "snapshot", observed)
    turn = lambda *calls: {"text": "", "tool_calls": list(calls)}  # noqa: E731
    run = make_run(
        turns=[
            turn(call("write_file", path="a/b/one.txt", content="1")),
            turn(call("bash", command="mkdir -p c/d && echo two > c/d/two.txt")),
            turn(call("edit_file", path="a/b/one.txt", old="1", new="one")),
            finish_turn(),
        ]
    )
    try:
        run = drive_until_idle(run)
        assert run.status == "succeeded", run.status
        assert feeds.active(run.workspace_path) is not None  # lingering after the slice
        assert len(results) >= 4
        assert [r.incremental for r in results][1:4] == [True, True, True]
        trees = list(Run.objects.get(pk=run.pk).checkpoints.values_list("tree", flat=True))
        assert trees[-1] == workspaces.store().snapshot(run.workspace_path).tree
    finally:
        feeds.close_all()
