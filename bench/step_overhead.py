#!/usr/bin/env python
"""Shiftlog's own cost per agent step, and how it changes as a run's history grows.

    .venv/bin/python bench/step_overhead.py                 # 10,000 steps on SQLite (make bench)
    .venv/bin/python bench/step_overhead.py --db postgres   # the same on a throwaway PostgreSQL db
    .venv/bin/python bench/step_overhead.py --steps 2000 --quick
    .venv/bin/python bench/step_overhead.py --profile       # adds a cProfile of one long run
    .venv/bin/python bench/step_overhead.py --json          # last line: one JSON object of figures

What runs: the real runtime (agents.runtime.loop.drive) with the scripted provider (zero model
latency) and a trivial workspace tool (read_file of a ~200-byte file), so what is measured is the
harness: event log appends, counters, lease renewal, conversation bookkeeping, the tool sandbox's
input checks. One run per measurement, driven by drive(run_id, max_seconds=<large>) in a loop
until it is no longer running. Two scenarios:

  single    one session holds every step (max_turns_per_session and the input-token limit set
            out of reach): history grows inside one context window;
  rotating  50 turns per session: the harness asks for a handoff, the scripted provider
            synthesises one, the session ends, drive() returns "handoff" and the next drive()
            starts a new session (with a new slice: claim, load, rebuild). Synthesised handoff
            turns are model turns too and are counted as steps.

Per-step time comes from the model.turn events' created_at (one clock, microseconds): step k's
time is created_at(turn k) - created_at(turn k-1), which covers one whole cycle (record the turn,
run the tool, record its result, check limits, ask the provider, start recording the next turn).
Windows: steps 51-150 ("~100"), 951-1,050 ("~1,000"), 9,901-10,000 ("~10,000"), all taken from the
longest run. Database bytes come from separate runs of 100, 1,000 and N steps, each in a fresh
database, measured after the run ended (SQLite: PRAGMA wal_checkpoint(TRUNCATE), then the size of
the db file + -wal; PostgreSQL: pg_total_relation_size over the tables), minus the size measured
just after create_run (so migrations and the script copied into the run row are not counted).

Every measurement runs in a fresh child process with its own temporary SHIFTLOG_DATA_DIR (its
SQLite database and SqliteHuey file; the enqueued huey tasks are never consumed), which is deleted
afterwards. With --db postgres a database named shiftlog_bench_* is created on
postgres://postgres@127.0.0.1:5432 and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sandbox_calls  # bench/sandbox_calls.py, beside this script
from benchlib import machine  # bench/benchlib.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("SHIFTLOG_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
NOTES = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 5))

TARGET_MS_AT_10K = 0.5
TARGET_ROTATION_MS = 30.0
FLAT_RATIO = 1.5  # ms/step at the last window may be at most this times the first window
LINEAR_TOLERANCE = 0.25  # bytes/step of the longest run within 25% of the 1,000-step run


# --- child: one run in a fresh database -----------------------------------------------------
def _setup_django(data_dir: str, database_url: str | None, sqlite_sync: str = "NORMAL") -> None:
    os.environ["SHIFTLOG_DATA_DIR"] = data_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "shiftlog.settings"
    os.environ["SHIFTLOG_HUEY_IMMEDIATE"] = "false"
    os.environ["SHIFTLOG_DEBUG"] = "false"  # DEBUG would keep every query in memory
    os.environ.setdefault("SHIFTLOG_LOG_LEVEL", "WARNING")
    for name in (
        "SHIFTLOG_DB",
        "SHIFTLOG_HUEY_DB",
        "SHIFTLOG_WORKSPACES",
        "SHIFTLOG_BLOBS",
        "REDIS_URL",
        "DATABASE_URL",
    ):
        os.environ.pop(name, None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ["SHIFTLOG_SQLITE_SYNC"] = sqlite_sync
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _script(steps: int, tool: str) -> dict:
    inputs = {
        "read_file": {"path": "notes.txt"},
        "list_files": {"path": "."},
        "bash": {"command": "cat notes.txt"},
        "write_file": {"path": "out.txt", "content": NOTES},
    }
    turns = [
        {
            "text": f"Step {i}: reading the notes again.",
            "tool_calls": [{"name": tool, "input": inputs[tool]}],
        }
        for i in range(1, steps)
    ]
    turns.append(
        {"text": "Done.", "tool_calls": [{"name": "finish", "input": {"summary": "done"}}]}
    )
    return {"name": "bench", "description": "step overhead benchmark", "turns": turns}


def _db_bytes() -> int:
    from django.conf import settings
    from django.db import connection

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        name = Path(settings.DATABASES["default"]["NAME"])
        return sum(p.stat().st_size for p in (name, Path(f"{name}-wal")) if p.exists())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        )
        return int(cursor.fetchone()[0])


def _window(deltas: dict[int, float], first: int, last: int) -> dict | None:
    values = [deltas[k] for k in range(first, last + 1) if k in deltas]
    if len(values) < 2:
        return None
    ordered = sorted(values)
    return {
        "from": first,
        "to": min(last, max(deltas)),
        "n": len(values),
        "median_ms": statistics.median(values),
        "p90_ms": statistics.quantiles(values, n=10, method="inclusive")[8],
        "mean_ms": statistics.fmean(values),
        "max_ms": ordered[-1],
    }


def child(args: argparse.Namespace) -> dict:
    data_dir = tempfile.mkdtemp(prefix="shiftlog-bench-")
    try:
        _setup_django(data_dir, args.database_url, args.sqlite_sync)
        return _measure(args, Path(data_dir))
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(data_dir, ignore_errors=True)


def _durability() -> str:
    """How durable a commit is on the database measured, read back from the connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA synchronous")
            level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[cursor.fetchone()[0]]
            cursor.execute("PRAGMA journal_mode")
            mode = cursor.fetchone()[0]
            note = (
                "an fsync per commit: safe against a power loss"
                if level in {"FULL", "EXTRA"}
                else "no fsync per commit: safe against a crash, the last commits may be lost "
                "to a power loss"
            )
            return f"SQLite journal_mode={mode}, synchronous={level} ({note})"
        cursor.execute("SHOW fsync")
        fsync = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        commit = cursor.fetchone()[0]
        return f"PostgreSQL fsync={fsync}, synchronous_commit={commit}"


