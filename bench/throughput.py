#!/usr/bin/env python
"""Throughput of real huey workers: many concurrent scripted runs with simulated model latency.

    .venv/bin/python bench/throughput.py            # SQLite and PostgreSQL + Redis, ~3-5 min
    .venv/bin/python bench/throughput.py --quick    # a smaller version of the same, ~1-2 min
    .venv/bin/python bench/throughput.py --mode sqlite --procs 1,2 --runs 10

What runs: N scripted runs (20 by default), each T turns long (24), every turn a cheap file tool
(write_file and read_file alternating) after a simulated model latency of 200 ms (the script's
`turn_delay_seconds`; the provider sleeps, so a worker thread is held for that time exactly as a
real model call holds it). Sessions are 12 turns, so every run also goes through a handoff
(checks at session end, checkpoint, a new slice put back on the queue and picked up by whichever
worker thread is free). The runs are driven by real consumer processes, started the way
docs/deploy.md says to start them:

    python manage.py run_huey -w K -k thread -g TERM -t 30      (P of them; K = 4 by default)

with huey's default polling and the periodic reaper on, on P = 1, 2 and 4 processes, in two modes:

  sqlite    the embedded default: SQLite (WAL, IMMEDIATE) and SqliteHuey in its own file;
  postgres  DATABASE_URL=postgres://.../shiftlog_bench_tp_<random> (created and dropped here),
            REDIS_URL=redis://127.0.0.1:6379/<an empty db> and a unique SHIFTLOG_HUEY_NAME
            (RedisHuey; its keys are deleted at the end).

Order of one measurement: migrate, create the N runs (each queued at once), start the P
consumers (the window starts at the first model.turn, so neither consumer start-up nor this
script's one-by-one creation is measured; the product's pick-up of N queued runs is), poll the
database until every run has ended, stop the consumers with SIGTERM.

Reported per measurement:
  steps/s     model.turn events of the N runs divided by the time from the first of them to the
              last (so it includes the tail, when fewer runs than worker threads are left);
  ceiling     min(N, P x K) / turn delay: what the worker threads could do if the harness cost
              nothing (handoff turns the harness asks for have no simulated latency, so a run can
              slightly beat it);
  step gap    per run, the gap between consecutive model.turn created_at, pooled over runs,
              minus nothing. It includes the 200 ms simulated latency, recording the turn, the
              tool, recording its result and the limit checks; at a session boundary it also
              includes the handoff, the checks at session end, the checkpoint, the new slice's
              wait in the queue for a free worker thread (and huey's polling delay for SQLite),
              the claim and the rebuild. "in-session p99" leaves the boundary gaps out.
  finished    runs that ended `succeeded`, of N.

The approval row: M more runs (10) whose first tool call is `curl -s http://example.invalid/`,
which the built-in risk classifier makes ask a person (agents/policy.py, "reaches the network").
They are created first, on one consumer process; once all M are awaiting approval that consumer
stops and the N normal runs are created and measured as above. Nobody approves, so the curl never runs. While the normal
runs work, every 0.5 s the bench checks that the waiting runs hold no lease (lease_owner empty,
lease_expires_at null: no slice is driving them, since a slice holds the lease from claim to
release) and are not in the huey queue, and how many normal runs hold a lease at once (K when
no worker thread is held by a waiting run). The throughput is compared with the row of the same
mode on one process without waiting runs.

Every measurement runs in its own child process with its own temporary SHIFTLOG_DATA_DIR
(deleted afterwards), its own PostgreSQL database and its own Redis db number and huey name.
SHIFTLOG_BENCH_KEEP_DB=1 keeps the PostgreSQL database afterwards (its name is printed), to read
the log of a sitting. The consumers are started in sessions of their own and die with the child
(PR_SET_PDEATHSIG); the child stops them on exit, errors and Ctrl-C. Override the servers with
SHIFTLOG_BENCH_PG and SHIFTLOG_BENCH_REDIS.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchlib import (  # bench/benchlib.py, beside this script
    PG_SERVER,
    REDIS_SERVER,
    claim_redis_db,
    machine,
    pg_admin,
    pg_available,
    redis_available,
    release_redis_db,
)

ROOT = Path(__file__).resolve().parent.parent
NOTES = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 5))
RISKY_COMMAND = "curl -s http://example.invalid/"
TERMINAL = {"succeeded", "failed", "cancelled", "paused"}
SAMPLE_SECONDS = 0.5
DURABILITY = {
    "sqlite": "SQLite WAL, synchronous=NORMAL (the default SHIFTLOG_SQLITE_SYNC)",
    "postgres": "PostgreSQL server defaults (fsync on, synchronous_commit on)",
}
# The consumers' role may hold this many connections (PostgreSQL mode); --exhaust takes them all.
ROLE_LIMIT = 60
PR_SET_PDEATHSIG = 1


# --- processes ------------------------------------------------------------------------------
def _die_with_parent(signum: int):
    """A preexec_fn: the new process gets `signum` when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signum)

    return preexec


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (tool processes run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _raise_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


# --- child: one measurement -----------------------------------------------------------------
def _child_env() -> dict[str, str]:
    """The environment the consumers get: the child's own settings (set by the parent)."""
    env = dict(os.environ)
    if os.environ.get("SHIFTLOG_BENCH_CONSUMER_DB"):
        env["DATABASE_URL"] = os.environ["SHIFTLOG_BENCH_CONSUMER_DB"]
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
            "PYTHONUNBUFFERED": "1",
            "SHIFTLOG_HUEY_IMMEDIATE": "false",
            "SHIFTLOG_DEBUG": "false",
        }
    )
    return env


