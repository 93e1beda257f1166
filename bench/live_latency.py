#!/usr/bin/env python
"""How fast the live view follows a run, and how fast a long run's page opens.

    .venv/bin/python bench/live_latency.py            # everything, about 2-3 minutes
    .venv/bin/python bench/live_latency.py --quick    # 10 viewers, fewer events, fewer requests
    .venv/bin/python bench/live_latency.py --modes embedded --viewers 1,100 --no-page

1. Event committed by the worker -> fragment received by a WebSocket client. A real daphne
   (`python -m daphne -b 127.0.0.1 -p PORT shiftlog.asgi:application`) serves the app, and
   N WebSocket clients (the `websockets` library) watch one run: /ws/live/runs/<id>/?after=<seq>,
   logged in with a Django session cookie (made with the test Client's force_login) and an
   Origin header that ALLOWED_HOSTS accepts. A separate worker process (this script with
   --worker, Django set up with the same settings) appends to the run through agents.eventlog
   the way the runtime does: every step is one commit of [model.turn, tool.call] (in a
   transaction that also adds to the session's counters) and, --interval-ms later, one commit
   of [tool.result]. It records time.time() right after each COMMIT: the worker's database
   connection notes the time when COMMIT returns, before Django runs any on_commit hook, so
   whatever a hook does (a publish to the channel layer) counts in the latency. Each client
   records time.time() when a message first shows `data-seq="N"`. Latency = receive - commit,
   per client and event (same machine, one clock). The first --warmup commits are not counted.
   The bench does not care how an event reaches daphne (a tail of the event log, or a publish
   from the worker): it only appends in another process and watches what arrives.

   Modes: embedded (SQLite in WAL mode, in-memory channel layer) and redis
   (REDIS_URL=redis://127.0.0.1:6379/N, DATABASE_URL=postgres://postgres@127.0.0.1:5432/
   shiftlog_bench_latency_<random>, created here and dropped at the end). Targets: p50 <= 50 ms
   and p99 <= 200 ms embedded; p50 <= 15 ms with Redis; and every viewer gets every event
   ("lost" counts the (viewer, event) pairs that did not arrive within --drain-seconds after
   the worker's last commit). --history N first gives the watched run N earlier sessions and
   checkpoints (what a long run's side panels hold); the default runs use none.

2. The run page's server time: GET /runs/<id>/ by a logged-in user for a run with 100,000
   events (made with agents.eventlog.append_many, 2,000 a transaction), target <= 200 ms at
   the median. It is timed two ways: over HTTP against the same kind of daphne (one keep-alive
   connection; from sending the request to the last byte of the body), and in-process with the
   Django test Client (view + middleware + templates, no server; the query count comes from
   there). Then the same run gets the sessions and checkpoints a history that long would have
   (--page-sessions, default 800: 40 turns of ~3 events a session; one session_end checkpoint
   each, bulk-inserted) and is timed again: the page lists all of them. Only the events-only
   HTTP row is judged against the target.

Every measurement runs in its own child process with its own temporary SHIFTLOG_DATA_DIR,
its own free port, and (redis mode) its own PostgreSQL database and its own Redis db: one of
1-15 that is empty, never the test suite's (SHIFTLOG_TEST_REDIS, default db 14), claimed with a
key (`shiftlog-bench-latency:claim`) and, at the end, cleared of this bench's keys only (`asgi*`
and its own huey queue name), never FLUSHDB. Override the servers with SHIFTLOG_BENCH_PG and
SHIFTLOG_BENCH_REDIS. The child starts
daphne and the worker in sessions of their own and kills them when it ends, also on errors,
Ctrl-C or SIGTERM. They also get SIGTERM from the kernel if the child dies (PR_SET_PDEATHSIG).
Only 127.0.0.1 is touched. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
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

TARGETS = {"embedded": {"p50": 50.0, "p99": 150.0}, "redis": {"p50": 30.0, "p99": 100.0}}
PAGE_TARGET_MS = 200.0
MODE_LABEL = {
    "embedded": "embedded (SQLite, in-memory layer)",
    "redis": "redis (PostgreSQL, channels-redis)",
}
SEQ_RE = re.compile(r'data-seq="(\d+)"')
ASGI_APP = "shiftlog.asgi:application"
# The reference: a plain fan-out of the same events to the same viewers (bench/live/plain.py).
PLAIN_ASGI = "bench.live.plain:application"
METRICS_TOKEN = uuid.uuid4().hex  # daphne's /metrics, for its fan-out counters
LIVE_STATS = ("batches", "events", "renders", "frames", "queued")
CHILD_TIMEOUT = 420  # seconds one child may take before it is stopped


# --- shared helpers ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a started process, before exec: get SIGTERM when the process that started it dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _percentile(values: list[float], p: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "p99": _percentile(values, 99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _commit_plan(commits: int) -> list[int]:
    """Events per commit, as the worker makes them: [model.turn, tool.call], then [tool.result]."""
    return [2 if i % 2 == 0 else 1 for i in range(commits)]


# --- child: set up Django and the servers -------------------------------------------------
def _setup_django(
    data_dir: str, database_url: str | None, redis_url: str | None, huey_name: str | None
) -> None:
    """The mode's environment, in os.environ so daphne and the worker inherit it."""
    for name in list(os.environ):
        if name.startswith(("SHIFTLOG_", "DJANGO_")) or name in {"REDIS_URL", "DATABASE_URL"}:
            del os.environ[name]
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
            "SHIFTLOG_DATA_DIR": data_dir,
            "SHIFTLOG_HUEY_IMMEDIATE": "false",  # enqueued tasks are never consumed
            "SHIFTLOG_DEBUG": "false",
            "SHIFTLOG_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "SHIFTLOG_METRICS_TOKEN": METRICS_TOKEN,
        }
    )
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    if huey_name:
        os.environ["SHIFTLOG_HUEY_NAME"] = huey_name  # its queue's keys, deleted at the end
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # what `manage.py migrate` runs


