#!/usr/bin/env python
"""What one sandboxed command costs, beside bubblewrap's own cost, measured side by side.

    .venv/bin/python bench/sandbox_calls.py                       # 4 rounds x 25 calls
    .venv/bin/python bench/sandbox_calls.py --compare-tree ../old # the same in another checkout
    .venv/bin/python bench/sandbox_calls.py --json                # last line: one JSON object

Each round measures, interleaved call by call so load changes hit every row alike:

  true           `/usr/bin/true` started with subprocess.run (a process's floor)
  bwrap bare     `bwrap --ro-bind / / true`
  bwrap full     the product's whole bubblewrap command for `cat notes.txt` (its view of the
                 filesystem, namespaces, user, tmpfs), started directly with subprocess.run
  run_command    agents.sandbox.run_command("cat notes.txt") under bwrap: limits, cgroups,
                 output capture, kill of leftovers
  with egress    the same with the run's egress proxy (what a run's bash step pays for its
                 process: a run under bwrap always has one), and the proxy's end_command()

With --compare-tree the same rounds run in a second checkout's code too (alternating rounds,
each in a fresh child process), so a change is measured before and after in one run. Figures are
medians in ms; the load average is printed beside them (a shared machine: compare ratios).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("true", "bwrap bare", "bwrap full", "run_command", "with egress")


def _child(tree: str, calls: int) -> dict[str, list[float]]:
    sys.path.insert(0, tree)
    from agents.sandbox import Workspace, bash, run_command
    from agents.sandbox.egress import EgressProxy

    folder = Path(tempfile.mkdtemp(prefix="shiftlog-bench-", dir="/var/tmp"))
    proxy = EgressProxy(folder / "egress", lambda host, port: "deny", lambda *a: None).start()
    try:
        (folder / "notes.txt").write_text("the quick brown fox\n")
        ws = Workspace(folder)
        binary = shutil.which("bwrap")
        env = bash.command_env(ws, isolation="bwrap")
        run_command("true", workspace=ws, isolation="bwrap")  # warm: probes, first cgroups
        run_command("true", workspace=ws, isolation="bwrap", egress=proxy)
        times: dict[str, list[float]] = {row: [] for row in ROWS}
        for _ in range(calls):
            for row in ROWS:
                time.sleep(0.02)  # a pause, as between an agent's commands
                began = time.perf_counter()
                if row == "true":
                    subprocess.run(["/usr/bin/true"], check=True)
                elif row == "bwrap bare":
                    subprocess.run([binary, "--ro-bind", "/", "/", "/usr/bin/true"], check=True)
                elif row == "bwrap full":
                    # As run_command builds it: /etc as one copy where the tree has that.
                    extra = {}
                    if "etc_folder" in inspect.signature(bash._argv).parameters:
                        extra["etc_folder"] = bash.view.etc_copy()
                    fds = bash.view.user_db_fds() if extra.get("etc_folder") is None else ()
                    argv = bash._argv(
                        "cat notes.txt",
                        ws,
                        env,
                        "bwrap",
                        toolchain=None,
                        limits=bash.DEFAULT_LIMITS,
                        egress=None,
                        user_fds=fds or None,
                        **extra,
                    )
                    with tempfile.TemporaryFile() as out:
                        subprocess.run(
                            argv, env=env, cwd=folder, stdout=out, pass_fds=fds, check=True
                        )
                    for fd in fds:
                        os.close(fd)
                elif row == "run_command":
                    result = run_command("cat notes.txt", workspace=ws, isolation="bwrap")
                    assert result.output == "the quick brown fox\n", result
                else:
                    result = run_command(
                        "cat notes.txt", workspace=ws, isolation="bwrap", egress=proxy
                    )
                    proxy.end_command()
                    assert result.output == "the quick brown fox\n", result
                times[row].append((time.perf_counter() - began) * 1000)
        return times
    finally:
        proxy.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _round(tree: Path, calls: int) -> dict[str, list[float]]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), "--calls", str(calls)],
        capture_output=True,
        text=True,
        cwd=tree,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"benchmark child failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def measure(calls: int = 25, rounds: int = 4, compare: Path | None = None) -> dict:
    """Medians per row (and per tree), with the load average before and after."""
    trees = {"this": ROOT} | ({"compared": compare} if compare else {})
    load = [round(x, 2) for x in os.getloadavg()]
    collected = {name: {row: [] for row in ROWS} for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            for row, values in _round(tree, calls).items():
                collected[name][row] += values
    out: dict = {"load_average_start": load, "calls": calls * rounds}
    for name, rows in collected.items():
        out[name] = {row: statistics.median(values) for row, values in rows.items()}
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def table(figures: dict) -> list[str]:
    names = [n for n in ("this", "compared") if n in figures]
    head = "| row | " + " | ".join(f"{n}: median ms | {n}: x bwrap bare" for n in names) + " |"
    lines = [
        f"Sandbox calls, {figures['calls']} of each, interleaved; load average "
        f"{figures['load_average_start']} at the start, {figures['load_average_end']} at the end",
        "",
        head,
        "|---" * (1 + 2 * len(names)) + "|",
    ]
    for row in ROWS:
        cells = []
        for n in names:
            value, bare = figures[n][row], figures[n]["bwrap bare"]
            cells += [f"{value:.2f}", f"{value / bare:.2f}"]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if "compared" in figures:
        for row in ("run_command", "with egress"):
            ratio = figures["compared"][row] / figures["this"][row]
            lines += ["", f"{row}: the compared tree takes {ratio:.2f}x this one's time"]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=25, help="calls of each row per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--compare-tree", type=Path, help="another checkout, measured alike")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.calls)))
        return 0
    figures = measure(args.calls, args.rounds, args.compare_tree)
    print("\n".join(table(figures)))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