def _script(turns: int, delay: float) -> dict:
    body = []
    for i in range(1, turns):
        if i % 2:
            call = {
                "name": "write_file",
                "input": {"path": f"out/part{i % 5}.txt", "content": f"step {i}\n" * 4},
            }
        else:
            call = {"name": "read_file", "input": {"path": "notes.txt"}}
        body.append({"text": f"Step {i}.", "tool_calls": [call]})
    body.append({"text": "Done.", "tool_calls": [{"name": "finish", "input": {"summary": "ok"}}]})
    return {"name": "bench-throughput", "turn_delay_seconds": delay, "turns": body}


def _waiting_script(delay: float) -> dict:
    return {
        "name": "bench-waits",
        "turn_delay_seconds": delay,
        "turns": [
            {
                "text": "Fetching something.",
                "tool_calls": [{"name": "bash", "input": {"command": RISKY_COMMAND}}],
            },
            {"text": "Done.", "tool_calls": [{"name": "finish", "input": {"summary": "ok"}}]},
        ],
    }


def _create_runs(count: int, script: dict, source: Path, label: str, turns_per_session: int):
    from agents.runspec import RunSpec
    from agents.services import create_run

    return [
        create_run(
            RunSpec(
                goal=f"Benchmark ({label} {i}): write and read small files.",
                checks=["true"],
                script=script,
                script_name=label,
                max_turns_per_session=turns_per_session,
                workspace_from=source,
            )
        ).pk
        for i in range(count)
    ]


def _queued_run_ids() -> list[int]:
    from huey.contrib.djhuey import HUEY

    ids = []
    for task in HUEY.pending():
        run_id = (getattr(task, "kwargs", None) or {}).get("run_id")
        if run_id is not None:
            ids.append(run_id)
    return ids


def _wait_until(predicate, timeout: float, what: str, interval: float = 0.1, details=None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{details()}" if details else ""
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _consumer_connections() -> int | None:
    """The consumers' PostgreSQL connections now (their role's backends); None on SQLite."""
    role = os.environ.get("SHIFTLOG_BENCH_ROLE")
    if not role:
        return None
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND pid <> ALL(%s)",
            [role, OUTAGE_PIDS],
        )
        return cursor.fetchone()[0]


OUTAGE_PIDS: list[int] = []


