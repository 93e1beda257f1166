#!/usr/bin/env python
"""What a workspace checkpoint costs: Shiftlog's snapshots next to git, side by side.

    .venv/bin/python bench/checkpoint.py                          # 1,000 and 10,000 files
    .venv/bin/python bench/checkpoint.py --files 10000 --total-mb 100 --repeat 5 --json

For each size a deterministic pseudo-random workspace is generated (nested folders, about 20 files
each, sizes log-normal, mostly text, some binary; --total-mb is the size of the largest workspace,
smaller ones scale down with their file count). Then, interleaved (ours, then git's, each time):

  first checkpoint   snapshot() into an empty store / `git add -A && git commit -q` in a new
                     repository on a copy of the tree; --first-repeat times. A change feed
                     (agents/snapshots/feed.py) starts before the last one, as a worker starts
                     one before its first checkpoint: that full scan is its baseline.
  one file changed   a text file gets one more line (a different file each time), then a
                     checkpoint / `git add -A && git commit -q` (and the same with
                     core.fsync=all). Three such changes per repetition, each checkpointed by
                     another route: (1) by another process, started once and kept (as the web's
                     is), through the worker's journal (agents/snapshots/journal.py); (2) by a new
                     process, as `manage.py checkpoint_run` is, less Django (its wall time from
                     start to end, and the checkpoint inside it; Django's start-up is timed once
                     on its own); (3) by the worker through its own feed (the journal means it
                     also lists the two folders changed before: a little more work than one
                     change). The same checkpoint without any feed (a full scan with the stat
                     cache, as before the journal) is timed too, and one with nothing changed.
  rewind             back to the checkpoint before the worker's change (one file back):
                     restore() through the feed / `git checkout -q HEAD~1` / (moved forward
                     again) `git reset -q --hard HEAD~1`; restore() by the other process through
                     the journal (as a rewind carried out by a worker that did not drive the
                     run), from the same state (the worker moved forward and checkpointed once
                     the filesystem's clock had passed the restore's writes); both again right
                     after a restore, before any checkpoint (the folder it wrote is listed and
                     its file read again: its timestamp is too new to have been trusted); and
                     restore() without a feed (a full scan).
  ...no stat cache   (Shiftlog only) the one-change checkpoint without a cache: every file read.

Times are medians. Everything runs warm (just-written files are in the page cache); git runs as a
subprocess (its start-up is part of its cost) with gc.auto=0 so an automatic repack does not land
in a sample. Shiftlog makes every checkpoint durable before it returns (two barriers: blob data,
then names); git by default fsyncs no loose object, so git is also run with core.fsync=all
(every object, the index and refs synced: equal durability), in a second repository, beside it.
The snapshot store holds no database: SQLite's sync level (SHIFTLOG_SQLITE_SYNC) does not
apply here (bench/step_overhead.py --sqlite-sync both measures it per step). Every rewound workspace is checked to be the
checkpoint it was rewound to, by every route, and by a scan with no cache at the end. --json ends the
output with one JSON line of the largest size's figures (git's time over ours as
*_speedup_vs_git*, the raw times in ms, the load average at the start and the end). Generated
data lives in a temporary folder that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import machine  # bench/benchlib.py, beside this script

from agents.blobstore import BlobStore
from agents.snapshots import ChangeFeed, Snapshots

ROOT = Path(__file__).resolve().parent.parent

WORDS = [
    "agent",
    "run",
    "step",
    "tool",
    "call",
    "result",
    "check",
    "retry",
    "lease",
    "worker",
    "queue",
    "event",
    "token",
    "model",
    "prompt",
    "session",
    "handoff",
    "budget",
    "limit",
    "plan",
    "patch",
    "diff",
    "file",
    "folder",
    "branch",
    "commit",
    "review",
    "merge",
    "test",
]
TEXT_EXT = [".py", ".md", ".json", ".txt", ".ts"]
BIN_EXT = [".bin", ".png", ".sqlite"]
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "gc.auto=0"]
# git at Shiftlog's durability: every object, index and ref fsynced before the command returns.
GIT_FSYNC = ["-c", "core.fsync=all", "-c", "core.fsyncMethod=fsync"]


def generate(root: Path, files: int, total_bytes: int, seed: int) -> list[Path]:
    """A deterministic workspace; returns its text files (candidates for the one-line change)."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 1.6) for _ in range(files)]
    scale = total_bytes / sum(weights)
    lines = [" ".join(rng.choices(WORDS, k=rng.randrange(3, 14))) + "\n" for _ in range(4000)]
    texts = []
    for i in range(files):
        leaf = i // 20
        binary = rng.random() < 0.25
        ext = rng.choice(BIN_EXT if binary else TEXT_EXT)
        path = (
            root
            / f"src{leaf % 10}"
            / f"lib{leaf // 10 % 10}"
            / f"d{leaf // 100}"
            / f"f{i:05d}{ext}"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        size = min(max(1, int(weights[i] * scale)), 16 << 20)
        if binary:
            path.write_bytes(rng.randbytes(size))
        else:
            chunk = "".join(rng.choices(lines, k=size // 40 + 1))
            path.write_text(chunk[:size])
            texts.append(path)
    return texts


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def run(cmd: list[str], cwd: Path) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def git_commit(repo: Path, message: str, sync: bool = False) -> None:
    extra = GIT_FSYNC if sync else []
    run([*GIT, *extra, "add", "-A"], repo)
    run([*GIT, *extra, "commit", "-q", "-m", message], repo)


def change_one(path: Path, n: int) -> int:
    """Insert one line in the middle of a text file; returns the file's new size."""
    text = path.read_text()
    middle = len(text) // 2
    path.write_text(text[:middle] + f"\nchange {n}: the agent edited this line\n" + text[middle:])
    return path.stat().st_size


def serve(ws: Path, store: Path, cache: Path) -> None:
    """Another process (the web's, or the CLI's once started): checkpoints and rewinds of `ws`
    without a change feed of its own, through the worker's (journal.py), timed here."""
    snaps = Snapshots(BlobStore(store))
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        started = time.perf_counter()
        if cmd == "snapshot":
            r = snaps.snapshot(ws, cache_path=cache, borrow=True)
            out = {"tree": r.tree, "borrowed": r.borrowed, "hashed": r.hashed_files}
        else:
            r = snaps.restore(arg, ws, cache_path=cache, borrow=True)
            out = {"borrowed": r.incremental, "written": r.written}
        out["ms"] = (time.perf_counter() - started) * 1000
        print(json.dumps(out), flush=True)


class Other:
    """The `serve` process, started once (warm, as a web process is)."""

    def __init__(self, ws: Path, store: Path, cache: Path):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(ws), str(store), str(cache)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        assert out["borrowed"], f"{line}: the worker's feed was not used"
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


CLI = """
import json, sys, time
started = time.perf_counter()
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from agents.blobstore import BlobStore
from agents.snapshots import Snapshots
ws, store, cache = map(Path, sys.argv[1:4])
t = time.perf_counter()
r = Snapshots(BlobStore(store)).snapshot(ws, cache_path=cache, borrow=True)
print(json.dumps({"ms": (time.perf_counter() - t) * 1000, "borrowed": r.borrowed, "tree": r.tree}))
"""


def cli_checkpoint(ws: Path, store: Path, cache: Path) -> tuple[float, float, str]:
    """A new process that checkpoints once (as `manage.py checkpoint_run` does, less Django):
    (wall ms from its start to its end, ms of the checkpoint itself inside it, its tree)."""
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CLI, str(ws), str(store), str(cache), str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wall = (time.perf_counter() - started) * 1000
    got = json.loads(out)
    assert got["borrowed"], "the CLI process did not use the worker's feed"
    return wall, got["ms"], got["tree"]


def django_setup_ms() -> float:
    """What Django's start-up adds to every `manage.py` command (settings, apps, models)."""
    code = (
        "import os, sys, time; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); "
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'shiftlog.settings'); import django; "
        "django.setup(); import agents.checkpoints; print((time.perf_counter() - t) * 1000)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    return float(out.stdout.strip()) if out.returncode == 0 else float("nan")


def watch(ws: Path) -> ChangeFeed:
    """The worker's feed. On a shared machine other processes may hold every inotify instance
    for a while (fs.inotify.max_user_instances, per user): wait for one rather than fail."""
    deadline = time.monotonic() + 300
    while True:
        try:
            return ChangeFeed(ws)
        except OSError:
            if time.monotonic() > deadline:
                raise
            print("waiting for an inotify instance ...", file=sys.stderr, flush=True)
            time.sleep(5)


def fresh_git(repo: Path) -> None:
    shutil.rmtree(repo / ".git", ignore_errors=True)
    run([*GIT, "init", "-q"], repo)


def bench_size(files: int, total_bytes: int, repeat: int, first_repeat: int, tmp: Path) -> dict:
    base = tmp / f"n{files}"
    ws, repo, meta = base / "ws", base / "git", base / "meta"
    print(
        f"generating {files:,} files, {total_bytes / 1e6:.0f} MB ...", file=sys.stderr, flush=True
    )
    texts = generate(ws, files, total_bytes, seed=files)
    run(["cp", "-a", str(ws), str(repo)], base)
    synced = base / "git-fsync"  # the same, with core.fsync=all (equal durability)
    run(["cp", "-a", str(ws), str(synced)], base)
    size = tree_bytes(ws)
    objects = repo / ".git" / "objects"
    cache = meta / "stat-cache.json"  # the runtime's: the feed's baseline
    cache_full = meta / "stat-cache-full.json"  # a second one, for the scans without a feed
    samples: dict[str, list] = {}

    def sample(key: str, ms: float) -> None:
        samples.setdefault(key, []).append(ms)

    # First checkpoint: into an empty store / a new repository, interleaved, `first_repeat`
    # times; the last store and repository stay for what follows. The change feed starts before
    # the last one, as a worker starts it before its first checkpoint.
    store = snaps = feed = result = None
    for k in range(first_repeat):
        print(f"first checkpoint {k + 1}/{first_repeat} ...", file=sys.stderr, flush=True)
        shutil.rmtree(base / "store", ignore_errors=True)
        shutil.rmtree(meta, ignore_errors=True)
        fresh_git(repo)
        fresh_git(synced)
        store = BlobStore(base / "store")
        snaps = Snapshots(store)
        last = k == first_repeat - 1
        if last:
            feed = watch(ws)
        started = time.perf_counter()
        result = snaps.snapshot(ws, cache_path=cache, feed=feed)
        sample("first", (time.perf_counter() - started) * 1000)
        sample("git_first", timed(lambda: git_commit(repo, "first")))
        sample("git_fsync_first", timed(lambda: git_commit(synced, "first", sync=True)))
    first_bytes, git_first_bytes = store.size_bytes(), tree_bytes(objects)
    snaps.snapshot(ws, cache_path=cache_full)  # the no-feed cache, warm

    # One file changed, checkpoint, then rewind; a different file each time. Each repetition
    # changes three files, one at a time: checkpointed by the worker through its feed, by
    # another process (the web's) through the worker's journal, by a new process (the CLI's);
    # git commits each change too.
    other = Other(ws, base / "store", cache)
    rng = random.Random(files)
    candidates = [p for p in texts if 2_000 < p.stat().st_size < 200_000] or texts
    picks = rng.sample(candidates, min(len(candidates), 3 * repeat))

    def change_everywhere(path: Path, n: int) -> None:
        rel = path.relative_to(ws)
        sample("changed", change_one(path, n))
        change_one(repo / rel, n)
        change_one(synced / rel, n)

    def git_both(key: str, n: int) -> None:
        sample("git_commit", timed(lambda: git_commit(repo, f"{key} {n}")))
        sample("git_fsync_commit", timed(lambda: git_commit(synced, f"{key} {n}", sync=True)))

    for n in range(repeat):
        print(f"one change {n + 1}/{repeat} ...", file=sys.stderr, flush=True)
        web_path, cli_path, path = picks[3 * n : 3 * n + 3]
        change_everywhere(web_path, n)
        got = other.ask("snapshot")
        sample("web", got["ms"])
        git_both("web", n)
        change_everywhere(cli_path, n)
        wall, inside, before_change = cli_checkpoint(ws, base / "store", cache)
        sample("cli_wall", wall)
        sample("cli", inside)
        git_both("cli", n)
        change_everywhere(path, n)

        before_store, before_git = store.size_bytes(), tree_bytes(objects)
        started = time.perf_counter()
        result = snaps.snapshot(ws, cache_path=cache, feed=feed)
        sample("incremental", (time.perf_counter() - started) * 1000)
        assert result.incremental, "the change feed was not trusted"
        sample("hashed", result.hashed_files)
        sample("store_growth", store.size_bytes() - before_store)
        sample("git_commit", timed(lambda n=n: git_commit(repo, f"change {n}")))
        sample("git_growth", tree_bytes(objects) - before_git)
        sample("git_fsync_commit", timed(lambda n=n: git_commit(synced, f"change {n}", sync=True)))
        sample("full_scan", timed(lambda: snaps.snapshot(ws, cache_path=cache_full)))
        # Nothing changed since: what a checkpoint after a tool call that wrote nothing costs.
        sample("unchanged", timed(lambda: snaps.snapshot(ws, cache_path=cache, feed=feed)))
        changed_tree = result.tree

        # Rewind to the checkpoint before the worker's change (the CLI's): that file back as
        # it was, as `git checkout HEAD~1` puts it back.
        target = before_change
        sample(
            "rewind",
            timed(lambda t=target: snaps.restore(t, ws, cache_path=cache, feed=feed)),
        )
        sample("git_checkout", timed(lambda: run([*GIT, "checkout", "-q", "HEAD~1"], repo)))
        run([*GIT, "checkout", "-q", "HEAD@{1}"], repo)
        sample("git_reset", timed(lambda: run([*GIT, "reset", "-q", "--hard", "HEAD~1"], repo)))
        # The same rewind carried out by another process (a worker that did not drive the run,
        # the web's), from the state the worker's own started from (a checkpoint after which
        # nothing changed): forward to the change through the feed, the worker's checkpoint once
        # the filesystem's clock has passed the restore's writes (before, their timestamps are
        # too new to trust), then back through the journal.
        snaps.restore(changed_tree, ws, cache_path=cache, feed=feed)
        time.sleep(0.03)
        snaps.snapshot(ws, cache_path=cache, feed=feed)
        sample("rewind_other", other.ask(f"restore {target}")["ms"])
        assert snaps.snapshot(ws, cache_path=cache, feed=feed).tree == target
        # Both again right after a restore, before any checkpoint: the folder it wrote is listed
        # and its new file read again (its timestamp too new to have been trusted).
        snaps.restore(changed_tree, ws, cache_path=cache, feed=feed)
        sample(
            "rewind_fresh",
            timed(lambda t=target: snaps.restore(t, ws, cache_path=cache, feed=feed)),
        )
        snaps.restore(changed_tree, ws, cache_path=cache, feed=feed)
        sample("rewind_other_fresh", other.ask(f"restore {target}")["ms"])
        assert snaps.snapshot(ws, cache_path=cache, feed=feed).tree == target
        # The same rewind without a feed (another process, or the first after a restart):
        # forward to the change and back, each scanning the whole workspace.
        snaps.restore(changed_tree, ws, cache_path=cache_full)
        sample("rewind_full", timed(lambda t=target: snaps.restore(t, ws, cache_path=cache_full)))
        # The rewound workspace must be exactly that checkpoint again, by either route.
        assert snaps.snapshot(ws, cache_path=cache, feed=feed).tree == target
        assert snaps.snapshot(ws, cache_path=cache_full).tree == target
    assert snaps.snapshot(ws).tree == target  # no cache, no feed: every file read
    other.close()
    feed.close()

    # Without the stat cache every file is read again: what the cache saves.
    change_one(picks[0], 99)
    nocache = [timed(lambda: snaps.snapshot(ws)) for _ in range(min(repeat, 3))]

    med = statistics.median
    out = {k: med(v) for k, v in samples.items()}
    out.update(
        files=files,
        tree_bytes=size,
        first_bytes=first_bytes,
        git_first_bytes=git_first_bytes,
        no_cache=med(nocache),
        hashed=max(samples["hashed"]),
        first_runs=first_repeat,
        runs=repeat,
        django_setup=django_setup_ms(),
    )
    return out


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if v >= scale:
            return f"{v / scale:,.1f} {unit}"
    return f"{v:,.0f} B"


def table(results: list[dict]) -> list[str]:
    lines = [
        "| files | tree | operation | Shiftlog ms | git ms | git / Shiftlog | Shiftlog growth | git objects growth |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        head = f"| {r['files']:,} | {fmt_bytes(r['tree_bytes'])} "
        rows = [
            (
                "first checkpoint",
                r["first"],
                r["git_first"],
                r["first_bytes"],
                r["git_first_bytes"],
            ),
            (
                "one file changed (change feed)",
                r["incremental"],
                r["git_commit"],
                r["store_growth"],
                r["git_growth"],
            ),
            (
                "first checkpoint / git with core.fsync=all",
                r["first"],
                r["git_fsync_first"],
                None,
                None,
            ),
            (
                "one file changed (change feed) / git with core.fsync=all",
                r["incremental"],
                r["git_fsync_commit"],
                None,
                None,
            ),
            (
                "one file changed, from another process (the web's; the worker's journal)",
                r["web"],
                r["git_commit"],
                None,
                None,
            ),
            (
                "one file changed, a new process (the CLI's, less Django): in it / wall",
                r["cli"],
                r["git_commit"],
                None,
                None,
            ),
            ("  ... wall, from its start to its end", r["cli_wall"], r["git_commit"], None, None),
            ("  ... Django's start-up (added by manage.py)", r["django_setup"], None, None, None),
            ("one file changed, full scan (no feed)", r["full_scan"], r["git_commit"], None, None),
            ("nothing changed (change feed)", r["unchanged"], None, 0, None),
            ("rewind (change feed) / git checkout", r["rewind"], r["git_checkout"], 0, 0),
            ("rewind (change feed) / git reset --hard", r["rewind"], r["git_reset"], 0, 0),
            (
                "rewind from another process (the worker's journal) / git checkout",
                r["rewind_other"],
                r["git_checkout"],
                0,
                0,
            ),
            (
                "rewind right after a restore (change feed) / git checkout",
                r["rewind_fresh"],
                r["git_checkout"],
                0,
                0,
            ),
            (
                "rewind right after a restore, from another process / git checkout",
                r["rewind_other_fresh"],
                r["git_checkout"],
                0,
                0,
            ),
            (
                "rewind, full scan (no feed) / git checkout",
                r["rewind_full"],
                r["git_checkout"],
                0,
                0,
            ),
            ("one file changed, no stat cache", r["no_cache"], None, None, None),
        ]
        for op, ours, git, grew, git_grew in rows:
            ratio = f"{git / ours:.1f}x" if git is not None and ours else "—"
            lines.append(
                head + f"| {op} | {fmt_ms(ours)} | {fmt_ms(git)} | {ratio} "
                f"| {fmt_bytes(grew)} | {fmt_bytes(git_grew)} |"
            )
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(*map(Path, sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="1000,10000", help="comma-separated file counts")
    parser.add_argument(
        "--total-mb", type=float, default=100.0, help="size of the largest workspace"
    )
    parser.add_argument("--repeat", type=int, default=5, help="samples per small operation")
    parser.add_argument(
        "--first-repeat", type=int, default=3, help="samples of the first checkpoint"
    )
    parser.add_argument(
        "--tmp", default=None, help="where to put generated data (default: system temp)"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with one JSON line of the largest size's figures"
    )
    args = parser.parse_args()
    counts = [int(x) for x in args.files.split(",")]
    largest = max(counts)

    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="shiftlog-bench-", dir=args.tmp))
    try:
        results = [
            bench_size(
                n, int(args.total_mb * 1e6 * n / largest), args.repeat, args.first_repeat, tmp
            )
            for n in counts
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    git_version = subprocess.run(
        ["git", "--version"], capture_output=True, text=True
    ).stdout.strip()
    print(f"\n{machine()}")
    print(f"Python {platform.python_version()}, {git_version}")
    print(
        f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end; "
        f"medians of {args.repeat} interleaved runs (first checkpoint: {args.first_repeat})\n"
    )
    print("\n".join(table(results)))
    big = max(results, key=lambda r: r["files"])
    figures = {
        "files": big["files"],
        "tree_bytes": big["tree_bytes"],
        "incremental_speedup_vs_git": round(big["git_commit"] / big["incremental"], 2),
        "first_speedup_vs_git": round(big["git_first"] / big["first"], 2),
        "incremental_speedup_vs_git_fsync": round(big["git_fsync_commit"] / big["incremental"], 2),
        "first_speedup_vs_git_fsync": round(big["git_fsync_first"] / big["first"], 2),
        "git_fsync_commit_ms": round(big["git_fsync_commit"], 2),
        "git_fsync_first_ms": round(big["git_fsync_first"], 1),
        "rewind_speedup_vs_git_checkout": round(big["git_checkout"] / big["rewind"], 2),
        "web_speedup_vs_git": round(big["git_commit"] / big["web"], 2),
        "web_speedup_vs_git_fsync": round(big["git_fsync_commit"] / big["web"], 2),
        "cli_speedup_vs_git": round(big["git_commit"] / big["cli"], 2),
        "rewind_other_speedup_vs_git_checkout": round(big["git_checkout"] / big["rewind_other"], 2),
        "web_ms": round(big["web"], 2),
        "cli_ms": round(big["cli"], 2),
        "cli_wall_ms": round(big["cli_wall"], 1),
        "django_setup_ms": round(big["django_setup"], 1),
        "rewind_other_ms": round(big["rewind_other"], 2),
        "rewind_fresh_ms": round(big["rewind_fresh"], 2),
        "rewind_other_fresh_ms": round(big["rewind_other_fresh"], 2),
        "rewind_speedup_vs_git_reset_hard": round(big["git_reset"] / big["rewind"], 2),
        "incremental_ms": round(big["incremental"], 2),
        "git_commit_ms": round(big["git_commit"], 2),
        "unchanged_ms": round(big["unchanged"], 3),
        "full_scan_ms": round(big["full_scan"], 2),
        "first_ms": round(big["first"], 1),
        "git_first_ms": round(big["git_first"], 1),
        "rewind_ms": round(big["rewind"], 2),
        "git_checkout_ms": round(big["git_checkout"], 2),
        "git_reset_hard_ms": round(big["git_reset"], 2),
        "rewind_full_scan_ms": round(big["rewind_full"], 2),
        "no_stat_cache_ms": round(big["no_cache"], 1),
        "store_growth_bytes": big["store_growth"],
        "changed_bytes": big["changed"],
        "runs": big["runs"],
        "first_runs": big["first_runs"],
        "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
    }
    print()
    goals = {
        "one file changed, the worker: at least 5x faster than git": figures[
            "incremental_speedup_vs_git"
        ]
        >= 5,
        "one file changed, the web process: at least 5x faster than git": figures[
            "web_speedup_vs_git"
        ]
        >= 5,
        "first checkpoint: no slower than git with core.fsync=all (equal durability)": figures[
            "first_speedup_vs_git_fsync"
        ]
        >= 1,
        "rewind: at least 10x faster than git checkout": figures["rewind_speedup_vs_git_checkout"]
        >= 10,
        "rewind from another process: at least 10x faster than git checkout": figures[
            "rewind_other_speedup_vs_git_checkout"
        ]
        >= 10,
    }
    for what, ok in goals.items():
        print(f"goal ({big['files']:,} files) {what}: {'met' if ok else 'NOT met'}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