def _measure(args: argparse.Namespace, data_dir: Path) -> dict:
    from django.db import connection

    from agents.models import Event, EventKind, Run, RunStatus, Session
    from agents.runspec import RunSpec
    from agents.runtime.loop import drive
    from agents.services import create_run

    source = data_dir / "source"
    source.mkdir()
    (source / "notes.txt").write_text(NOTES)
    per_session = 1_000_000 if args.scenario == "single" else args.turns_per_session
    script = _script(args.steps, args.tool)
    run = create_run(
        RunSpec(
            goal="Benchmark: read the notes file over and over.",
            checks=["true"],
            script=script,
            script_name="bench",
            max_sessions=1_000_000,
            max_turns_per_session=per_session,
            max_input_tokens_per_session=2_000_000_000,
            workspace_from=source,
        )
    )
    baseline = _db_bytes()

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    slices = 0
    started_at = time.time()
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    while True:
        outcome = drive(run.pk, max_seconds=1e9)
        slices += 1
        if outcome.result == "not-claimed":
            raise SystemExit(f"run {run.pk}: drive() could not claim the run")
        if outcome.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
            break
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - started
    ended_at = time.time()

    final = _db_bytes()
    run.refresh_from_db()
    rows = list(
        Event.objects.filter(run_id=run.pk, kind=EventKind.MODEL_TURN)
        .order_by("seq")
        .values_list("created_at", "session_id")
    )
    times = [created.timestamp() for created, _ in rows]
    deltas = {k + 1: (times[k] - times[k - 1]) * 1000 for k in range(1, len(times))}
    windows = {}
    for label, (first, last) in {
        "100": (51, 150),
        "1000": (951, 1050),
        str(args.steps): (max(2, args.steps - 99), args.steps),
    }.items():
        if last <= len(times):
            windows[label] = _window(deltas, first, last)
    # The first step of each later session includes ending the slice and starting the next one.
    boundaries = [k + 1 for k in range(1, len(rows)) if rows[k][1] != rows[k - 1][1]]
    rotation = [deltas[k] for k in boundaries]
    # The session-end checks run beside the next session's first step (Slice.defer); its second
    # step waits for them when they are not done yet. A real model call hides them; this
    # benchmark's scripted model takes no time, so the wait shows here, and is reported.
    after = [deltas[k + 1] for k in boundaries if k + 1 in deltas]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(length(CAST(payload AS TEXT))), 0) "
            "FROM agents_event WHERE run_id = %s",
            [run.pk],
        )
        events, payload_chars = cursor.fetchone()
    result = {
        "scenario": args.scenario,
        "tool": args.tool,
        "steps": len(times),
        "scripted_turns": args.steps,
        "status": run.status,
        "status_reason": run.status_reason,
        "slices": slices,
        "sessions": Session.objects.filter(run_id=run.pk).count(),
        "events": events,
        "payload_chars": int(payload_chars),
        # The script as kept in the run row (each UPDATE of that row rewrites it on SQLite).
        "script_json_bytes": len(json.dumps(getattr(Run.objects.get(pk=run.pk), "script", None))),
        "wall_s": wall,
        "ms_per_step_wall": wall * 1000 / max(len(times), 1),
        "median_all_ms": statistics.median(deltas.values()) if deltas else None,
        "mean_all_ms": statistics.fmean(deltas.values()) if deltas else None,
        "max_ms": max(deltas.values()) if deltas else None,
        "before_first_turn_ms": (times[0] - started_at) * 1000 if times else None,
        "after_last_turn_ms": (ended_at - times[-1]) * 1000 if times else None,
        "windows": windows,
        "rotation_ms": {
            "n": len(rotation),
            "median_first10": statistics.median(rotation[:10]) if rotation else None,
            "median_last10": statistics.median(rotation[-10:]) if rotation else None,
            "median": statistics.median(rotation) if rotation else None,
            "next_step_median": statistics.median(after) if after else None,
            # Least-squares slope of rotation cost against the step it happened at.
            "slope_ms_per_1000_steps": (
                statistics.linear_regression(boundaries, rotation).slope * 1000
                if len(rotation) >= 3
                else None
            ),
        },
        "db_baseline_bytes": baseline,
        "db_final_bytes": final,
        "db_growth_bytes": final - baseline,
        "vendor": connection.vendor,
        "durability": _durability(),
    }
    if connection.vendor == "postgresql":
        result["server_version"] = connection.pg_version
    if profiler:
        import io
        import pstats

        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(args.profile_lines)
        stats.sort_stats("cumulative").print_stats(args.profile_lines)
        result["profile"] = out.getvalue()
    return result


