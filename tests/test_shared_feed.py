"""A checkpoint from a process that keeps no change feed (the web's "Checkpoint now", the CLI,
another worker) uses the journal the watching worker's feed publishes (agents/snapshots/
journal.py): it looks only at the folders that changed, and its tree is a full scan's, in every
case; whenever the journal cannot be trusted it scans everything, as before.

Plain pytest on real folders and real inotify; the "other process" is a real one where it matters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.blobstore import BlobStore
from agents.snapshots import ChangeFeed, Snapshots, journal, lazy
from tests.test_snapshots import describe, settle, write

REPO = Path(__file__).resolve().parent.parent

OTHER = """
import json, sys
from pathlib import Path
from agents.blobstore import BlobStore
from agents.snapshots import Snapshots
ws, store, cache = map(Path, sys.argv[1:4])
s = Snapshots(BlobStore(store))
for line in sys.stdin:
    if line.strip() == "restore":
        r = s.restore(sys.stdin.readline().strip(), ws, cache_path=cache, borrow=True)
        print(json.dumps({"borrowed": r.incremental}), flush=True)
        continue
    r = s.snapshot(ws, cache_path=cache, borrow=True)
    print(json.dumps({"tree": r.tree, "borrowed": r.borrowed, "listed": r.listed_dirs,
                      "hashed": r.hashed_files}), flush=True)
"""


class Worker:
    """A workspace, a store, the stat cache file and the feed of the worker that drives it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.store = tmp / "store"
        self.snaps = Snapshots(BlobStore(self.store))
        self.cache = tmp / "meta" / "cache.json"
        self.feed = ChangeFeed(self.ws)

    def checkpoint(self):
        return self.snaps.snapshot(self.ws, cache_path=self.cache, feed=self.feed)

    def borrowed(self):
        """A checkpoint as a process without a feed takes it (here: another Snapshots object,
        no feed; the handshake goes through the files either way)."""
        other = Snapshots(BlobStore(self.store))
        result = other.snapshot(self.ws, cache_path=self.cache, borrow=True)
        assert result.tree == Snapshots(BlobStore(self.tmp / "scratch")).snapshot(self.ws).tree
        return result


@pytest.fixture
def worker(tmp_path: Path):
    w = Worker(tmp_path)
    write(w.ws, "src/app.py", "print('hi')\n")
    write(w.ws, "src/lib/util.py", "x = 1\n")
    write(w.ws, "docs/readme.md", "# readme\n")
    settle()
    assert not w.checkpoint().incremental  # the feed's baseline
    yield w
    w.feed.close()


def test_a_change_is_caught_from_a_process_without_a_feed(worker: Worker) -> None:
    write(worker.ws, "src/lib/util.py", "x = 2\n")
    r = worker.borrowed()
    assert r.borrowed and r.incremental
    assert r.hashed_files == 1 and r.listed_dirs == 1
    # The cache file is left as it was: the worker's own feed is still trusted.
    mine = worker.checkpoint()
    assert mine.incremental and mine.tree == r.tree
    # Nothing changed since: the reader lists nothing.
    again = worker.borrowed()
    assert again.borrowed and again.listed_dirs == 0 and again.tree == r.tree