class Outage:
    """--exhaust S: S seconds into the measurement (--exhaust-after), every connection the
    consumers' role may have is taken by this process and the consumers' own are ended, so
    PostgreSQL refuses them ("too many connections for role", SQLSTATE 53300, as a full
    server's "too many clients"); after S seconds they are given back."""

    def __init__(self, seconds: float, *, start_after: float) -> None:
        self.seconds = seconds
        self.start_at = time.monotonic() + start_after
        self.held: list = []
        self.started = self.ended = None

    def step(self, sample: dict) -> None:
        if not self.seconds or not os.environ.get("SHIFTLOG_BENCH_ROLE"):
            return
        now = time.monotonic()
        if self.started is None and now >= self.start_at:
            self.started = now
            print(f"outage: taking every connection for {self.seconds:g} s", flush=True)
        if self.started is not None and self.ended is None:
            if now - self.started >= self.seconds:
                self.end()
            else:
                self._take()
        sample["outage"] = self.started is not None and self.ended is None

    def _take(self) -> None:
        import psycopg
        from django.db import connection

        url = os.environ["SHIFTLOG_BENCH_CONSUMER_DB"]
        for _ in range(3):
            while len(self.held) < ROLE_LIMIT:
                try:
                    conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
                except psycopg.OperationalError:
                    break
                self.held.append(conn)
                OUTAGE_PIDS.append(conn.info.backend_pid)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = %s AND pid <> ALL(%s)",
                    [os.environ["SHIFTLOG_BENCH_ROLE"], OUTAGE_PIDS],
                )
            if len(self.held) >= ROLE_LIMIT:
                break
            time.sleep(0.05)

    def end(self) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.monotonic()
            for conn in self.held:
                with contextlib.suppress(Exception):
                    conn.close()
            self.held.clear()
            OUTAGE_PIDS.clear()
            print("outage: connections given back", flush=True)

    def report(self) -> dict | None:
        if self.started is None:
            return None
        return {"seconds": (self.ended or time.monotonic()) - self.started}


def child(args: argparse.Namespace) -> dict:
    _raise_on_sigterm()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shiftlog.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if role := os.environ.get("SHIFTLOG_BENCH_ROLE"):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
            cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')

    data_dir = Path(os.environ["SHIFTLOG_DATA_DIR"])
    consumers: list[tuple[subprocess.Popen, Path]] = []
    try:
        return _measure(args, data_dir, consumers)
    finally:
        _stop_consumers(consumers)
        from django.db import connections

        connections.close_all()


def _start_consumers(args, data_dir: Path, consumers: list, tag: str = "") -> None:
    command = [sys.executable, str(ROOT / "manage.py"), "run_huey", "-w", str(args.threads)]
    command += ["-k", "thread", "-g", "TERM", "-t", "30"]
    for i in range(args.procs):
        log_path = data_dir / f"consumer-{i}{'-' + tag if tag else ''}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                command,
                cwd=ROOT,
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(signal.SIGKILL),
            )
        consumers.append((popen, log_path))

    def started() -> bool:
        for popen, log_path in consumers:
            if popen.poll() is not None:
                raise RuntimeError(
                    f"consumer exited with {popen.returncode}:\n{log_path.read_text()[-3000:]}"
                )
        return all("consumer started" in p.read_text(errors="replace") for _, p in consumers)

    _wait_until(started, 90, "the consumers to start", interval=0.2)


