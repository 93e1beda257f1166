#!/usr/bin/env python
"""What a workspace checkpoint costs: Shiftlog's snapshots next to git and `cp -a`.

    .venv/bin/python bench/checkpoint.py                          # 1,000 and 10,000 files
    .venv/bin/python bench/checkpoint.py --files 10000 --total-mb 100 --repeat 7

For each size a deterministic pseudo-random workspace is generated (nested folders, about 20 files
each, sizes log-normal, mostly text, some binary; --total-mb is the size of the largest workspace,
smaller ones scale down with their file count). Then, side by side:

  first checkpoint   Shiftlog: snapshot() into an empty store (with a stat cache file);
                     git: `git add -A && git commit -q` in a fresh repository on a copy of the tree;
                     cp -a: a full copy of the tree.
  one file changed   a text file gets one more line (a different file each repetition), then a
                     checkpoint: snapshot() / `git add -A && git commit -q` / another `cp -a`.
  rewind             back to the checkpoint before that change: restore() / `git reset -q --hard
                     HEAD~1` / delete the tree and `cp -a` the copy back.
  ...no stat cache   (Shiftlog only) the one-change checkpoint without a cache: every file read.

Times are medians of --repeat runs (the first checkpoint runs once). "Growth" is how much the store
grew: bytes of blobs for Shiftlog, bytes under .git/objects for git, the size of the copy for cp.
Everything runs warm (just-written files are in the page cache); git runs as a subprocess (its
start-up is part of its cost) with gc.auto=0 so an automatic repack does not land in a sample.
Shiftlog fsyncs every new blob; git by default does not fsync loose objects.
Generated data lives in a temporary folder that is deleted afterwards.
"""

from __future__ import annotations

import argparse
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

from agents.blobstore import BlobStore
from agents.snapshots import Snapshots

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


def git_commit(repo: Path, message: str) -> None:
    run([*GIT, "add", "-A"], repo)
    run([*GIT, "commit", "-q", "-m", message], repo)


def change_one(path: Path, n: int) -> int:
    """Insert one line in the middle of a text file; returns the file's new size."""
    text = path.read_text()
    middle = len(text) // 2
    path.write_text(text[:middle] + f"\nchange {n}: the agent edited this line\n" + text[middle:])
    return path.stat().st_size