def _user_and_cookie(username: str):
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user(username)  # no password: no hashing cost
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def _new_run(user, goal: str):
    from agents.runspec import RunSpec
    from agents.services import create_run

    # The built-in demo script; the huey task create_run enqueues is never consumed.
    return create_run(RunSpec(goal=goal, checks=["true"]), created_by=user)


class Children:
    """daphne and the worker: each in a session of its own, killed (group and all) on close."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log_path = self.folder / f"{name}-{len(self.procs)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=os.environ.copy(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.procs.append((name, proc, log_path))
        return proc

    def log(self, proc: subprocess.Popen, last: int = 3000) -> str:
        for _, p, path in self.procs:
            if p is proc:
                with contextlib.suppress(OSError):
                    return path.read_text(errors="replace")[-last:]
        return ""

    def close(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)


def _start_daphne(children: Children, app: str) -> tuple[int, subprocess.Popen]:
    port = _free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    argv += ["--access-log", str(children.folder / "daphne-access.log")]  # the log: errors only
    daphne = children.spawn("daphne", [*argv, app])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if daphne.poll() is not None:
            raise RuntimeError(f"daphne exited {daphne.returncode}:\n{children.log(daphne)}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return port, daphne
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise RuntimeError(f"daphne did not answer /healthz in 30 s:\n{children.log(daphne)}")


def _live_stats(port: int) -> dict[str, float]:
    """daphne's fan-out counters so far (dashboard.live.fanout.viewers.stats, through /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    found = dict(re.findall(r"^shiftlog_live_(\w+)_total (\S+)$", text, re.MULTILINE))
    return {name: float(found.get(name, 0)) for name in LIVE_STATS}