def _stop_consumers(consumers: list) -> None:
    """SIGTERM (graceful: the running step finishes), then SIGKILL the group and its tools."""
    strays: set[int] = set()
    for popen, _ in consumers:
        if popen.poll() is None:
            strays.update(_descendants(popen.pid))
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for popen, _ in consumers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        if popen.poll() is None:
            strays.update(_descendants(popen.pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _measure(args, data_dir: Path, consumers: list) -> dict:
    from django.db import connection
    from django.db.models import Q
    from huey.contrib.djhuey import HUEY

    from agents.models import Approval, ApprovalStatus, Event, EventKind, Run, RunStatus

    source = data_dir / "source"
    source.mkdir()
    (source / "notes.txt").write_text(NOTES)

    def logs() -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for _, p in consumers)

    waiting: list[int] = []
    if args.waiting:
        _start_consumers(args, data_dir, consumers, tag="waits")
        waiting = _create_runs(
            args.waiting, _waiting_script(args.delay), source, "waits", args.turns_per_session
        )
        _wait_until(
            lambda: (
                Run.objects.filter(pk__in=waiting, status=RunStatus.AWAITING_APPROVAL).count()
                == len(waiting)
            ),
            60,
            "the waiting runs to reach awaiting_approval",
            details=logs,
        )
        # Waiting runs hold no lease and no worker thread: the consumers can stop and start
        # again below like the rows without waiting runs.
        _stop_consumers(consumers)
        consumers.clear()

    # The runs are made before the consumers start, so that the window measured (first to last
    # model.turn) holds the product's own pick-up of N queued runs, not this script making them
    # one by one while the first ones already run.
    created_at = time.time()
    normal = _create_runs(
        args.runs, _script(args.turns, args.delay), source, "bench", args.turns_per_session
    )
    created_s = time.time() - created_at
    _start_consumers(args, data_dir, consumers)

    samples = []
    outage = Outage(args.exhaust, start_after=args.exhaust_after)
    budget = args.timeout + args.exhaust
    deadline = time.monotonic() + budget
    while True:
        statuses = dict(Run.objects.filter(pk__in=normal).values_list("pk", "status"))
        done = sum(1 for s in statuses.values() if s in TERMINAL)
        sample = {
            "t": time.time(),
            "normal_leased": Run.objects.filter(pk__in=normal).exclude(lease_owner="").count(),
            "db_connections": _consumer_connections(),
        }
        outage.step(sample)
        if waiting:
            sample["waiting_leased"] = (
                Run.objects.filter(pk__in=waiting)
                .filter(~Q(lease_owner="") | Q(lease_expires_at__isnull=False))
                .count()
            )
            sample["waiting_not_awaiting"] = (
                Run.objects.filter(pk__in=waiting)
                .exclude(status=RunStatus.AWAITING_APPROVAL)
                .count()
            )
            sample["waiting_in_queue"] = len(set(_queued_run_ids()) & set(waiting))
        samples.append(sample)
        if done == len(normal):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(SAMPLE_SECONDS)
    all_done_s = time.time() - created_at
    timed_out = done < len(normal)
    outage.end()

    # Let in-flight bookkeeping settle (e.g. the slice returning after `succeeded`).
    time.sleep(0.5)
    final_waiting = {}
    if waiting:
        final_waiting = {
            "statuses": sorted(
                set(Run.objects.filter(pk__in=waiting).values_list("status", flat=True))
            ),
            "leased": Run.objects.filter(pk__in=waiting)
            .filter(~Q(lease_owner="") | Q(lease_expires_at__isnull=False))
            .count(),
            "in_queue": len(set(_queued_run_ids()) & set(waiting)),
            "approvals_pending": Approval.objects.filter(
                run_id__in=waiting, status=ApprovalStatus.PENDING
            ).count(),
            "tool_results": Event.objects.filter(
                run_id__in=waiting, kind=EventKind.TOOL_RESULT
            ).count(),
        }
    queue_pending = HUEY.pending_count()
    results_stored = HUEY.result_count()

    rows = list(
        Event.objects.filter(run_id__in=normal, kind=EventKind.MODEL_TURN)
        .order_by("run_id", "seq")
        .values_list("run_id", "session_id", "created_at")
    )
    times = sorted(created.timestamp() for _, _, created in rows)
    gaps, in_session, boundary = [], [], []
    for (run_a, session_a, t_a), (run_b, session_b, t_b) in itertools.pairwise(rows):
        if run_a != run_b:
            continue
        gap = (t_b - t_a).total_seconds() * 1000
        gaps.append(gap)
        (in_session if session_a == session_b else boundary).append(gap)
    window = times[-1] - times[0] if len(times) > 1 else 0.0
    # When each run's k-th turn came, from the window's start: the median and the last run's.
    by_turn: dict[int, list[float]] = {}
    for _, group in itertools.groupby(rows, key=lambda row: row[0]):
        for k, (_, _, created) in enumerate(group):
            by_turn.setdefault(k + 1, []).append(created.timestamp() - (times[0] if times else 0))
    turn_times = [
        [k, round(_percentile(v, 0.5), 2), round(max(v), 2)] for k, v in sorted(by_turn.items())
    ]
    statuses = Run.objects.filter(pk__in=normal).values_list("status", "status_reason")
    by_status: dict[str, int] = {}
    reasons = set()
    for status, reason in statuses:
        by_status[status] = by_status.get(status, 0) + 1
        if status != RunStatus.SUCCEEDED and reason:
            reasons.add(reason[:200])
    during = [s for s in samples if s["t"] >= (times[0] if times else 0)]
    result = {
        "mode": args.mode,
        "procs": args.procs,
        "threads": args.threads,
        "runs": args.runs,
        "waiting": args.waiting,
        "turns": args.turns,
        "delay": args.delay,
        "turns_per_session": args.turns_per_session,
        "steps": len(rows),
        "window_s": window,
        "steps_per_s": (len(rows) - 1) / window if window else 0.0,
        "ceiling": min(args.runs, args.procs * args.threads) / args.delay,
        "failed_runs": len(normal) - by_status.get(RunStatus.SUCCEEDED, 0),
        "peak_db_connections": max(
            (s["db_connections"] for s in samples if s["db_connections"] is not None),
            default=None,
        ),
        "outage": outage.report(),
        "gap_p50_ms": _percentile(gaps, 0.50),
        "gap_p99_ms": _percentile(gaps, 0.99),
        "gap_max_ms": max(gaps) if gaps else None,
        "in_session_p50_ms": _percentile(in_session, 0.50),
        "in_session_p99_ms": _percentile(in_session, 0.99),
        "turn_times": turn_times,
        "boundary_n": len(boundary),
        "boundary_p50_ms": _percentile(boundary, 0.50),
        "boundary_max_ms": max(boundary) if boundary else None,
        "succeeded": by_status.get(RunStatus.SUCCEEDED, 0),
        "by_status": by_status,
        "reasons": sorted(reasons),
        "timed_out": timed_out,
        "create_s": created_s,
        "all_done_s": all_done_s,
        "samples": len(during),
        "max_normal_leased": max((s["normal_leased"] for s in during), default=0),
        "queue_pending_after": queue_pending,
        "huey_results_stored": results_stored,
        "vendor": connection.vendor,
    }
    if waiting:
        result.update(
            {
                "max_waiting_leased": max((s["waiting_leased"] for s in during), default=0),
                "max_waiting_not_awaiting": max(
                    (s["waiting_not_awaiting"] for s in during), default=0
                ),
                "max_waiting_in_queue": max((s["waiting_in_queue"] for s in during), default=0),
                "final_waiting": final_waiting,
            }
        )
    if connection.vendor == "postgresql":
        result["server_version"] = connection.pg_version
    if timed_out or by_status.get(RunStatus.SUCCEEDED, 0) < args.runs:
        result["consumer_logs"] = logs()
        unfinished = Run.objects.filter(pk__in=normal).exclude(status=RunStatus.SUCCEEDED)
        result["unfinished_tails"] = {
            run_id: [
                f"{e.seq} {e.kind} {e.actor} {str(e.payload)[:300]}"
                for e in reversed(Event.objects.filter(run_id=run_id).order_by("-seq")[:24])
            ]
            for run_id in unfinished.values_list("pk", flat=True)[:3]
        }
    return result


# --- parent: servers, children, the report ---------------------------------------------------
def _servers_available() -> tuple[bool, str]:
    for ok, why in (pg_available(), redis_available()):
        if not ok:
            return False, why
    return True, ""


def _run_child(args: argparse.Namespace, mode: str, procs: int, waiting: int) -> dict:
    token = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    data_dir = Path(tempfile.mkdtemp(prefix="shiftlog-bench-tp-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHIFTLOG_", "DJANGO_")) and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    env.update(
        {
            "SHIFTLOG_DATA_DIR": str(data_dir),
            "SHIFTLOG_LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
            "SHIFTLOG_HUEY_IMMEDIATE": "false",
            "SHIFTLOG_DEBUG": "false",
        }
    )
    if args.pool is not None:
        env["SHIFTLOG_DB_POOL_SIZE"] = str(args.pool)
    db_name = redis_db = huey_name = None
    label = f"{mode}, {procs} process(es) x {args.threads} threads" + (
        f", {waiting} runs awaiting approval" if waiting else ""
    )
    print(f"  running {label} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    proc = None
    try:
        if mode == "postgres":
            db_name = f"shiftlog_bench_tp_{token}"
            pg_admin(f'CREATE DATABASE "{db_name}"')
            env["DATABASE_URL"] = f"{PG_SERVER}/{db_name}"
            # The consumers log in as a role of their own, so their connections can be counted
            # (and, with --exhaust, all taken) without touching anyone else's on the server.
            role = f"shiftlog_bench_tp_{token}"
            pg_admin(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {ROLE_LIMIT}')
            host = PG_SERVER.split("://", 1)[1].rsplit("@", 1)[-1]
            env["SHIFTLOG_BENCH_CONSUMER_DB"] = f"postgres://{role}@{host}/{db_name}"
            env["SHIFTLOG_BENCH_ROLE"] = role
            redis_db = claim_redis_db(token)
            huey_name = f"shiftlog_bench_tp_{token}"
            env["REDIS_URL"] = f"{REDIS_SERVER}/{redis_db}"
            env["SHIFTLOG_HUEY_NAME"] = huey_name
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode]
        command += ["--procs", str(procs), "--waiting", str(waiting)]
        command += ["--threads", str(args.threads), "--runs", str(args.runs)]
        command += ["--turns", str(args.turns), "--delay", str(args.delay)]
        command += ["--turns-per-session", str(args.turns_per_session)]
        command += ["--timeout", str(args.timeout), "--exhaust", str(args.exhaust)]
        command += ["--exhaust-after", str(args.exhaust_after)]
        out_path = data_dir / "child.out"
        with out_path.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(signal.SIGTERM),
            )
        try:
            proc.wait(timeout=args.timeout + 180)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"benchmark child took too long: {label}") from None
        text = out_path.read_text(errors="replace")
        if proc.returncode != 0:
            sys.stderr.write("\n" + text[-6000:])
            raise SystemExit(f"benchmark child failed ({proc.returncode}): {label}")
        line = [ln for ln in text.splitlines() if ln.startswith("RESULT ")][-1]
        result = json.loads(line[len("RESULT ") :])
        print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr)
        if result.get("consumer_logs"):
            sys.stderr.write(result["consumer_logs"][-4000:] + "\n")
        for run_id, tail in (result.get("unfinished_tails") or {}).items():
            sys.stderr.write(f"--- run {run_id}, its last events ---\n" + "\n".join(tail) + "\n")
        return result
    finally:
        if proc is not None and proc.poll() is None:
            # The child stops its consumers on SIGTERM (Ctrl-C reached it already, too).
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=50)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if db_name and os.environ.get("SHIFTLOG_BENCH_KEEP_DB"):
            print(f"kept the database {db_name}", file=sys.stderr)
        elif db_name:
            with contextlib.suppress(Exception):
                pg_admin(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            with contextlib.suppress(Exception):
                pg_admin(f'DROP ROLE IF EXISTS "shiftlog_bench_tp_{token}"')
        if redis_db is not None and huey_name:
            with contextlib.suppress(Exception):
                left = release_redis_db(redis_db, token, huey_name)
                if left:
                    print(f"\n  note: Redis db {redis_db} still holds {left}", file=sys.stderr)
        shutil.rmtree(data_dir, ignore_errors=True)


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _machine(results: list[dict]) -> list[str]:
    import sqlite3

    import django
    import huey

    lines = [
        machine(),
        f"python {platform.python_version()}, Django {django.get_version()}, huey "
        f"{huey.__version__}, SQLite {sqlite3.sqlite_version}",
    ]
    pg = {r.get("server_version") for r in results if r.get("server_version")}
    if pg:
        v = pg.pop()
        lines.append(f"PostgreSQL server {v // 10000}.{v % 10000}, Redis at {REDIS_SERVER}")
    return lines


def _table(mode: str, rows: list[dict]) -> list[str]:
    title = {
        "sqlite": "SQLite + SqliteHuey (embedded default)",
        "postgres": "PostgreSQL + RedisHuey",
    }[mode]
    out = [f"### {title}", ""]
    out.append(
        "| consumers | waiting runs | steps | window s | steps/s | ceiling | step gap p50 ms "
        "| p99 ms | max ms | in-session p99 ms | session-boundary gap p50 / max ms "
        "| finished |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = next((r for r in rows if r["procs"] == 1 and not r["waiting"]), None)
    for r in rows:
        finished = f"{r['succeeded']}/{r['runs']}"
        if r["succeeded"] < r["runs"]:
            finished += " " + ", ".join(f"{k} {v}" for k, v in sorted(r["by_status"].items()))
        if r["timed_out"]:
            finished += " (timed out)"
        out.append(
            f"| {r['procs']} x -w {r['threads']} | {r['waiting']} | {r['steps']:,} "
            f"| {r['window_s']:.1f} | {r['steps_per_s']:.1f} | {r['ceiling']:.0f} "
            f"| {_fmt(r['gap_p50_ms'])} | {_fmt(r['gap_p99_ms'])} | {_fmt(r['gap_max_ms'])} "
            f"| {_fmt(r['in_session_p99_ms'])} "
            f"| {_fmt(r['boundary_p50_ms'])} / {_fmt(r['boundary_max_ms'])} | {finished} |"
        )
    out.append("")
    for r in rows:
        if not r["waiting"]:
            continue
        fw = r["final_waiting"]
        ratio = r["steps_per_s"] / base["steps_per_s"] if base and base["steps_per_s"] else None
        out.append(
            f"Approval check ({r['procs']} consumer x -w {r['threads']}, {r['waiting']} runs "
            f"waiting on `{RISKY_COMMAND}`): normal runs made {r['steps_per_s']:.1f} steps/s"
            + (
                f", {ratio:.2f}x the {base['steps_per_s']:.1f} steps/s without waiting runs"
                if ratio
                else ""
            )
            + f". Over {r['samples']} samples every {SAMPLE_SECONDS} s while they worked: "
            f"waiting runs holding a lease at most {r['max_waiting_leased']}, in the huey queue "
            f"at most {r['max_waiting_in_queue']}, not awaiting_approval at most "
            f"{r['max_waiting_not_awaiting']}; normal runs holding a lease at once at most "
            f"{r['max_normal_leased']} (= worker threads {r['threads']}). At the end: waiting "
            f"runs {', '.join(fw['statuses'])}, {fw['leased']} with a lease, {fw['in_queue']} "
            f"queued, {fw['approvals_pending']} approvals pending, {fw['tool_results']} tool "
            "results (the curl never ran)."
        )
        out.append("")
    for r in rows:
        if r["reasons"]:
            out.append(f"- {r['procs']} consumer(s): unfinished reasons: {'; '.join(r['reasons'])}")
    extra = ", ".join(
        f"{r['procs']}x{'+' + str(r['waiting']) if r['waiting'] else ''}: "
        f"{r['huey_results_stored']} results, {r['queue_pending_after']} queued"
        for r in rows
    )
    out.append(f"huey result store / queue after each measurement: {extra}")
    return out


def parent(args: argparse.Namespace) -> int:
    _raise_on_sigterm()
    modes = ["sqlite", "postgres"] if args.mode == "both" else [args.mode]
    notes = []
    if "postgres" in modes:
        ok, why = _servers_available()
        if not ok:
            notes.append(f"skipped postgres mode: {why}")
            modes.remove("postgres")
    load = os.getloadavg()[0]
    started = time.perf_counter()
    by_mode: dict[str, list[dict]] = {}
    try:
        for mode in modes:
            rows = by_mode.setdefault(mode, [])
            for procs in args.procs_list:
                rows.append(_run_child(args, mode, procs, 0))
            if args.waiting:
                rows.append(_run_child(args, mode, 1, args.waiting))
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    total = time.perf_counter() - started
    results = [r for rows in by_mode.values() for r in rows]
    if args.json:
        end_load = os.getloadavg()[0]
        for r in results:
            print(
                json.dumps(
                    {
                        "mode": r["mode"],
                        "procs": r["procs"],
                        "threads": r["threads"],
                        "runs": r["runs"],
                        "turns": r["turns"],
                        "delay_s": r["delay"],
                        "waiting": r["waiting"],
                        "steps_per_s": round(r["steps_per_s"], 2),
                        "ideal_steps_per_s": round(r["ceiling"], 2),
                        "of_ideal": round(r["steps_per_s"] / r["ceiling"], 3)
                        if r["ceiling"]
                        else None,
                        "failed_runs": r["failed_runs"],
                        "timed_out": r["timed_out"],
                        "by_status": r["by_status"],
                        "reasons": r["reasons"],
                        "peak_db_connections": r["peak_db_connections"],
                        "window_s": round(r["window_s"], 2),
                        "create_s": round(r["create_s"], 2),
                        "step_gap_p50_ms": r["gap_p50_ms"] and round(r["gap_p50_ms"], 1),
                        "in_session_p99_ms": r["in_session_p99_ms"]
                        and round(r["in_session_p99_ms"], 1),
                        "turn_s": r["turn_times"],
                        "outage": r["outage"],
                        "durability": DURABILITY[r["mode"]],
                        "load_average_1m": {"start": round(load, 2), "end": round(end_load, 2)},
                    }
                )
            )
        return 1 if any(r["failed_runs"] for r in results) else 0

    print(
        f"# Shiftlog throughput: {args.runs} concurrent scripted runs x {args.turns} turns, "
        f"{args.delay * 1000:.0f} ms simulated model latency a turn"
    )
    print()
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    for line in _machine(results):
        print(f"- {line}")
    print(
        f"- load average (1 min): {load:.2f} when the benchmark started, "
        f"{os.getloadavg()[0]:.2f} at the end (the machine is shared)"
    )
    print(
        f"- consumers: `manage.py run_huey -w {args.threads} -k thread -g TERM -t 30` "
        "(huey's default polling, periodic reaper on); tools: write_file / read_file "
        f"alternating, finish at the end; sessions of {args.turns_per_session} turns (each run "
        "hands off, so its next slice goes back through the queue)"
    )
    print()
    for note in notes:
        print(note)
        print()
    print(
        "steps/s: model.turn events of the normal runs / (last - first model.turn). ceiling: "
        "min(runs, consumers x threads) / turn delay. step gap: per run, created_at of a "
        "model.turn minus the previous one's, minus nothing: the simulated latency, recording "
        "the turn, the tool, its result and the checks between steps; at a session boundary "
        "also the handoff, checks at session end, checkpoint, the wait in the queue for a free "
        "worker thread (and SqliteHuey's polling back-off), the claim and the rebuild. "
        "in-session p99 leaves the boundary gaps out."
    )
    print()
    for mode, rows in by_mode.items():
        for line in _table(mode, rows):
            print(line)
        print()
    print(f"benchmark total time: {total:.0f} s")
    failed = [r for r in results if r["succeeded"] < r["runs"]]
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--procs", default=None, help="consumer process counts, e.g. 1,2,4")
    parser.add_argument("--threads", type=int, default=4, help="worker threads per consumer (-w)")
    parser.add_argument("--runs", type=int, default=None, help="concurrent normal runs (20)")
    parser.add_argument("--turns", type=int, default=None, help="scripted turns per run (24)")
    parser.add_argument("--delay", type=float, default=0.2, help="simulated model latency, s")
    parser.add_argument("--turns-per-session", type=int, default=None, help="session length (12)")
    parser.add_argument(
        "--waiting", type=int, default=None, help="runs left awaiting approval (10; 0: skip)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="per measurement, seconds")
    parser.add_argument("--quick", action="store_true", help="8 runs x 12 turns, 1 and 2 procs")
    parser.add_argument(
        "--pool",
        type=int,
        default=None,
        help="postgres: SHIFTLOG_DB_POOL_SIZE of each consumer (the product's default if unset)",
    )
    parser.add_argument(
        "--exhaust",
        type=float,
        default=0.0,
        help="postgres: refuse the consumers every connection for this many seconds",
    )
    parser.add_argument(
        "--exhaust-after", type=float, default=5.0, help="seconds into the measurement"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the measurements as JSON, one object a line"
    )
    # Internal: one measurement in this process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.runs = args.runs or (8 if quick else 20)
    args.turns = args.turns or (12 if quick else 24)
    args.turns_per_session = args.turns_per_session or (6 if quick else 12)
    if args.waiting is None:
        args.waiting = 3 if quick else 10
    if args.child:
        args.procs = int(args.procs)
    else:
        args.procs_list = [int(p) for p in (args.procs or ("1,2" if quick else "1,2,4")).split(",")]
    if args.timeout is None:
        # Generous: 4x the time the slowest configuration needs if the harness cost nothing,
        # plus the consumers' start and one second a run to pick them all up: a slow sitting
        # is a figure, never runs reported failed because the bench stopped watching.
        slots = args.threads * (args.procs if args.child else min(args.procs_list))
        ideal = args.runs * args.turns * args.delay / min(slots, args.runs)
        args.timeout = max(60.0, 4 * ideal) + 30 + args.runs
    if args.turns < 2 or args.runs < 1 or args.threads < 1:
        parser.error("need --turns >= 2, --runs >= 1, --threads >= 1")
    if args.child:
        result = child(args)
        print("RESULT " + json.dumps(result))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
