#!/usr/bin/env python
"""Chaos soak: random faults under load, then an accounting of every run.

    .venv/bin/python bench/chaos.py --seconds 60            # or: make chaos
    .venv/bin/python bench/chaos.py --seconds 600 --seed 7 --json

It deploys Shiftlog as docs/deploy.md does, on PostgreSQL + Redis: two `run_huey` worker
processes and one daphne, with a Redis server of its own (so it can restart it), a PostgreSQL
database of its own on the server at SHIFTLOG_BENCH_PG (default this machine's), and a data
folder on a small tmpfs of its own when the machine allows a private mount namespace (so it can
fill the disk). For `--seconds` it keeps a few scripted runs working at once (multi-session, risky
steps that wait for a person, periodic and on-demand checkpoints, rewinds, forks, notes, pauses
and resumes, decided by a simulated person through the same services), keeps WebSocket viewers on
their pages, and at random moments drawn from the seed: SIGKILLs a worker or the web process and
starts it again, SIGSTOPs a worker for longer than its lease and then SIGCONTs it, restarts Redis,
terminates every PostgreSQL connection of the soak, and fills the disk under the data folder and
frees it.

Then it stops the faults, decides what is left, lets everything settle and accounts: stuck_runs
(not ended), lost_events (gaps in a run's seqs), doubled_tools (a tool call that ran twice by the
tool ledger, SHIFTLOG_TOOL_LEDGER, written outside every workspace), lost_approvals (pending, or
decided without an event), stream_gaps (events a viewer missed, got twice or out of order),
missing_blobs (verify_store), lost_writes (a succeeded run whose last committed workspace lacks
a write whose result is on its live branch: bench/soak/writes.py). Each process is a host of its
own (its own data and workspace folders; only PostgreSQL, Redis and the blob store shared), so a
killed worker's run is carried on by a worker that restores its workspace from the store
(`--shared-folders`: one data folder for all, as before). The last line is one JSON object with
those and runs, kills, restarts, faults, workspace restores and recovery p50/p99 (fault to a
working run's next event). Exit 1 when anything is lost or stuck, 2 when the servers are not
there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from benchlib import machine, pg_available
from soak.account import account
from soak.cluster import Cluster, in_own_mount_namespace, reexec_in_mount_namespace
from soak.faults import KINDS, Faults
from soak.load import Person
from soak.viewers import Viewers
from soak.writes import lost_writes

LOST_KEYS = (
    "stuck_runs",
    "lost_events",
    "doubled_tools",
    "lost_approvals",
    "stream_gaps",
    "missing_blobs",
    "lost_writes",
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=120, help="how long the faults go on (120)")
    p.add_argument("--seed", type=int, default=None, help="the faults' and the work's seed")
    p.add_argument("--json", action="store_true", help="print only the JSON line at the end")
    p.add_argument("--runs-at-once", type=int, default=6, help="runs kept working (6)")
    p.add_argument("--viewers", type=int, default=3, help="WebSocket viewers (3)")
    p.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between faults")
    p.add_argument("--settle", type=float, default=180, help="seconds allowed to settle (180)")
    p.add_argument("--turn-delay", type=float, default=0.3, help="the scripted model's latency")
    p.add_argument(
        "--faults",
        default=",".join(KINDS),
        help=f"which faults, comma-separated (all: {','.join(KINDS)})",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the database and the logs afterwards (their names are printed)",
    )
    p.add_argument(
        "--skip-without-services",
        action="store_true",
        help="exit 0, saying so, when PostgreSQL or redis-server is not there (make test); "
        "SHIFTLOG_TEST_SERVICES=required makes that an error",
    )
    p.add_argument("--threads", type=int, default=2, help="threads per worker process (2)")
    p.add_argument(
        "--shared-folders",
        action="store_true",
        help="every process shares one data folder (by default each is a host of its own, "
        "sharing only PostgreSQL, Redis and the blob store)",
    )
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.settle <= 0 or a.fault_every <= 0:
        p.error("--seconds, --settle and --fault-every must be more than 0")
    if not 1 <= a.runs_at_once <= 50 or not 0 <= a.viewers <= 50:
        p.error("--runs-at-once must be 1-50 and --viewers 0-50")
    a.faults = [k.strip() for k in a.faults.split(",") if k.strip()]
    if not a.faults or set(a.faults) - set(KINDS):
        p.error(f"--faults takes some of {', '.join(KINDS)}")
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    return a


def say(args, text: str) -> None:
    if not args.json:
        print(text, flush=True)


def main(argv: list[str]) -> int:
    args = parse(argv)
    ok, why = pg_available()
    if ok and not shutil.which("redis-server"):
        ok, why = False, "redis-server is not installed (it starts a Redis of its own)"
    if not ok:
        if args.skip_without_services and os.environ.get("SHIFTLOG_TEST_SERVICES") != "required":
            print(f"SKIPPED the chaos soak: {why}", flush=True)
            return 0
        print(f"chaos needs PostgreSQL and redis-server: {why}", file=sys.stderr)
        return 2
    if not in_own_mount_namespace() and os.environ.get("SHIFTLOG_CHAOS_NS") != "0":
        code = reexec_in_mount_namespace()
        if code is not None:
            return code
    cluster = Cluster(workers=2, threads=args.threads, hosts=not args.shared_folders)
    faults = None
    try:
        faults = Faults(cluster, random.Random(args.seed + 1), args.fault_every, kinds=args.faults)
        return soak(args, cluster, faults)
    finally:
        cluster.stop(keep=args.keep)
        if faults is not None:
            faults.release.set()


def soak(args, cluster: Cluster, faults: Faults) -> int:
    say(args, machine())
    cluster.start()
    os.environ.update(cluster.env())
    import django

    django.setup()
    from django.test import Client

    rng = random.Random(args.seed)
    person = Person(random.Random(rng.random()))
    person.setup()
    client = Client()
    client.force_login(person.user)
    viewers = Viewers(cluster.web_port, client.cookies["sessionid"].value, args.viewers)
    viewers.start()
    striker = threading.Thread(target=faults.run, args=(args.seconds,), daemon=True)
    say(args, f"seed {args.seed}; disk: {cluster.disk}; soaking for {args.seconds:.0f} s")

    started = time.monotonic()
    striker.start()
    while time.monotonic() - started < args.seconds:
        live = person.attempt("read", person.live_runs)
        if live is not None:
            for _ in range(args.runs_at_once - len(live)):
                person.create_run(args.turn_delay)
            viewers.candidates = [pk for pk, _ in live] or viewers.candidates
        person.tick(actions=True)
        _mark_finished(person, viewers)
        time.sleep(0.3)
    faults.stop()
    faults.done.wait()
    for w in [*cluster.workers, cluster.web]:
        if not w.alive():
            w.start()
    say(args, f"faults over ({len(faults.log)}); settling")

    deadline = time.monotonic() + args.settle
    while time.monotonic() < deadline:
        person.attempt("settle", person.finish_everything)
        _mark_finished(person, viewers)
        live = person.attempt("read", person.live_runs, everything=True)
        if live == [] and _viewers_caught_up(viewers):
            break
        time.sleep(0.5)
    viewers.stop()
    from agents.models import Event, Run

    # Every run in the database: a run whose creation "failed" (the queue was down) counts too.
    every = list(Run.objects.values_list("pk", flat=True))
    result = account(every, cluster.ledger, viewers, faults.log)
    checked, lost_runs, lost_lines = lost_writes(every)
    result["details"]["writes"] = lost_lines[:20]
    result.update(
        hosts=cluster.hosts,
        restores=Event.objects.filter(run_id__in=every, kind="workspace.restored").count(),
        writes_checked=checked,
        lost_writes=lost_runs,
        seed=args.seed,
        seconds=args.seconds,
        kills=faults.kills,
        restarts=faults.restarts,
        faults=len(faults.log),
        fault_kinds=_kinds(faults.log),
        disk=cluster.disk,
        person=dict(person.counts),
        refused=dict(person.errors.most_common(12)),
    )
    report(args, result, faults.log)
    # A soak that made no run, or whose person hit a programming error (not a refusal or a
    # dropped connection), proves nothing: it fails (once it passed with 0 runs and 1,158
    # TypeErrors, when create_run's signature changed under it). So does a run that failed:
    # nothing the soak does may fail one (once 25 of 25 did, every command stopped by a free-space
    # floor larger than its disk).
    broken = [k for k in person.errors if k.split(": ")[-1] in PROGRAMMING_ERRORS]
    failed = result["statuses"].get("failed", 0)
    if not result["runs"] or broken or failed:
        say(
            args,
            f"THE SOAK DID NOT HOLD: {result['runs']} runs made, {failed} failed "
            f"({result['details']['failed'][:3]}); errors {broken}",
        )
        print(json.dumps(result, default=str), flush=True)
        return 1
    lost = any(result[k] for k in LOST_KEYS)
    if lost:
        say(args, f"LOST OR STUCK: see details; logs were in {cluster.logs}")
        for name in ("worker1", "worker2", "web"):
            log = cluster.logs / f"{name}.log"
            if log.exists() and not args.json:
                print(f"--- tail of {name}.log ---\n{log.read_text()[-3000:]}")
    print(json.dumps(result, default=str), flush=True)
    return 1 if lost else 0


PROGRAMMING_ERRORS = frozenset(
    {"TypeError", "AttributeError", "NameError", "ImportError", "KeyError", "IndexError"}
)


def _mark_finished(person: Person, viewers: Viewers) -> None:
    from agents.models import Run

    def read():
        done = Run.objects.filter(
            pk__in=person.created, status__in=["succeeded", "failed", "cancelled"]
        )
        return dict(done.values_list("pk", "last_seq"))

    finished = person.attempt("read", read)
    for run_id, last_seq in (finished or {}).items():
        # The log's last seq when the run was first seen over, kept: a viewer leaves then, and
        # what a person's late act appends afterwards (a refused rewind's error) is not its to
        # see (a later read overwrote it: the soak then reported that event missing).
        viewers.finished_runs.setdefault(run_id, last_seq)


def _viewers_caught_up(viewers: Viewers) -> bool:
    for w in viewers.watches:
        done = viewers.finished_runs.get(w.run_id)
        if done is None or (w.seqs[-1] if w.seqs else 0) < done:
            return False
    return True


def _kinds(log) -> dict:
    counts: dict[str, int] = {}
    for f in log:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return counts


def report(args, r: dict, log) -> None:
    if args.json:
        return
    rows = [
        ("runs", r["runs"], ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))),
        ("tool calls (ledger)", r["tool_calls"], ""),
        ("faults", r["faults"], ", ".join(f"{k} {v}" for k, v in sorted(r["fault_kinds"].items()))),
        ("kills / restarts", f"{r['kills']} / {r['restarts']}", ""),
        ("workspace restores", r["restores"], "hosts of their own" if r["hosts"] else "shared"),
        ("runs' writes checked", r["writes_checked"], "succeeded runs that are not forks"),
        ("viewer watches", r["watches"], ""),
        ("recovery p50 / p99 ms", f"{_ms(r['recovery_p50_ms'])} / {_ms(r['recovery_p99_ms'])}", ""),
    ] + [(k, r[k], "; ".join(map(str, _detail(r, k)))) for k in LOST_KEYS]
    print(f"\n| {'figure':<24} | {'value':>12} | notes")
    print(f"|{'-' * 26}|{'-' * 14}|------")
    for name, value, note in rows:
        print(f"| {name:<24} | {value!s:>12} | {note}")
    for line in r["details"]["failed"]:
        print(f"failed: {line}")
    print(f"\nperson: {r['person']}")
    print(f"refused or failed (expected under faults): {r['refused']}")
    for f in log:
        if f.detail:
            print(f"  fault {f.kind}: {f.detail}")


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _detail(r: dict, key: str) -> list:
    name = {
        "stuck_runs": "stuck",
        "lost_events": "lost_event_runs",
        "doubled_tools": "doubled",
        "lost_approvals": "lost_approvals",
        "stream_gaps": "stream",
        "missing_blobs": "store",
        "lost_writes": "writes",
    }[key]
    return r["details"].get(name, [])[:5]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