# --- parent: orchestrate, print ------------------------------------------------------------
def _pg_available() -> tuple[bool, str]:
    try:
        import psycopg
    except ImportError:
        return False, "psycopg is not installed"
    try:
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3):
            return True, ""
    except Exception as e:  # any failure means "not answering"
        return False, f"{type(e).__name__}: {e}".strip()


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def _run_child(options: dict, db: str) -> dict:
    database_url = None
    db_name = None
    if db == "postgres":
        db_name = f"shiftlog_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        _pg_admin(f'CREATE DATABASE "{db_name}"')
        database_url = f"{PG_SERVER}/{db_name}"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--scenario",
        options["scenario"],
        "--steps",
        str(options["steps"]),
        "--tool",
        options["tool"],
        "--turns-per-session",
        str(options["turns_per_session"]),
    ]
    if options.get("profile"):
        command += ["--profile", "--profile-lines", str(options["profile_lines"])]
    if database_url:
        command += ["--database-url", database_url]
    command += ["--sqlite-sync", "FULL" if db == "sqlite-full" else "NORMAL"]
    label = f"{options['scenario']}/{options['tool']}/{options['steps']} steps on {db}"
    print(f"  running {label} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    finally:
        if db_name:
            _pg_admin(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    elapsed = time.perf_counter() - started
    print(f" {elapsed:.1f} s", file=sys.stderr)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"benchmark child failed: {label}")
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    if result["status"] != "succeeded":
        raise SystemExit(f"{label}: run ended {result['status']}: {result['status_reason']}")
    return result


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n < 1e8 else f"{n / 1e6:.0f} MB"


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _machine(db_results: list[dict]) -> list[str]:
    import sqlite3

    try:
        import django

        django_version = django.get_version()
    except ImportError:
        django_version = "?"
    lines = [
        machine(),
        f"python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"Django {django_version}",
    ]
    pg = {r.get("server_version") for r in db_results if r.get("server_version")}
    if pg:
        v = pg.pop()
        lines.append(f"PostgreSQL server {v // 10000}.{v % 10000}")
    return lines


def _report(
    db: str, scenario: str, longest: dict, sized: dict[int, dict], steps: int, lg: dict | None
) -> list[str]:
    out = []
    title = {
        "single": "one session holds every step",
        "rotating": f"sessions of {OPTIONS['turns_per_session']} turns, "
        "handoff and new slice between them",
    }[scenario]
    out.append(f"### {db}, {scenario}: {title} (tool: {longest['tool']})")
    out.append("")
    out.append(f"Durability: {longest['durability']}.")
    out.append("")
    out.append(
        "| step | window | ms/step median | p90 | mean | DB growth (fresh run of N steps) "
        "| bytes/step | LangGraph ms/step* | LangGraph bytes/step* |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    targets = sorted({(n, str(n)) for n in (100, 1_000, steps) if n <= steps})
    for n, key in targets:
        w = longest["windows"].get(key)
        sized_run = sized.get(n)
        growth = sized_run["db_growth_bytes"] if sized_run else None
        per = growth / sized_run["steps"] if sized_run else None
        lg_ms = lg["windows"].get(str(n)) if lg and lg.get("available") else None
        lg_bytes = lg["db_bytes_per_step"] if lg_ms is not None and lg["steps"] == n else None
        span = f"{w['from']:,}-{w['to']:,}" if w else "-"
        out.append(
            f"| ~{n:,} | {span} "
            f"| {_fmt(w and w['median_ms'])} | {_fmt(w and w['p90_ms'])} "
            f"| {_fmt(w and w['mean_ms'])} "
            f"| {_mb(growth) if growth is not None else '-'} "
            f"| {f'{per:,.0f}' if per is not None else '-'} "
            f"| {_fmt(lg_ms, 2) if lg_ms is not None else 'not measured'} "
            f"| {f'{lg_bytes:,.0f}' if lg_bytes is not None else '-'} |"
        )
    out.append("")
    out.append("*" + _langgraph_line(lg))
    out.append("")
    rot = longest["rotation_ms"]
    out.append(
        f"longest run: {longest['steps']:,} steps ({longest['scripted_turns']:,} scripted turns), "
        f"{longest['sessions']} session(s), {longest['slices']} drive() slice(s), "
        f"{longest['events']:,} events; wall {longest['wall_s']:.2f} s = "
        f"{longest['ms_per_step_wall']:.3f} ms/step overall; over all steps: median "
        f"{longest['median_all_ms']:.3f} ms, mean {longest['mean_all_ms']:.3f} ms, max "
        f"{longest['max_ms']:.1f} ms; {longest['before_first_turn_ms']:.0f} ms before the first "
        f"turn, {longest['after_last_turn_ms']:.0f} ms after the last (finish runs the check)"
    )
    if rot["n"]:
        out.append(
            f"session rotation (first step of a new session: handoff, session-end checkpoint, new "
            f"session started in the same slice): median {rot['median_first10']:.2f} ms over the "
            f"first 10 rotations, {rot['median_last10']:.2f} ms over the last 10 ({rot['n']} in "
            f"all); the step after it, which waits for the session-end checks still running "
            f"beside it (a real model call hides them; this scripted one takes no time): median "
            f"{rot['next_step_median']:.2f} ms"
            + (
                f"; fitted growth {rot['slope_ms_per_1000_steps']:+.3f} ms per 1,000 steps of "
                "history"
                if rot["slope_ms_per_1000_steps"] is not None
                else ""
            )
        )
    own = ", ".join(
        f"{n:,} steps: {r['ms_per_step_wall']:.3f} ms/step wall, "
        f"{r['db_growth_bytes'] / r['steps']:,.0f} B/step "
        f"(payload {r['payload_chars'] / r['steps']:,.0f} chars/step), script "
        f"{_mb(r['script_json_bytes'])} in the run row"
        for n, r in sorted(sized.items())
    )
    out.append(f"separate fresh-database runs: {own}")
    return out


def _langgraph_line(lg: dict | None) -> str:
    """What the LangGraph reference measured in this run (bench/langgraph_loop.py)."""
    if lg is None:
        return "LangGraph: not run (--langgraph-steps 0)."
    if not lg.get("available"):
        return f"LangGraph: not installed ({lg.get('why')}); install the bench extra to compare."
    windows = ", ".join(
        f"{_fmt(ms, 2)} ms at ~{int(n):,}" for n, ms in lg["windows"].items() if ms is not None
    )
    return (
        f"LangGraph + SqliteSaver ({lg['version']}; durability sync), the same loop shape, measured in this "
        f"run: {lg['steps']:,} steps, median step {windows}; {lg['ms_per_step_wall']:.2f} ms/step "
        f"wall, {lg['db_bytes_per_step']:,.0f} database bytes per step (it checkpoints the whole "
        "state every step, so both grow with history)."
    )


def _verdict(longest: dict, sized: dict[int, dict], steps: int, db: str) -> list[str]:
    lines = []
    first = longest["windows"].get("100")
    last = longest["windows"].get(str(steps))
    if last is None or first is None:
        return ["targets: not judged (need at least 150 steps)"]
    fast = last["median_ms"] < TARGET_MS_AT_10K
    ratio = last["median_ms"] / first["median_ms"]
    flat = ratio <= FLAT_RATIO
    lines.append(
        f"- under {TARGET_MS_AT_10K:g} ms/step at step {steps:,}: "
        f"{'MET' if fast else 'NOT MET'} (median {last['median_ms']:.3f} ms"
        f"{'' if db.startswith('sqlite') else '; the target is stated for SQLite'})"
    )
    lines.append(
        f"- flat in history length: {'MET' if flat else 'NOT MET'} (median at ~{steps:,} is "
        f"{ratio:.2f}x the median at ~100; allowed {FLAT_RATIO}x)"
    )
    smaller = [n for n in sorted(sized) if n < steps]
    if smaller:
        ref = 1_000 if 1_000 in smaller else smaller[-1]
        a = sized[ref]["db_growth_bytes"] / sized[ref]["steps"]
        b = sized[steps]["db_growth_bytes"] / sized[steps]["steps"]
        linear = abs(b - a) / a <= LINEAR_TOLERANCE
        lines.append(
            f"- database growth linear in steps: {'MET' if linear else 'NOT MET'} "
            f"({a:,.0f} B/step over {ref:,} steps, {b:,.0f} B/step over {steps:,}; allowed "
            f"±{LINEAR_TOLERANCE:.0%})"
        )
    else:
        lines.append("- database growth linear in steps: not judged (--quick: one size only)")
    rotation = longest["rotation_ms"]["median"]
    if rotation is not None:
        lines.append(
            f"- a session change under {TARGET_ROTATION_MS:g} ms: "
            f"{'MET' if rotation < TARGET_ROTATION_MS else 'NOT MET'} (median {rotation:.1f} ms "
            f"over {longest['rotation_ms']['n']} session changes)"
        )
    return lines


def _run_langgraph(steps: int) -> dict:
    """bench/langgraph_loop.py in a child process: its JSON line, or why there is none."""
    print(f"  running LangGraph, {steps} steps ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent / "langgraph_loop.py"),
            "--steps",
            str(steps),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"available": False, "why": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(lines[-1])


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _summary(results: dict, lg: dict | None, steps: int, load: dict) -> dict:
    """The figures as one JSON object (--json): SQLite first when it ran."""
    import sqlite3

    single = results.get(("sqlite", "single")) or next(
        (r for (db, sc), r in results.items() if sc == "single"), None
    )
    rotating = results.get(("sqlite", "rotating")) or next(
        (r for (db, sc), r in results.items() if sc == "rotating"), None
    )

    def window(run: dict | None, key: str) -> float | None:
        w = run and run["windows"].get(key)
        return w["median_ms"] if w else None

    out: dict = {
        "db": (single or rotating or {}).get("vendor"),
        "durability": (single or rotating or {}).get("durability"),
        # Each database (and SQLite sync level) measured: its durability and ms/step.
        "by_database": {
            f"{db}/{sc}": {
                "durability": r.get("durability"),
                "ms_per_step_first": window(r, "100"),
                "ms_per_step_last": window(r, str(steps)),
            }
            for (db, sc), r in results.items()
            if sc in {"single", "rotating"}
        },
        "steps": steps,
        "ms_per_step_first": window(single, "100"),
        "ms_per_step_mid": window(single, "1000"),
        "ms_per_step_last": window(single, str(steps)),
        "ms_per_step_wall": single and single["ms_per_step_wall"],
        "db_bytes_per_step": single and single["db_growth_bytes"] / single["steps"],
        "rotation_ms": rotating and rotating["rotation_ms"]["median"],
        "rotation_ms_first10": rotating and rotating["rotation_ms"]["median_first10"],
        "rotation_ms_last10": rotating and rotating["rotation_ms"]["median_last10"],
        "step_after_rotation_ms": rotating and rotating["rotation_ms"]["next_step_median"],
        "ms_per_step_rotating": rotating and rotating["ms_per_step_wall"],
        "ms_per_step_rotating_median": rotating and rotating["median_all_ms"],
        "langgraph_version": lg.get("version") if lg else None,
        "langgraph_steps": lg.get("steps") if lg else None,
        "langgraph_ms_per_step_wall": lg.get("ms_per_step_wall") if lg else None,
        "langgraph_db_bytes_per_step": lg.get("db_bytes_per_step") if lg else None,
    }
    for n in (100, 1_000, 2_000, (lg or {}).get("steps")):
        if n:
            out[f"langgraph_ms_per_step_{n}"] = ((lg or {}).get("windows") or {}).get(str(n))
    for side in ("write_file", "bash"):
        run = results.get(("sqlite", side))
        key = "100" if run and run["steps"] >= 150 else str(run and run["steps"])
        out[f"ms_per_step_{side}"] = window(run, key)
    try:
        import django

        django_version = django.get_version()
    except ImportError:
        django_version = None
    out["machine"] = {
        "cores": os.cpu_count(),
        "description": machine(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "django": django_version,
        "load_average_start": load["start"],
        "load_average_end": load["end"],
    }
    return out


OPTIONS: dict = {}


def _side(db: str, tool: str, steps: int) -> dict:
    return _run_child(
        {"scenario": "single", "steps": steps, "tool": tool, "turns_per_session": 50}, db
    )


def _side_line(db: str, run: dict, what: str) -> str:
    w = run["windows"].get("100") if run["steps"] >= 150 else run["windows"].get(str(run["steps"]))
    if not w:
        return f"side figure ({db}): {what}: run too short to measure"
    return (
        f"side figure ({db}): {what}, {run['steps']} steps, one session: median "
        f"{_fmt(w['median_ms'])} ms/step, p90 {_fmt(w['p90_ms'])} ms (steps {w['from']}-{w['to']})"
    )


def parent(args: argparse.Namespace) -> int:
    OPTIONS.update(turns_per_session=args.turns_per_session, profile_lines=args.profile_lines)
    load = {"start": _load()}
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if "sqlite" in dbs and args.sqlite_sync != "NORMAL":
        # "sqlite-full": SQLite with SHIFTLOG_SQLITE_SYNC=FULL (an fsync per commit).
        at = dbs.index("sqlite")
        dbs[at : at + 1] = (
            ["sqlite", "sqlite-full"] if args.sqlite_sync == "both" else ["sqlite-full"]
        )
    notes = []
    if "postgres" in dbs:
        ok, why = _pg_available()
        if not ok:
            notes.append(f"PostgreSQL at {PG_SERVER} did not answer ({why}); skipped it.")
            dbs.remove("postgres")
    scenarios = ["single", "rotating"] if args.scenario == "both" else [args.scenario]
    sizes = sorted({n for n in (100, 1_000, args.steps) if n <= args.steps})
    if args.quick:
        sizes = [args.steps]
    started = time.perf_counter()
    all_results = []
    measured: dict[tuple[str, str], dict] = {}
    runs: list[tuple[str, str, dict, dict]] = []
    side_lines = []
    for db in dbs:
        for scenario in scenarios:
            sized = {}
            for n in sizes:
                sized[n] = _run_child(
                    {
                        "scenario": scenario,
                        "steps": n,
                        "tool": args.tool,
                        "turns_per_session": args.turns_per_session,
                    },
                    db,
                )
                all_results.append(sized[n])
            measured[(db, scenario)] = sized[args.steps]
            runs.append((db, scenario, sized[args.steps], sized))
        if args.write_steps:
            write = measured[(db, "write_file")] = _side(db, "write_file", args.write_steps)
            all_results.append(write)
            side_lines += [
                _side_line(
                    db,
                    write,
                    "write_file as the tool (a call with an effect: its tool.call "
                    "commits before it runs, its result after: two transactions a step)",
                ),
                "",
            ]
        if args.bash_steps:
            bash = measured[(db, "bash")] = _side(db, "bash", args.bash_steps)
            all_results.append(bash)
            side_lines += [
                _side_line(
                    db,
                    bash,
                    "bash `cat notes.txt` as the tool (the sandboxed process spawn "
                    "dominates, which is why the main figure uses read_file)",
                ),
                "",
            ]
    lg = _run_langgraph(args.langgraph_steps) if args.langgraph_steps else None
    sections = []
    verdicts = []
    for db, scenario, longest, sized in runs:
        sections += [*_report(db, scenario, longest, sized, args.steps, lg), ""]
        verdicts.append(f"{db}, {scenario}:")
        verdicts += _verdict(longest, sized, args.steps, db)
    sections += side_lines
    profile_text = ""
    if args.profile:
        prof = _run_child(
            {
                "scenario": "single",
                "steps": args.steps,
                "tool": args.tool,
                "turns_per_session": args.turns_per_session,
                "profile": True,
                "profile_lines": args.profile_lines,
            },
            dbs[0],
        )
        profile_text = prof["profile"]
    sandbox = None
    if args.tool == "bash" and args.sandbox_calls:
        # bubblewrap's own cost beside the sandbox call, interleaved (bench/sandbox_calls.py).
        sandbox = sandbox_calls.measure(calls=args.sandbox_calls, rounds=2)
        sections += [*sandbox_calls.table(sandbox), ""]
    total = time.perf_counter() - started
    load["end"] = _load()

    print(f"# Shiftlog step overhead: {args.steps:,} steps, scripted provider, tool {args.tool}")
    print()
    for line in _machine(all_results):
        print(f"- {line}")
    print(f"- load average (1, 5, 15 min): {load['start']} at the start, {load['end']} at the end")
    print()
    for note in notes:
        print(note)
        print()
    print(
        "ms/step: created_at(model.turn k) - created_at(model.turn k-1) over the window, from "
        f"the {args.steps:,}-step run. DB growth: separate runs of "
        f"{', '.join(f'{n:,}' for n in sizes)} steps, each in a fresh database, measured after "
        "the run (SQLite: after PRAGMA wal_checkpoint(TRUNCATE), db + -wal file; PostgreSQL: "
        "pg_total_relation_size of the tables), minus the size right after create_run."
    )
    print()
    for line in sections:
        print(line)
    print(
        f"## Targets (flat in history length, < {TARGET_MS_AT_10K:g} ms/step at step 10,000 on "
        f"SQLite, linear database growth, a session change < {TARGET_ROTATION_MS:g} ms)"
    )
    print()
    for line in verdicts:
        print(line)
    print()
    print(f"benchmark total time: {total:.1f} s")
    if profile_text:
        print()
        print("## cProfile of one single-session run (profiling slows it down)")
        print()
        print(profile_text)
    if args.json:
        summary = _summary(measured, lg, args.steps, load)
        if args.tool == "bash":
            single = measured.get((dbs[0], "single")) if dbs else None
            summary["bash_step_median_ms"] = single and single["median_all_ms"]
            summary["sandbox_calls"] = sandbox
        print(json.dumps(summary))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps in the longest run")
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--scenario", choices=["single", "rotating", "both"], default="both")
    parser.add_argument(
        "--tool",
        choices=["read_file", "list_files", "bash", "write_file"],
        default="read_file",
        help="the trivial tool every step calls (bash: process spawn dominates)",
    )
    parser.add_argument(
        "--turns-per-session", type=int, default=50, help="session length in the rotating scenario"
    )
    parser.add_argument(
        "--bash-steps", type=int, default=300, help="steps of the bash side figure (0: skip it)"
    )
    parser.add_argument(
        "--write-steps",
        type=int,
        default=1000,
        help="steps of the write_file side figure (0: skip it)",
    )
    parser.add_argument(
        "--langgraph-steps",
        type=int,
        default=2000,
        help="steps of the LangGraph + SqliteSaver reference run (0: skip it)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the figures as one JSON object, last"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the longest run per scenario (no 100/1,000-step size runs)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile one single-session run with cProfile"
    )
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument(
        "--sandbox-calls",
        type=int,
        default=15,
        help="with --tool bash: sandbox calls per row and round beside bubblewrap's (0: skip)",
    )
    parser.add_argument(
        "--sqlite-sync",
        type=str.upper,
        choices=["NORMAL", "FULL", "BOTH"],
        default="NORMAL",
        help="SQLite's SHIFTLOG_SQLITE_SYNC for the measurement (both: a row at each level)",
    )
    # Internal: one measurement in this process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sqlite_sync = "both" if args.sqlite_sync == "BOTH" else args.sqlite_sync
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    if args.child:
        result = child(args)
        print("RESULT " + json.dumps(result))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