def bench_size(files: int, total_bytes: int, repeat: int, tmp: Path) -> list[dict]:
    base = tmp / f"n{files}"
    ws, repo, copies = base / "ws", base / "git", base / "copies"
    meta = base / "meta"
    copies.mkdir(parents=True)
    print(
        f"generating {files:,} files, {total_bytes / 1e6:.0f} MB ...", file=sys.stderr, flush=True
    )
    texts = generate(ws, files, total_bytes, seed=files)
    run(["cp", "-a", str(ws), str(repo)], base)
    run([*GIT, "init", "-q"], repo)
    size = tree_bytes(ws)
    rows = []

    store = BlobStore(base / "store")
    snaps = Snapshots(store)
    cache = meta / "stat-cache.json"
    objects = repo / ".git" / "objects"

    # First checkpoint.
    first: dict = {"op": "first checkpoint", "changed": size}
    result = None

    def snap() -> None:
        nonlocal result
        result = snaps.snapshot(ws, cache_path=cache)

    first["shiftlog_ms"] = timed(snap)
    first["shiftlog_bytes"] = store.size_bytes()
    first["git_ms"] = timed(lambda: git_commit(repo, "first"))
    first["git_bytes"] = tree_bytes(objects)
    first["cp_ms"] = timed(lambda: run(["cp", "-a", str(ws), str(copies / "c0")], base))
    first["cp_bytes"] = tree_bytes(copies / "c0")
    rows.append(first)
    checkpoint = result.tree

    # One file changed, then rewind; a different file each time.
    rng = random.Random(files)
    picks = rng.sample([p for p in texts if 2_000 < p.stat().st_size < 200_000] or texts, repeat)
    samples: dict[str, list] = {
        k: [] for k in ("s", "g", "c", "sb", "gb", "cb", "rs", "rg", "rc", "ch", "hashed")
    }
    for n, path in enumerate(picks):
        rel = path.relative_to(ws)
        samples["ch"].append(change_one(path, n))
        change_one(repo / rel, n)

        before_store, before_git = store.size_bytes(), tree_bytes(objects)
        samples["s"].append(timed(snap))
        samples["hashed"].append(result.hashed_files)
        samples["sb"].append(store.size_bytes() - before_store)
        samples["g"].append(timed(lambda n=n: git_commit(repo, f"change {n}")))
        samples["gb"].append(tree_bytes(objects) - before_git)
        copy = copies / f"c{n + 1}"
        samples["c"].append(timed(lambda copy=copy: run(["cp", "-a", str(ws), str(copy)], base)))
        samples["cb"].append(tree_bytes(copy))

        samples["rs"].append(timed(lambda: snaps.restore(checkpoint, ws, cache_path=cache)))
        samples["rg"].append(timed(lambda: run([*GIT, "reset", "-q", "--hard", "HEAD~1"], repo)))

        # For cp the copy just made stands in for the changed workspace: replace it wholesale.
        def cp_back(copy=copy) -> None:
            shutil.rmtree(copy)
            run(["cp", "-a", str(copies / "c0"), str(copy)], base)

        samples["rc"].append(timed(cp_back))
        shutil.rmtree(copy)
        # The rewound workspace must be exactly the first checkpoint again.
        assert snaps.snapshot(ws, cache_path=cache).tree == checkpoint

    med = statistics.median
    rows.append(
        {
            "op": "one file changed",
            "changed": med(samples["ch"]),
            "shiftlog_ms": med(samples["s"]),
            "git_ms": med(samples["g"]),
            "cp_ms": med(samples["c"]),
            "shiftlog_bytes": med(samples["sb"]),
            "git_bytes": med(samples["gb"]),
            "cp_bytes": med(samples["cb"]),
            "hashed": max(samples["hashed"]),
        }
    )
    rows.append(
        {
            "op": "rewind",
            "changed": med(samples["ch"]),
            "shiftlog_ms": med(samples["rs"]),
            "git_ms": med(samples["rg"]),
            "cp_ms": med(samples["rc"]),
            "shiftlog_bytes": 0,
            "git_bytes": 0,
            "cp_bytes": 0,
        }
    )

    # Without the stat cache every file is read again: what the cache saves.
    path = picks[0]
    change_one(path, 99)
    nocache = [timed(lambda: snaps.snapshot(ws)) for _ in range(min(repeat, 3))]
    rows.append(
        {"op": "...no stat cache", "changed": path.stat().st_size, "shiftlog_ms": med(nocache)}
    )
    for row in rows:
        row["files"] = files
        row["tree_bytes"] = size
    return rows


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="1000,10000", help="comma-separated file counts")
    parser.add_argument(
        "--total-mb", type=float, default=100.0, help="size of the largest workspace"
    )
    parser.add_argument("--repeat", type=int, default=5, help="samples per small operation")
    parser.add_argument(
        "--tmp", default=None, help="where to put generated data (default: system temp)"
    )
    args = parser.parse_args()
    counts = [int(x) for x in args.files.split(",")]
    largest = max(counts)

    tmp = Path(tempfile.mkdtemp(prefix="shiftlog-bench-", dir=args.tmp))
    try:
        rows = []
        for n in counts:
            rows += bench_size(n, int(args.total_mb * 1e6 * n / largest), args.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    git_version = subprocess.run(
        ["git", "--version"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"\nPython {platform.python_version()}, {git_version}, {os.cpu_count()} CPUs, {platform.system()}"
    )
    print(f"medians of {args.repeat} runs (first checkpoint: one run)\n")
    print(
        "| files | tree | operation | Shiftlog ms | git ms | cp -a ms | changed bytes | Shiftlog growth | git objects growth | cp -a growth |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['files']:,} | {fmt_bytes(r['tree_bytes'])} | {r['op']} | {fmt_ms(r.get('shiftlog_ms'))} "
            f"| {fmt_ms(r.get('git_ms'))} | {fmt_ms(r.get('cp_ms'))} | {fmt_bytes(r['changed'])} "
            f"| {fmt_bytes(r.get('shiftlog_bytes'))} | {fmt_bytes(r.get('git_bytes'))} | {fmt_bytes(r.get('cp_bytes'))} |"
        )

    print()
    for r in rows:
        if r["op"] != "one file changed":
            continue
        speedup = r["git_ms"] / r["shiftlog_ms"]
        overhead = r["shiftlog_bytes"] - r["changed"]
        print(
            f"{r['files']:,} files, one change: {fmt_ms(r['shiftlog_ms'])} ms, git takes {speedup:.1f}x as long, "
            f"files re-read: {r['hashed']}, store growth = changed file + {fmt_bytes(overhead)} of trees"
        )
        if r["files"] == max(counts) and r["files"] >= 10_000:
            checks = {
                "under 100 ms": r["shiftlog_ms"] < 100,
                "at least 5x faster than git": speedup >= 5,
                "store growth close to the changed bytes (within 64 KB)": 0 <= overhead <= 64_000,
            }
            for what, ok in checks.items():
                print(f"  target {what}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