def test_same_size_and_same_mtime_is_caught(worker: Worker) -> None:
    """The racy case: new content of the same size, its mtime set back to the old one."""
    path = worker.ws / "src" / "app.py"
    before = os.stat(path)
    path.write_text("print('ho')\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size
    r = worker.borrowed()
    assert r.borrowed and r.hashed_files == 1
    # And without any journal (no worker watches): the full scan catches it too (ctime).
    worker.feed.close()
    path.write_text("print('hu')\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    full = worker.borrowed()
    assert not full.borrowed and full.tree != r.tree


def test_deletes_new_nested_folders_links_and_modes(worker: Worker) -> None:
    os.unlink(worker.ws / "docs" / "readme.md")
    write(worker.ws, "new/deep/er/file.txt", "made after the checkpoint\n")
    os.symlink("../src/app.py", worker.ws / "docs" / "link")
    os.chmod(worker.ws / "src" / "app.py", 0o755)
    r = worker.borrowed()
    assert r.borrowed and r.incremental
    snaps = worker.snaps
    files = snaps.files(r.tree)
    assert "docs/readme.md" not in files
    assert files["new/deep/er/file.txt"].type == "f"
    assert files["docs/link"].target == "../src/app.py"
    assert files["src/app.py"].mode == 0o755
    # A folder removed whole, and one replaced by a link.
    shutil.rmtree(worker.ws / "new")
    shutil.rmtree(worker.ws / "src" / "lib")
    os.symlink("/etc", worker.ws / "src" / "lib")
    r2 = worker.borrowed()
    assert r2.borrowed
    assert snaps.files(r2.tree)["src/lib"].type == "l"
    assert not any(p.startswith("new") for p in snaps.files(r2.tree))


def test_a_real_other_process(worker: Worker) -> None:
    """The web or the CLI: another process, several checkpoints and a rewind, each exact."""
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER, str(worker.ws), str(worker.store), str(worker.cache)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def ask(*lines: str) -> dict:
            other.stdin.write("".join(line + "\n" for line in lines))
            other.stdin.flush()
            return json.loads(other.stdout.readline())

        first = worker.checkpoint().tree
        before = describe(worker.ws)
        for n in range(3):
            write(worker.ws, f"src/lib/gen{n}.py", f"n = {n}\n")
            got = ask("checkpoint")
            # (the files it read before too: it never writes the cache, the worker does)
            assert got["borrowed"] and 1 <= got["hashed"] <= n + 2
            assert got["tree"] == Snapshots(BlobStore(worker.tmp / "s")).snapshot(worker.ws).tree
        # Rewind from that process: exact, and still through the journal.
        assert ask("restore", first)["borrowed"]
        assert describe(worker.ws) == before
        # The worker's feed saw the restore's writes: its next checkpoint is exact.
        mine = worker.checkpoint()
        assert mine.tree == first
    finally:
        other.stdin.close()
        other.wait(timeout=30)


def test_the_cache_read_while_the_worker_answers_is_used_only_if_still_its_baseline(
    worker: Worker, monkeypatch
) -> None:
    """A reader reads the cache file while the publisher answers, as the baseline before its
    request names it. Kept when the answer ends with that baseline; read again (or asked again)
    when the worker checkpointed in between; the checkpoint is exact either way."""
    real = journal.load_lazy
    reads: list[bool] = []
    pending: list[bool] = []  # whether the reader's request was still unanswered at each read

    def watched(*a, **k):
        pending.append(unanswered(worker))
        got = real(*a, **k)
        reads.append(got is not None)
        return got

    monkeypatch.setattr(journal, "load_lazy", watched)
    # The worker answers 50 ms late (a busy worker), so the reader is sure to be waiting.
    slow = worker.feed._follow
    monkeypatch.setattr(worker.feed, "_follow", lambda fd: time.sleep(0.05) or slow(fd))
    write(worker.ws, "src/lib/util.py", "x = 3\n")
    assert worker.borrowed().borrowed
    assert reads == [True] and pending == [True]  # one read, made while waiting, and used

    # The worker checkpoints between the reader's request and its answer: the early read is
    # of a cache file that is no longer the baseline.
    reads.clear()
    checkpoints = []

    def early(*a, **k):
        if not checkpoints:
            write(worker.ws, "docs/more.md", "made while the reader waits\n")
            checkpoints.append(worker.checkpoint())
        got = real(*a, **k)
        reads.append(got is not None)
        return got

    monkeypatch.setattr(journal, "load_lazy", early)
    write(worker.ws, "src/app.py", "print('changed')\n")
    r = worker.borrowed()  # (its tree is checked against a full scan)
    assert r.borrowed and checkpoints[0].incremental
    assert len(reads) >= 2 and reads[-1]  # read again as the answer's baseline names it
    files = worker.snaps.files(r.tree)
    assert worker.snaps.read(r.tree, "src/app.py") == b"print('changed')\n"
    assert "docs/more.md" in files


def test_a_rewind_scans_the_workspace_while_the_worker_answers(worker: Worker, monkeypatch) -> None:
    """A rewind from another process scans the workspace with what the journal says so far
    while the worker answers, and uses that scan when the answer names the same folders; a
    change the answer brings (made meanwhile) means a scan with the answer's plan: the rewind
    is exact either way."""
    from agents.snapshots import scan as scans

    target = worker.checkpoint().tree
    exact = describe(worker.ws)
    scanned: list[bool] = []
    real_scan = scans.Scanner.scan
    monkeypatch.setattr(
        scans.Scanner,
        "scan",
        lambda self, *a, **k: scanned.append(k.get("plan") is not None) or real_scan(self, *a, **k),
    )
    # The worker answers 50 ms late (a busy worker), so the reader is sure to be waiting.
    slow = worker.feed._follow
    monkeypatch.setattr(worker.feed, "_follow", lambda fd: time.sleep(0.05) or slow(fd))
    other = Snapshots(BlobStore(worker.store))
    assert other.snapshot(worker.ws, cache_path=worker.cache, borrow=True).borrowed  # (header)
    write(worker.ws, "src/lib/util.py", "x = 2\n")
    deadline = time.monotonic() + 5
    while b'["d", "src/lib"]' not in journal.journal_path(worker.cache).read_bytes():
        assert time.monotonic() < deadline, "the worker's journal never followed the change"
        time.sleep(0.01)  # (the worker's journal follows: the change is in it before the rewind)
    scanned.clear()
    assert other.restore(target, worker.ws, cache_path=worker.cache, borrow=True).incremental
    assert describe(worker.ws) == exact
    assert scanned == [True]  # one scan: the one made while waiting

    # A file made while the reader waits (after its request, before the answer): the answer
    # names its folder, so the scan made meanwhile (which did not look there) is not used.
    write(worker.ws, "src/lib/util.py", "x = 3\n")
    real_load = journal.load_lazy
    made: list[str] = []

    def load_then_write(*a, **k):
        if not made:
            made.append(write(worker.ws, "docs/made-meanwhile.md", "after the request\n"))
        return real_load(*a, **k)

    monkeypatch.setattr(journal, "load_lazy", load_then_write)
    scanned.clear()
    assert other.restore(target, worker.ws, cache_path=worker.cache, borrow=True).incremental
    assert made and describe(worker.ws) == exact  # the file made meanwhile removed too
    assert scanned == [True, True]  # the scan made meanwhile, then the answer's


def in_fifo(worker: Worker) -> int:
    """Bytes readers wrote to the publisher's FIFO that it has not read yet."""
    import fcntl
    import struct
    import termios

    fd = worker.feed._publisher.fifo_fd
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def unanswered(worker: Worker) -> bool:
    """Whether a reader's request waits: a name in the publisher's FIFO, or a request file."""
    files = [p for p in journal.flush_dir(worker.cache).iterdir() if not p.name.endswith(".fifo")]
    return in_fifo(worker) > 0 or bool(files)


def test_a_reader_asks_through_the_publisher_s_fifo_once_it_has_read_the_header(
    worker: Worker, monkeypatch
) -> None:
    """A request made as a file is what a borrow costs most: after its first (which reads the
    header), a reader writes its name to the publisher's FIFO and makes no file."""
    made: list[str] = []
    real = journal._ask_by_file
    monkeypatch.setattr(journal, "_ask_by_file", lambda f, n: made.append(n) or real(f, n))
    header = json.loads(journal.journal_path(worker.cache).read_text().splitlines()[0])
    fifo = journal.flush_dir(worker.cache) / header["fifo"]
    assert fifo.is_fifo()
    journal._FIFOS.clear()  # this process has not read the header yet
    write(worker.ws, "src/a.txt", "a")
    assert worker.borrowed().borrowed and len(made) == 1
    for n in range(3):
        write(worker.ws, f"docs/n{n}.md", "n")
        r = worker.borrowed()
        assert r.borrowed and r.listed_dirs <= 3
    assert len(made) == 1  # asked through the FIFO
    assert list(journal.flush_dir(worker.cache).iterdir()) == [fifo]  # nothing left behind
    # Its publisher gone (the FIFO still there, nobody reads it: a killed worker's): the
    # reader makes a file instead, and a full scan follows (a closed journal).
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # keep the name: the feed removes it
    os.link(fifo, fifo.with_name("kept"))
    os.close(fd)
    worker.feed.close()
    os.rename(fifo.with_name("kept"), fifo)
    write(worker.ws, "src/b.txt", "b")
    assert not worker.borrowed().borrowed and len(made) == 2
    # The next publisher removes the FIFO nobody reads.
    worker.feed = ChangeFeed(worker.ws)
    assert not worker.checkpoint().incremental
    names = sorted(p.name for p in journal.flush_dir(worker.cache).iterdir())
    assert names == [worker.feed._publisher.fifo] and names != [fifo.name]


def test_a_name_in_the_fifo_is_acked_after_every_change_made_before_it(
    worker: Worker, monkeypatch
) -> None:
    """A reader's name is read from the FIFO once the publisher's queue is empty, and acked
    once it has been read empty again: two requests in one batch of events with a change
    between them (the publisher was busy) must not both be acked before that change."""
    import threading

    write(worker.ws, "src/app.py", "print('new baseline')\n")
    assert worker.checkpoint().incremental
    assert worker.borrowed().borrowed  # (the header read: later requests go to the FIFO)
    busy = threading.Event()
    slow = worker.feed._follow
    monkeypatch.setattr(worker.feed, "_follow", lambda fd: busy.wait(10) and slow(fd))
    results: dict[str, journal.Borrowed | None] = {}

    def ask(who: str) -> threading.Thread:
        before = in_fifo(worker)
        t = threading.Thread(target=lambda: results.update({who: journal.borrow(worker.cache)}))
        t.start()
        deadline = time.monotonic() + 5
        while in_fifo(worker) == before:
            assert time.monotonic() < deadline, f"{who} never asked through the FIFO"
            time.sleep(0.001)
        return t

    first = ask("first")
    write(worker.ws, "docs/late.md", "written after the first request, before the second\n")
    second = ask("second")
    busy.set()
    first.join(10)
    second.join(10)
    assert results["first"] is not None and results["second"] is not None
    assert "docs" in results["second"].listed
    # The invariant itself: the second request's answer comes after the change made before it
    # (a reader may read further than its answer, so the lines are checked, not only `listed`).
    lines = [json.loads(x) for x in journal.journal_path(worker.cache).read_text().splitlines()]
    lines = lines[1:]  # after the header
    acks = [n for n, line in enumerate(lines) if line[0] == "ack"]
    assert lines.index(["d", "docs"]) < acks[-1]


def test_no_trusted_journal_means_a_full_scan(worker: Worker, monkeypatch) -> None:
    write(worker.ws, "src/a.txt", "a")
    # The cache file rewritten by someone else since the journal's header: not trusted.
    Snapshots(BlobStore(worker.store)).snapshot(worker.ws, cache_path=worker.cache)
    write(worker.ws, "src/b.txt", "b")
    r = worker.borrowed()
    assert not r.borrowed and not r.incremental
    # The worker's next checkpoint (a full scan: the file is not its own) starts a new journal.
    assert not worker.checkpoint().incremental
    write(worker.ws, "src/c.txt", "c")
    assert worker.borrowed().borrowed
    # Lost events: not trusted.
    worker.feed._lose("test")
    worker.feed.pending()
    assert not worker.borrowed().borrowed
    # A publisher that does not answer (gone): a full scan after the timeout.
    assert not worker.checkpoint().incremental
    monkeypatch.setattr(journal, "ACK_TIMEOUT", 0.05)
    monkeypatch.setattr(worker.feed, "_follow", lambda fd: None)  # a publisher that hangs
    write(worker.ws, "src/d.txt", "d")
    assert journal.borrow(worker.cache, timeout=0.05) is None
    assert not worker.borrowed().borrowed


def test_a_closed_feed_and_no_feed_at_all(tmp_path: Path) -> None:
    w = Worker(tmp_path)
    write(w.ws, "a.txt", "a")
    settle()
    w.checkpoint()
    w.feed.close()
    assert json.loads(journal.journal_path(w.cache).read_text().splitlines()[-1]) == ["closed"]
    write(w.ws, "b.txt", "b")
    r = w.borrowed()
    assert not r.borrowed and r.files == 2
    # No journal at all (no worker ever watched).
    journal.journal_path(w.cache).unlink()
    write(w.ws, "c.txt", "c")
    assert not w.borrowed().borrowed


def test_lazy_records_read_only_what_they_need(worker: Worker) -> None:
    worker.checkpoint()
    lent = journal.borrow(worker.cache)
    cache = lazy.load_lazy(worker.cache, lent.cache_id)
    dirs = cache.dirs
    assert set(dirs) == {"", "src", "src/lib", "docs"}
    assert dirs._recs == {}
    assert dirs["src"].tree
    assert set(dirs._recs) == {"src"}
    copy = dirs.copy()
    del copy["docs"]
    assert "docs" in dirs and "docs" not in copy
    assert lazy.load_lazy(worker.cache, (0, 0, 0)) is None


# --- from the web and the CLI, with a worker process watching the run's workspace --------------

WATCHER = """
import sys
from pathlib import Path
from agents.blobstore import BlobStore
from agents.snapshots import ChangeFeed, Snapshots
ws, store, cache = map(Path, sys.argv[1:4])
feed = ChangeFeed(ws)
Snapshots(BlobStore(store)).snapshot(ws, cache_path=cache, feed=feed)
print("ready", flush=True)
sys.stdin.readline()
feed.close()
"""


@pytest.mark.parametrize("route", ["web", "cli"])
def test_checkpoint_now_and_checkpoint_run_use_the_watching_workers_feed(
    route, owner, waiting_run, monkeypatch, tmp_path
):
    from django.core.management import call_command

    from agents import workspaces
    from agents.snapshots import feed as feeds
    from tests.helpers import client_for

    run = waiting_run
    feeds.close_all()  # this process (the web's, the CLI's) keeps no feed of its own
    ws = run.workspace_path
    where = [str(ws), str(workspaces.store().blobs.root), str(workspaces.cache_path(run))]
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, *where],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lent = []
    real = journal.borrow
    monkeypatch.setattr(journal, "borrow", lambda *a, **k: lent.append(real(*a, **k)) or lent[-1])
    try:
        assert watcher.stdout.readline().strip() == "ready"
        write(ws, "notes/new.md", "written after the worker's checkpoint\n")
        os.unlink(next(p for p in ws.rglob("*") if p.is_file() and "notes" not in p.parts))
        if route == "web":
            response = client_for(owner).post(f"/runs/{run.pk}/checkpoint", {"label": "now"})
            assert response.status_code == 302
        else:
            call_command("checkpoint_run", str(run.pk), "--label", "now")
        made = run.checkpoints.get(label="now")
        assert lent and lent[-1] is not None, "the worker's journal was not used"
        assert made.tree == Snapshots(BlobStore(tmp_path / "scratch")).snapshot(ws).tree
        # A rewind by a process that did not drive the run: exact, through the journal too.
        before = describe(ws)
        workspaces.restore(run, run.checkpoints.order_by("number").first().tree)
        assert lent[-1] is not None
        workspaces.restore(run, made.tree)
        assert describe(ws) == before
    finally:
        watcher.stdin.close()
        watcher.wait(timeout=30)


def test_the_journal_grows_by_appends_and_is_rewritten_when_long(worker: Worker, monkeypatch):
    path = journal.journal_path(worker.cache)
    ino = path.stat().st_ino
    size = path.stat().st_size
    worker.checkpoint()  # nothing changed: the same cache file, nothing to add
    assert path.stat().st_size == size
    for n in range(3):
        write(worker.ws, f"docs/n{n}.md", "x" * n)
        assert worker.checkpoint().incremental
        assert worker.borrowed().borrowed
    assert path.stat().st_ino == ino  # appended to, never made again
    monkeypatch.setattr(journal, "MAX_BYTES", 10)
    write(worker.ws, "docs/last.md", "last")
    worker.checkpoint()
    assert path.stat().st_ino != ino
    write(worker.ws, "src/after.py", "after")
    r = worker.borrowed()
    assert r.borrowed and r.listed_dirs <= 2  # src, and docs if last.md was too new to trust


def test_the_reader_indexes_only_what_the_cache_log_gained(worker: Worker):
    """A long-lived reader (the web's process) reads only the lines the worker appended since;
    a cache file made anew (another inode) is read whole again."""
    write(worker.ws, "twin/a/f.txt", "same")
    write(worker.ws, "twin/b/f.txt", "same")  # a folder with the same tree digest as twin/a
    write(worker.ws, "twin/c/.keep", "")
    settle()
    first = worker.checkpoint().tree
    assert worker.borrowed().borrowed
    index = lazy._INDEXES[worker.cache]
    size = index.size
    assert size == worker.cache.stat().st_size
    twin_a = lazy._LINE.match(index.line("twin/a", size)).group(2).decode()
    assert index.by_tree[twin_a] == {"twin/a", "twin/b"}
    view = lazy.load_lazy(worker.cache, lazy.identity(worker.cache.stat())).dirs
    write(worker.ws, "twin/a/f.txt", "changed")
    settle()
    worker.checkpoint()  # appends a few lines to the cache file
    again = worker.borrowed()
    assert again.borrowed and lazy._INDEXES[worker.cache] is index  # added to, not remade
    assert index.size > size and len(index.lines["twin/a"]) == 2
    # A view made before still sees the file as it was then; a new one sees the new lines.
    assert view["twin/a"].tree == twin_a
    now = lazy.load_lazy(worker.cache, lazy.identity(worker.cache.stat())).dirs
    assert now["twin/a"].tree != twin_a and now["twin/b"].tree == twin_a
    # A rewind by the reader, back to where twin/a and twin/b were alike: exact.
    other = Snapshots(BlobStore(worker.store))
    r = other.restore(first, worker.ws, cache_path=worker.cache, borrow=True)
    assert r.incremental and r.written == 1
    assert (worker.ws / "twin/a/f.txt").read_text() == "same"
    assert worker.checkpoint().tree == first
    # The cache file rewritten whole (a new inode): indexed from the start again.
    worker.cache.write_text(worker.cache.read_text())
    write(worker.ws, "twin/c/new", "n")
    assert not worker.borrowed().borrowed  # the journal names the old file
    assert not worker.checkpoint().incremental
    write(worker.ws, "twin/c/newer", "n")
    assert worker.borrowed().borrowed
    assert lazy._INDEXES[worker.cache].ino == worker.cache.stat().st_ino


def test_one_thread_follows_every_feed_even_past_descriptor_1024(tmp_path: Path) -> None:
    """A worker of 300 runs has 300 feeds and descriptors past 1,024: one thread (an epoll)
    follows them all, and a borrowed checkpoint of a feed whose descriptor is past 1,024 still
    sees what changed (select() refused such a descriptor, and its thread spun)."""
    import resource
    import threading

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("this process may not open 1,200 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    workers = []
    try:
        while len(held) < 1100:  # the next descriptors are past 1,024
            held.append(os.open(os.devnull, os.O_RDONLY))
        for i in range(4):
            home = tmp_path / f"w{i}"
            home.mkdir()
            w = Worker(home)
            workers.append(w)
            write(w.ws, "src/app.py", f"print({i})\n")
            settle()
            w.checkpoint()
        assert all(w.feed._inotify.fileno() > 1024 for w in workers)
        followers = [t for t in threading.enumerate() if t.name == "change-feeds"]
        assert len(followers) == 1
        write(workers[-1].ws, "src/app.py", "print('changed')\n")
        result = workers[-1].borrowed()
        assert result.borrowed and result.hashed_files == 1
    finally:
        for w in workers:
            w.feed.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