def _in_child(body, args: argparse.Namespace) -> dict:
    """Run body(args, data_dir, children) in a fresh data folder; always clean up."""

    def on_term(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    data_dir = tempfile.mkdtemp(prefix="shiftlog-bench-latency-")
    children = Children(Path(data_dir))
    try:
        _setup_django(data_dir, args.database_url, args.redis_url, args.huey_name)
        return body(args, Path(data_dir), children)
    finally:
        # Cleaning up: a second signal (Ctrl-C reaches the parent too, which then stops this
        # child with SIGTERM) must not cut it short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        children.close()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        shutil.rmtree(data_dir, ignore_errors=True)


# --- child: latency ------------------------------------------------------------------------
def _latency(args: argparse.Namespace, data_dir: Path, children: Children) -> dict:
    from agents import eventlog
    from agents.models import EventKind, Run, Session

    user, cookie = _user_and_cookie("viewer")
    run = _new_run(user, "Benchmark: live latency")
    if args.history:  # a long run's side panels: N sessions (the last one active), checkpoints
        _add_history(run.pk, args.history, args.history * 120)
        session = Session.objects.filter(run=run).order_by("-index").first()
    else:
        session = Session.objects.create(run=run, index=1, first_seq=run.last_seq + 1)
    eventlog.append(
        run.pk, EventKind.SESSION_STARTED, {"index": session.index}, session_id=session.pk
    )
    start_seq = Run.objects.get(pk=run.pk).last_seq
    port, daphne = _start_daphne(children, args.asgi)
    result = asyncio.run(
        _watch(args, children, port, cookie, run.pk, session.pk, start_seq, daphne)
    )
    from django.db import connection

    result["vendor"] = connection.vendor
    return result


async def _watch(args, children, port, cookie, run_id, session_id, start_seq, daphne) -> dict:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    plan = _commit_plan(args.commits)
    expected = set(range(start_seq + 1, start_seq + sum(plan) + 1))
    url = f"ws://127.0.0.1:{port}/ws/live/runs/{run_id}/?after={start_seq}"
    origin = f"http://127.0.0.1:{port}"
    seen: list[dict[int, float]] = [{} for _ in range(args.viewer_count)]
    opened = asyncio.Semaphore(10)  # at most 10 handshakes at a time
    connected = 0
    all_connected = asyncio.Event()
    messages = [0]
    received_bytes = [0]
    closed_early: list[str] = []  # sockets the server closed before all events came

    async def viewer(i: int) -> None:
        nonlocal connected
        async with opened:
            ws = await connect(
                url,
                origin=origin,
                additional_headers={"Cookie": f"sessionid={cookie}"},
                proxy=None,
                open_timeout=30,
                ping_interval=None,
                max_size=None,
            )
        connected += 1
        if connected == args.viewer_count:
            all_connected.set()
        mine = seen[i]
        try:
            async for message in ws:
                now = time.time()
                text = message if isinstance(message, str) else message.decode()
                messages[0] += 1
                received_bytes[0] += len(text)
                for seq in SEQ_RE.findall(text):
                    mine.setdefault(int(seq), now)
                if len(mine.keys() & expected) == len(expected):
                    break
            else:
                closed_early.append(f"code {ws.close_code} {ws.close_reason or ''}".strip())
        except ConnectionClosed as e:
            closed_early.append(f"code {e.rcvd.code if e.rcvd else 'none (1006)'}")
        finally:
            await ws.close()

    tasks = [asyncio.create_task(viewer(i)) for i in range(args.viewer_count)]
    worker = None
    try:
        waiter = asyncio.create_task(all_connected.wait())
        done, _ = await asyncio.wait(
            [waiter, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED
        )
        while waiter not in done:  # a viewer ended before all connected: a failed handshake
            for t in done:
                if t is not waiter and t.exception() is not None:
                    raise RuntimeError(f"a viewer could not connect: {t.exception()!r}")
            if not done:
                raise RuntimeError(f"only {connected} of {args.viewer_count} viewers connected")
            done, _ = await asyncio.wait(
                [waiter, *[t for t in tasks if not t.done()]],
                timeout=60,
                return_when=asyncio.FIRST_COMPLETED,
            )
        connect_load = os.getloadavg()[0]
        stats_start = await asyncio.to_thread(_live_stats, port)
        # daphne idle with the viewers connected (the tail's polls): its CPU over a second,
        # subtracted from the CPU per event below.
        idle_start = (time.monotonic(), _cpu_seconds(daphne.pid))
        await asyncio.sleep(1.0)
        idle_end = (time.monotonic(), _cpu_seconds(daphne.pid))
        cpu_start = (time.monotonic(), _cpu_seconds(daphne.pid), time.process_time())
        out_path = children.folder / "worker-result.json"
        worker = children.spawn(
            "worker",
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--run-id",
                str(run_id),
                "--session-id",
                str(session_id),
                "--commits",
                str(args.commits),
                "--warmup",
                str(args.warmup),
                "--interval-ms",
                str(args.interval_ms),
                "--out",
                str(out_path),
            ],
        )
        # The worker's own budget: start-up, the commits, and slack on a loaded machine.
        deadline = time.monotonic() + 60 + args.commits * args.interval_ms / 1000 * 3
        while worker.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not finish:\n{children.log(worker)}")
            if daphne.poll() is not None:
                raise RuntimeError(f"daphne died:\n{children.log(daphne)}")
            await asyncio.sleep(0.1)
        if worker.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"the worker failed:\n{children.log(worker)}")
        work = json.loads(out_path.read_text())
        cpu_end = (time.monotonic(), _cpu_seconds(daphne.pid), time.process_time())
        # Let the last events arrive (bounded): every viewer stops once it has them all.
        await asyncio.wait(tasks, timeout=args.drain_seconds)
        stats_end = await asyncio.to_thread(_live_stats, port)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)

    committed = {seq: c["t"] for c in work["commits"] for seq in range(c["first"], c["last"] + 1)}
    if set(committed) != expected:
        raise RuntimeError(
            f"the worker committed seqs {min(committed)}-{max(committed)}, expected "
            f"{min(expected)}-{max(expected)}"
        )
    warm = work["commits"][: args.warmup]
    skip = {seq for c in warm for seq in range(c["first"], c["last"] + 1)}
    measured = sorted(expected - skip)
    samples, lost = [], 0
    slowest_viewer = []  # per event: when the last viewer had it
    for seq in measured:
        worst = None
        for mine in seen:
            t = mine.get(seq)
            if t is None:
                lost += 1
                continue
            ms = (t - committed[seq]) * 1000
            samples.append(ms)
            worst = ms if worst is None else max(worst, ms)
        if worst is not None:
            slowest_viewer.append(worst)
    span = work["commits"][-1]["t"] - work["commits"][0]["t"]
    window = cpu_end[0] - cpu_start[0]
    daphne_cpu_s = idle_share = None
    if None not in (cpu_start[1], cpu_end[1], idle_start[1], idle_end[1]):
        daphne_cpu_s = cpu_end[1] - cpu_start[1]
        idle_share = (idle_end[1] - idle_start[1]) / (idle_end[0] - idle_start[0])
    fanned = {k: stats_end[k] - stats_start[k] for k in LIVE_STATS}
    return {
        "viewers": args.viewer_count,
        "history": args.history,
        "events": len(measured),
        "events_total": len(expected),
        "commits": len(work["commits"]),
        "rate_commits_per_s": (len(work["commits"]) - 1) / span if span > 0 else None,
        "samples": len(samples),
        "lost": lost,
        "latency_ms": _stats(samples),
        "all_viewers_ms": _stats(slowest_viewer),
        "negative": sum(1 for s in samples if s < 0),
        "closed_early": closed_early[:5],
        "closed_early_count": len(closed_early),
        "daphne_log": children.log(daphne, 4000) if lost or closed_early else "",
        "db_ms": work["db_ms"],
        "after_commit_ms": work["after_commit_ms"],
        "messages": messages[0],
        "received_bytes": received_bytes[0],
        "load_at_connect": connect_load,
        # Share of one core while the worker ran (its start-up included), and per event
        # committed meanwhile (every event of the run, the warm-up's included).
        "daphne_cpu": daphne_cpu_s / window if daphne_cpu_s is not None else None,
        # Above idle, per event: what the events cost daphne.
        "daphne_idle_cpu": idle_share,
        "daphne_cpu_ms_per_event": (
            max(0.0, daphne_cpu_s - idle_share * window) * 1000 / len(expected)
            if daphne_cpu_s is not None
            else None
        ),
        # daphne's fan-out (Shiftlog's app only): renders per event fanned out, frames sent
        # straight to a socket, batches a socket took through its own channel.
        "fanout": fanned,
        "renders_per_batch": (fanned["renders"] / fanned["batches"] if fanned["batches"] else None),
        "viewers_cpu": (cpu_end[2] - cpu_start[2]) / window,
    }


# --- worker: appends through the event log, as the runtime does ----------------------------
def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from decimal import Decimal

    from django.db import connections, transaction

    from agents import eventlog
    from agents.eventlog import NewEvent
    from agents.models import EventKind

    # The commit's own time: this process's connection notes time.time() the moment COMMIT
    # returns, before Django runs any on_commit hook (a publish to the channel layer, say), so
    # the latency counts whatever a hook does. Observation only: nothing else changes.
    stamps: list[float] = []
    db = connections["default"]
    real_commit = db._commit

    def commit_and_stamp():
        done = real_commit()
        stamps.append(time.time())
        return done

    db._commit = commit_and_stamp

    def turn(step: int) -> list[NewEvent]:
        tool_id = f"toolu_bench_{step:05d}"
        content = [
            {"type": "text", "text": f"Step {step}: reading the notes again."},
            {"type": "tool_use", "id": tool_id, "name": "read_file", "input": {"path": "n.txt"}},
        ]
        usage = {
            "input_tokens": 1200 + step,
            "output_tokens": 40,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        payload = {
            "content": content,
            "text": content[0]["text"],
            "stop_reason": "tool_use",
            "usage": usage,
            "cost_usd": "0.001",
            "model": "scripted",
            "latency_ms": 0.0,
            "context_seq": 0,
            "meta": {},
        }
        call = {"tool_use_id": tool_id, "name": "read_file", "input": {"path": "n.txt"}}
        return [
            NewEvent(EventKind.MODEL_TURN, payload, session_id=args.session_id, actor="agent"),
            NewEvent(EventKind.TOOL_CALL, call, session_id=args.session_id, actor="agent"),
        ]

    def result(step: int) -> list[NewEvent]:
        payload = {
            "tool_use_id": f"toolu_bench_{step:05d}",
            "name": "read_file",
            "output": "line 1: the quick brown fox jumps over the lazy dog\n" * 4,
            "is_error": False,
            "data": {},
        }
        return [NewEvent(EventKind.TOOL_RESULT, payload, session_id=args.session_id)]

    plan = _commit_plan(args.commits)
    increments = {
        "turns": 1,
        "input_tokens": 1200,
        "output_tokens": 40,
        "cost_usd": Decimal("0.001"),
    }
    commits, db_ms, after_ms = [], [], []
    interval = args.interval_ms / 1000
    start = time.monotonic()
    for i, size in enumerate(plan):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        stamps.clear()
        if size == 2:  # a model turn and its first tool call, with the counters (runtime-like)
            with transaction.atomic():
                appended = eventlog.append_many(args.run_id, turn(i // 2), increments=increments)
                eventlog.add_to_session(
                    args.session_id,
                    {k: v for k, v in increments.items()},
                    last_input_tokens=1200,
                )
        else:
            appended = eventlog.append_many(args.run_id, result(i // 2))
        returned = time.time()
        if len(stamps) != 1:
            raise RuntimeError(f"expected one COMMIT in commit {i}, saw {len(stamps)}")
        committed = stamps[0]
        first, last = appended.events[0], appended.events[-1]
        # created_at is taken when append_many starts: start → COMMIT is the database's part;
        # COMMIT → return is what runs after the commit in this process (on_commit hooks).
        db_ms.append((committed - first.created_at.timestamp()) * 1000)
        after_ms.append((returned - committed) * 1000)
        commits.append({"first": first.seq, "last": last.seq, "t": committed})
    result = {"commits": commits, "db_ms": _stats(db_ms), "after_commit_ms": _stats(after_ms)}
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")
    return 0


# --- child: the run page -------------------------------------------------------------------
FILL_BATCH = 2_000  # events per append_many: 14,000 parameters, under SQLite's 32,766


def _fill(run_id: int, events: int) -> None:
    """`events` events through agents.eventlog.append_many, FILL_BATCH per transaction."""
    from agents import eventlog
    from agents.eventlog import NewEvent
    from agents.models import EventKind

    batch: list[NewEvent] = []
    for n in range(events):
        step, part = divmod(n, 3)
        if part == 0:
            kind = EventKind.MODEL_TURN
            payload = {
                "text": f"Step {step}: looking at the next file.",
                "content": [{"type": "tool_use", "id": f"t{step}", "name": "read_file"}],
                "usage": {"input_tokens": 1500, "output_tokens": 60},
                "cost_usd": "0.002",
            }
        elif part == 1:
            kind = EventKind.TOOL_CALL
            payload = {"tool_use_id": f"t{step}", "name": "read_file", "input": {"path": "a.py"}}
        else:
            kind = EventKind.TOOL_RESULT
            payload = {"tool_use_id": f"t{step}", "name": "read_file", "output": "x = 1\n" * 30}
        batch.append(NewEvent(kind, payload, actor="agent"))
        if len(batch) == FILL_BATCH:
            eventlog.append_many(run_id, batch)
            batch = []
    if batch:
        eventlog.append_many(run_id, batch)


def _add_history(run_id: int, count: int, events: int) -> None:
    """Ended sessions and one session_end checkpoint each, as a run that long would have them
    (40 turns a session of ~3 events each is ~120 events a session: 100,000 events ~ 800).
    Rows of their own tables (not events), so plain bulk inserts."""
    from django.utils import timezone

    from agents.models import Checkpoint, CheckpointKind, Session, SessionStatus

    now = timezone.now()
    per = max(1, events // count)
    sessions = Session.objects.bulk_create(
        [
            Session(
                run_id=run_id,
                index=i + 1,
                status=SessionStatus.ENDED if i + 1 < count else SessionStatus.ACTIVE,
                end_reason="handoff" if i + 1 < count else "",
                started_at=now,
                ended_at=now if i + 1 < count else None,
                first_seq=2 + i * per,
                turns=40,
                input_tokens=60_000,
                output_tokens=2_400,
                handoff={"summary": f"Session {i + 1} notes", "next_steps": ["go on"]},
            )
            for i in range(count)
        ]
    )
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                run_id=run_id,
                session=s,
                seq=1 + (i + 1) * per,
                kind=CheckpointKind.SESSION_END,
                tree=f"{i:064x}",
                files=12,
                bytes_total=40_000,
                bytes_added=300,
                usage={"total_tokens": 62_400 * (i + 1), "cost_usd": "0.1", "turns": 40 * (i + 1)},
            )
            for i, s in enumerate(sessions[:-1])
        ]
    )


def _time_page(args, port: int, cookie: str, user, path: str, newest: str, log) -> dict:
    """GET `path` over HTTP to daphne and with the test Client: --page-warmup untimed, then
    --page-requests timed, or fewer when they pass --page-seconds (at least 5)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    def timed(get) -> list[float]:
        out: list[float] = []
        started = time.monotonic()
        for i in range(args.page_warmup + args.page_requests):
            t0 = time.perf_counter()
            get()
            ms = (time.perf_counter() - t0) * 1000
            if i >= args.page_warmup:
                out.append(ms)
                if len(out) >= 5 and time.monotonic() - started > args.page_seconds:
                    break
        return out

    size = [0]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def over_http() -> None:
        conn.request("GET", path, headers={"Cookie": f"sessionid={cookie}"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200 or newest.encode() not in body:
            raise RuntimeError(f"GET {path} gave {response.status} ({len(body)} bytes):\n{log()}")
        size[0] = len(body)

    try:
        http_ms = timed(over_http)
    finally:
        conn.close()
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)

    def in_process() -> None:
        response = client.get(path)
        if response.status_code != 200 or newest.encode() not in response.content:
            raise RuntimeError(f"test Client GET {path} gave {response.status_code}")

    client_ms = timed(in_process)
    with CaptureQueriesContext(connection) as queries:
        in_process()
    return {
        "bytes": size[0],
        "queries": len(queries.captured_queries),
        "http_ms": _stats(http_ms),
        "client_ms": _stats(client_ms),
    }


def _page(args: argparse.Namespace, data_dir: Path, children: Children) -> dict:
    from django.db import connection

    from agents.models import Run

    user, cookie = _user_and_cookie("reader")
    run = _new_run(user, "Benchmark: the run page of a long run")
    started = time.perf_counter()
    _fill(run.pk, args.page_events)
    fill_s = time.perf_counter() - started
    last_seq = Run.objects.get(pk=run.pk).last_seq
    port, daphne = _start_daphne(children, args.asgi)
    path, newest = f"/runs/{run.pk}/", f'data-seq="{last_seq}"'

    def log() -> str:
        return children.log(daphne)

    pages = [
        {
            "label": "events only",
            "events": last_seq,
            "fill_s": fill_s,
            **_time_page(args, port, cookie, user, path, newest, log),
        }
    ]
    if args.page_sessions:
        # The same run, now with the sessions and checkpoints such a history would have.
        started = time.perf_counter()
        _add_history(run.pk, args.page_sessions, args.page_events)
        pages.append(
            {
                "label": f"+ {args.page_sessions} sessions and checkpoints",
                "events": last_seq,
                "fill_s": time.perf_counter() - started,
                **_time_page(args, port, cookie, user, path, newest, log),
            }
        )
    return {"pages": pages, "vendor": connection.vendor}


# --- parent: resources, children, the report ------------------------------------------------
def _run_child(kind: str, mode: str, extra: list[str], label: str, asgi: str) -> dict:
    db_name = redis_db = None
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    huey_name = f"shiftlogbenchlatency{uuid.uuid4().hex[:16]}"  # huey keeps only [a-z0-9]
    left: list[str] = []
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *extra]
    command += ["--asgi", asgi]
    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    load_before = os.getloadavg()
    proc = None
    try:
        if mode == "redis":
            db_name = f"shiftlog_bench_latency_{uuid.uuid4().hex[:12]}"
            pg_admin(f'CREATE DATABASE "{db_name}"')
            redis_db = claim_redis_db(token)
            command += ["--database-url", f"{PG_SERVER}/{db_name}"]
            command += ["--redis-url", f"{REDIS_SERVER}/{redis_db}", "--huey-name", huey_name]
        proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the child cleans up its own servers on SIGTERM
            stdout, stderr = proc.communicate(timeout=30)
            raise RuntimeError(f"timed out after {CHILD_TIMEOUT} s:\n{stderr[-3000:]}") from None
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if db_name:
            with contextlib.suppress(Exception):
                pg_admin(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        if redis_db is not None:
            with contextlib.suppress(Exception):
                left = release_redis_db(redis_db, token, huey_name)
    elapsed = time.perf_counter() - started
    print(f" {elapsed:.1f} s", file=sys.stderr)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child exited {proc.returncode}:\n{stdout[-2000:]}{stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result["wall_s"] = elapsed
    if left:
        print(f"  note: Redis db {redis_db} still holds keys: {', '.join(left)}", file=sys.stderr)
    result["load_before"] = load_before
    result["load_after"] = os.getloadavg()
    return result


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _versions() -> str:
    out = [f"python {platform.python_version()}"]
    for name in ("django", "channels", "daphne", "channels_redis", "websockets"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            out.append(f"{name} {version(name.replace('_', '-'))}")
    import sqlite3

    out.append(f"SQLite {sqlite3.sqlite_version}")
    return ", ".join(out)


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _summarise(runs: list[dict]) -> dict:
    """Medians over the repeats of one (mode, viewers, app); lost summed."""
    lat = [r["latency_ms"] for r in runs]
    return {
        "repeats": len(runs),
        "p50_ms": _median([x["p50"] for x in lat]),
        "p99_ms": _median([x["p99"] for x in lat]),
        "max_ms": max((x["max"] for x in lat if x["max"] is not None), default=None),
        "lost": sum(r["lost"] for r in runs) if runs else None,
        "events": runs[0]["events"] if runs else 0,
        "daphne_cpu_share": _median([r["daphne_cpu"] for r in runs]),
        "daphne_cpu_ms_per_event": _median([r["daphne_cpu_ms_per_event"] for r in runs]),
        "renders_per_batch": _median([r["renders_per_batch"] for r in runs]),
        "frames_per_event": _median(
            [r["messages"] / r["events_total"] / r["viewers"] for r in runs]
        ),
        "runs_p50_ms": [x["p50"] for x in lat],
        "runs_p99_ms": [x["p99"] for x in lat],
    }


def _latency_row(mode: str, viewers: int, app: str, s: dict) -> tuple[str, bool]:
    target = TARGETS[mode]
    judged = app == "shiftlog"
    met = (
        bool(s["repeats"])
        and s["lost"] == 0
        and all(s[f"{k}_ms"] is not None and s[f"{k}_ms"] <= limit for k, limit in target.items())
    )
    wanted = ", ".join(f"{k} ≤ {v:g}" for k, v in target.items()) if judged else "reference"
    verdict = ("MET" if met else "NOT MET") if judged else "-"
    what = "event commit → fragment" if judged else "plain fan-out (reference)"
    row = (
        f"| {what} | {MODE_LABEL[mode]} | {viewers} | {s['events']:,} x {s['repeats']} "
        f"| {_ms(s['p50_ms'])} | {_ms(s['p99_ms'])} | {_ms(s['max_ms'])} | {s['lost']} "
        f"| {_ms(s['daphne_cpu_ms_per_event'])} | {wanted} | {verdict} |"
    )
    return row, met


def _latency_detail(label: str, r: dict, args: argparse.Namespace) -> str:
    lat, every, fan = r["latency_ms"], r["all_viewers_ms"], r["fanout"]
    return (
        f"- {label}: {r['commits']} commits ({r['events_total']} events, first "
        f"{args.warmup} commits not counted) at {r['rate_commits_per_s'] or 0:.1f} commits/s; "
        f"p50 {_ms(lat['p50'])} ms, p99 {_ms(lat['p99'])} ms, mean {_ms(lat['mean'])} ms; "
        f"last viewer to get an event: p50 {_ms(every['p50'])} ms, p99 {_ms(every['p99'])} ms; "
        f"{r['messages']:,} messages, {r['received_bytes'] / 1e6:.1f} MB received; worker: "
        f"append start → COMMIT p50 {_ms(r['db_ms']['p50'])} ms, COMMIT → append returned p50 "
        f"{_ms(r['after_commit_ms']['p50'])} ms; daphne {_pct(r['daphne_cpu'])} of a core, "
        f"{_ms(r['daphne_cpu_ms_per_event'])} ms CPU per event; fan-out: {fan['batches']:.0f} "
        f"batches, {fan['renders']:.0f} renders, {fan['frames']:.0f} frames sent straight, "
        f"{fan['queued']:.0f} through a socket's channel; viewers' process "
        f"{_pct(r['viewers_cpu'])}; load {r['load_before'][0]:.2f} before, "
        f"{r['load_at_connect']:.2f} at start, {r['load_after'][0]:.2f} after; child "
        f"{r['wall_s']:.0f} s"
        + (f"; {r['negative']} negative samples (clock?)" if r["negative"] else "")
        + (
            f"; {r['closed_early_count']} socket(s) closed by the server early "
            f"({', '.join(r['closed_early'])})"
            if r["closed_early_count"]
            else ""
        )
    )


def parent(args: argparse.Namespace) -> int:
    def on_term(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")  # the finally blocks clean up

    signal.signal(signal.SIGTERM, on_term)
    load_start = os.getloadavg()
    notes: list[str] = []
    modes = [m for m in args.modes.split(",") if m]
    servers = {}
    if "redis" in modes:
        pg_ok, pg_info = pg_available()
        redis_ok, redis_info = redis_available()
        if not (pg_ok and redis_ok):
            why = "; ".join(
                f"{name}: {info}"
                for name, ok, info in (("PostgreSQL", pg_ok, pg_info), ("Redis", redis_ok, redis_info))
                if not ok
            )  # fmt: skip
            notes.append(f"redis mode skipped ({why})")
            modes.remove("redis")
        else:
            servers = {"PostgreSQL": pg_info, "Redis": redis_info}
    viewer_counts = [int(v) for v in args.viewers.split(",") if v]
    started = time.perf_counter()
    rows, details, failures, logs = [], [], [], []
    all_met = True
    common = [
        "--commits", str(args.commits), "--interval-ms", str(args.interval_ms),
        "--warmup", str(args.warmup), "--drain-seconds", str(args.drain_seconds),
        "--history", str(args.history),
    ]  # fmt: skip
    apps = [("shiftlog", args.asgi)] + ([] if args.no_reference else [("plain", PLAIN_ASGI)])
    figures: dict = {}
    for mode in modes:
        for n in viewer_counts:
            got: dict[str, list[dict]] = {name: [] for name, _ in apps}
            for rep in range(args.repeat):
                # Interleaved: Shiftlog and the reference take turns going first.
                for name, app in apps if rep % 2 == 0 else apps[::-1]:
                    label = f"{mode}, {n} viewer(s), {args.commits} commits, {name} #{rep + 1}"
                    try:
                        r = _run_child(
                            "latency", mode, [*common, "--viewer-count", str(n)], label, app
                        )
                    except Exception as e:
                        failures.append(f"{label}: {e}")
                        continue
                    got[name].append(r)
                    details.append(_latency_detail(f"{mode}, {n} viewer(s), {name}", r, args))
                    if r["daphne_log"].strip():
                        logs.append(f"daphne log, {label} (last lines):\n{r['daphne_log']}")
            for name, _ in apps:
                summary = _summarise(got[name])
                figures.setdefault(mode, {}).setdefault(str(n), {})[name] = summary
                row, met = _latency_row(mode, n, name, summary)
                if name == "shiftlog":
                    all_met &= met
                rows.append(row)
    page_rows = []
    pages: dict = {}
    if not args.no_page:
        page_args = [
            "--page-events", str(args.page_events), "--page-sessions", str(args.page_sessions),
            "--page-requests", str(args.page_requests), "--page-warmup", str(args.page_warmup),
            "--page-seconds", str(args.page_seconds),
        ]  # fmt: skip
        for mode in modes:
            label = f"run page, {mode}, {args.page_events:,} events"
            try:
                r = _run_child("page", mode, page_args, label, args.asgi)
            except Exception as e:
                failures.append(f"{label}: {e}")
                page_rows.append(f"| GET /runs/<id>/ | {MODE_LABEL[mode]} | - | FAILED |")
                all_met = False
                continue
            for p in r["pages"]:
                for how, key in (("HTTP to daphne", "http_ms"), ("test Client", "client_ms")):
                    s = p[key]
                    met = s["p50"] is not None and s["p50"] <= PAGE_TARGET_MS
                    judged = key == "http_ms" and p["label"] == "events only"
                    if judged:
                        all_met &= met
                        pages.setdefault(mode, {})[p["label"]] = {
                            "p50_ms": s["p50"], "p99_ms": s["p99"], "met": met,
                        }  # fmt: skip
                    verdict = ("MET" if met else "NOT MET") if judged else (
                        "(met)" if met else "(not met)"
                    )  # fmt: skip
                    page_rows.append(
                        f"| GET /runs/<id>/, {how}, {p['label']} | {MODE_LABEL[mode]} | - "
                        f"| {p['events']:,} | {_ms(s['p50'])} | {_ms(s['p99'])} "
                        f"| {_ms(s['max'])} | - | - | p50 ≤ {PAGE_TARGET_MS:g} | {verdict} |"
                    )
                made = (
                    f"{p['events']:,} events made in {p['fill_s']:.1f} s"
                    if p["label"] == "events only"
                    else f"sessions and checkpoints added in {p['fill_s']:.1f} s"
                )
                details.append(
                    f"- run page, {mode}, {p['label']}: {made}; page {p['bytes'] / 1e3:.0f} kB, "
                    f"{p['queries']} queries; {p['http_ms']['n']} HTTP and "
                    f"{p['client_ms']['n']} test Client requests timed, after "
                    f"{args.page_warmup} warm-up each; child {r['wall_s']:.0f} s"
                )
    total = time.perf_counter() - started

    print("# Shiftlog live latency and run page time")
    print()
    print(
        f"- {machine()}; load average {load_start[0]:.2f} / {load_start[1]:.2f} / "
        f"{load_start[2]:.2f} (1/5/15 min) at start, {os.getloadavg()[0]:.2f} at the end"
    )
    print(f"- {_versions()}")
    if servers:
        print(f"- servers: PostgreSQL {servers['PostgreSQL']}, Redis {servers['Redis']}")
    print(
        f"- latency: one worker process, a commit every {args.interval_ms} ms "
        "([model.turn, tool.call], then [tool.result]), one daphne, the viewers in one "
        "asyncio process; latency = time.time() at receive - time.time() when the worker's "
        f"COMMIT returned; daphne app {args.asgi}; the reference: {PLAIN_ASGI} (the same "
        f"feed, one small frame per batch to every socket); medians of {args.repeat} "
        "interleaved repeats"
    )
    print()
    print(
        "| measurement | mode | viewers | events x repeats | p50 ms | p99 ms | max ms | lost "
        "| daphne CPU ms/event | target | met? |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows + page_rows:
        print(row)
    print()
    print(
        '"lost": (viewer, event) pairs never received. Run page rows: p50/p99/max over the '
        "timed requests; the target is judged on the HTTP row of the events-only run (the "
        "others are shown in parentheses)."
    )
    print()
    for line in details:
        print(line)
    for note in notes:
        print(f"- note: {note}")
    for text in logs:
        print()
        print(text.rstrip())
    if failures:
        print()
        print("## Failures")
        for f in failures:
            print()
            print(f)
    print()
    verdict = ("yes" if all_met else "no") if rows or page_rows else "nothing was measured"
    print(f"all targets met: {verdict}; benchmark total time: {total:.0f} s")
    if args.json:
        summary = {
            "benchmark": "live_latency",
            "machine": machine(),
            "load_average_start": list(load_start),
            "load_average_end": list(os.getloadavg()),
            "commits": args.commits,
            "interval_ms": args.interval_ms,
            "repeats": args.repeat,
            "targets": TARGETS,
            # latency[mode][viewers]["shiftlog" | "plain"]: medians over the repeats
            "latency": figures,
            "run_page": pages,
            "all_met": all_met if rows or page_rows else None,
            "failures": len(failures),
        }
        print(json.dumps(summary))  # the last line: one JSON object
    return 0 if not failures else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 viewers, fewer events/requests")
    parser.add_argument("--modes", default="embedded,redis", help="embedded,redis")
    parser.add_argument("--viewers", default=None, help="viewer counts (default 1,100)")
    parser.add_argument("--commits", type=int, default=None, help="commits per latency run")
    parser.add_argument("--interval-ms", type=int, default=30, help="ms between commits")
    parser.add_argument("--warmup", type=int, default=None, help="first commits not counted")
    parser.add_argument("--drain-seconds", type=float, default=10.0)
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="latency runs: give the watched run N earlier sessions and checkpoints first",
    )
    parser.add_argument("--no-page", action="store_true", help="skip the run page measurement")
    parser.add_argument(
        "--repeat", type=int, default=None, help="latency runs per case, interleaved (default 3)"
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the plain fan-out reference runs"
    )
    parser.add_argument("--json", action="store_true", help="last line: the figures as JSON")
    parser.add_argument("--page-events", type=int, default=100_000)
    parser.add_argument(
        "--page-sessions",
        type=int,
        default=None,
        help="sessions (and checkpoints) of the second page run; 0: only the events-only run",
    )
    parser.add_argument("--page-requests", type=int, default=None)
    parser.add_argument("--page-warmup", type=int, default=3)
    parser.add_argument(
        "--page-seconds", type=float, default=10.0, help="time budget per way of timing a page"
    )
    parser.add_argument(
        "--asgi",
        default=ASGI_APP,
        help="the application daphne serves (for A/B experiments; importable with PYTHONPATH)",
    )
    # Internal.
    parser.add_argument("--child", choices=["latency", "page"], help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--viewer-count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--huey-name", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--session-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    defaults = {
        "viewers": "1,10" if quick else "1,100",
        "commits": 100 if quick else 300,
        "repeat": 1 if quick else 3,
        "page_sessions": 0 if quick else 800,
        "page_requests": 10 if quick else 30,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.warmup is None:  # a tenth of the commits, at most 20: --commits 10 works too
        args.warmup = min(20, args.commits // 10)
    if args.commits <= args.warmup:
        parser.error("--commits must be more than --warmup")
    if args.worker:
        return worker(args)
    if args.child:
        body = _latency if args.child == "latency" else _page
        result = _in_child(body, args)
        print("RESULT " + json.dumps(result))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
