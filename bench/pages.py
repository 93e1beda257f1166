"""How long the long lists take: the runs list with 10,000 runs (first, middle and last page) and
a run page with 800 sessions, 800 checkpoints and 100,000 events (the page, its older pages of
sessions, checkpoints and events, and what "show all" asked for).

    .venv/bin/python bench/pages.py                      # SQLite
    .venv/bin/python bench/pages.py --db postgres
    .venv/bin/python bench/pages.py --before main        # also the code of a git ref, side by side
    .venv/bin/python bench/pages.py --runs 2000 --events 20000 --repeat 3

Each code tree is timed in a worker process of its own, with its own temporary data folder (and,
with --db postgres, its own database, dropped afterwards), its schema made by that tree's own
migrations and the same rows written straight into the tables. The parent asks the workers for
one request at a time, in turn (interleaved), and prints medians. A request goes through Django's
test Client in the worker (the view's own time, no network), and with --http also over HTTP through
a daphne of that tree; the query count is taken from a separate, untimed request. `--before REF` exports REF with `git archive` into a temporary folder:
its URLs are the old ones (?page=N, ?all=1), which the worker knows. The last line is one JSON
object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import machine, pg_admin, pg_available  # bench/benchlib.py  # noqa: E402

GOAL_RUNS = 50.0  # ms, any page of the runs list
GOAL_RUN_PAGE = 200.0  # ms, the run page and each of its pages


# --- the parent ------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=800)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per case and tree")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--before", metavar="REF", help="also time this git ref's code")
    parser.add_argument("--http", action="store_true",
                        help="also time each page over HTTP through a daphne of each tree")  # fmt: skip
    parser.add_argument("--worker", metavar="CODE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    print(machine())
    print(f"load average: {os.getloadavg()[0]:.2f} (other work on the machine slows every row)")
    if args.db == "postgres":
        ok, why = pg_available()
        if not ok:
            print(f"PostgreSQL is not answering: {why}")
            return 2
    scratch = Path(tempfile.mkdtemp(prefix="shiftlog-bench-pages-"))
    trees = {"now": ROOT}
    workers: dict[str, Worker] = {}
    try:
        if args.before:
            code = scratch / "before"
            code.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True)
            trees["before"] = code
        for name, code in trees.items():
            workers[name] = Worker(name, code, scratch / f"data-{name}", args)
        for w in workers.values():
            w.wait_ready()
        return report(args, workers)
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(scratch, ignore_errors=True)


class Worker:
    """One code tree's worker process: it builds the rows, then times one named case per line."""

    def __init__(self, name: str, code: Path, data: Path, args) -> None:
        self.name, self.db_name = name, ""
        data.mkdir()
        env = {**os.environ, "SHIFTLOG_DATA_DIR": str(data), "PYTHONPATH": str(code)}
        env.pop("DATABASE_URL", None)
        if args.db == "postgres":
            self.db_name = f"shiftlog_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            pg_admin(f'CREATE DATABASE "{self.db_name}"')
            from benchlib import PG_SERVER

            env["DATABASE_URL"] = f"{PG_SERVER}/{self.db_name}"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(code)]
        cmd += ["--runs", str(args.runs), "--sessions", str(args.sessions)]
        cmd += ["--events", str(args.events)] + (["--http"] if args.http else [])
        self.proc = subprocess.Popen(
            cmd, cwd=code, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.cases: dict[str, str] = {}

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            raise RuntimeError(f"worker {self.name} did not start: {line!r}")
        ready = json.loads(line[6:])
        self.cases, self.build_s = ready["cases"], ready["build_s"]
        print(f"{self.name}: rows written in {self.build_s:.1f} s")

    def ask(self, case: str, *, count: bool = False, http: bool = False) -> dict:
        self.proc.stdin.write(json.dumps({"case": case, "count": count, "http": http}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.db_name:
            pg_admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')


def report(args, workers: dict[str, Worker]) -> int:
    names = list(workers)
    cases = list(workers["now"].cases)
    times: dict[tuple[str, str], list[float]] = {(n, c): [] for n in names for c in cases}
    http: dict[tuple[str, str], list[float]] = {(n, c): [] for n in names for c in cases}
    counts: dict[tuple[str, str], dict] = {}
    for case in cases:
        for n in names:
            if case in workers[n].cases:
                counts[n, case] = workers[n].ask(case, count=True)  # also warms the case up
    for _ in range(args.repeat):
        for case in cases:
            for n in names:  # interleaved: each tree's request right after the other's
                if case in workers[n].cases:
                    times[n, case].append(workers[n].ask(case)["ms"])
                    if args.http:
                        http[n, case].append(workers[n].ask(case, http=True)["ms"])

    print(f"\n{args.db}, {args.runs:,} runs; one run of {args.sessions} sessions, "
          f"{args.sessions} checkpoints, {args.events:,} events; medians of {args.repeat}")  # fmt: skip
    http_head = (lambda n: f"{n + ' http':>12}") if args.http else (lambda n: "")
    head = f"{'case':<44}" + "".join(
        f"{n + ' ms':>12}{http_head(n)}{'queries':>8}{'KB':>6}" for n in names
    )
    print(head)
    out: dict = {"db": args.db, "runs": args.runs, "sessions": args.sessions,
                 "events": args.events, "repeat": args.repeat,
                 "load_average": round(os.getloadavg()[0], 2), "cases": {}}  # fmt: skip
    for case in cases:
        line = f"{case:<44}"
        for n in names:
            if (n, case) not in counts:
                line += f"{'-':>12}" + " " * (12 if args.http else 0) + " " * 14
                continue
            med = statistics.median(times[n, case])
            c = counts[n, case]
            over_http = statistics.median(http[n, case]) if args.http else None
            line += f"{med:>12.1f}" + (f"{over_http:>12.1f}" if args.http else "")
            line += f"{c['queries']:>8}{c['bytes'] // 1024:>6}"
            out["cases"].setdefault(case, {})[n] = {
                "ms": round(med, 1),
                **({"http_ms": round(over_http, 1)} if args.http else {}),
                "queries": c["queries"],
                "status": c["status"],
                "url": workers[n].cases[case],
            }
        print(line)
    now = {c: v["now"]["ms"] for c, v in out["cases"].items() if "now" in v}
    runs_worst = max(v for c, v in now.items() if c.startswith("runs list"))
    page_worst = max(v for c, v in now.items() if c.startswith("run page"))
    out["runs_list_worst_ms"] = runs_worst
    out["run_page_worst_ms"] = page_worst
    out["goals_met"] = runs_worst <= GOAL_RUNS and page_worst <= GOAL_RUN_PAGE
    print(f"\nworst runs list page {runs_worst:.1f} ms (goal ≤ {GOAL_RUNS:.0f}); worst run page "
          f"request {page_worst:.1f} ms (goal ≤ {GOAL_RUN_PAGE:.0f}): "
          f"{'met' if out['goals_met'] else 'NOT met'}")  # fmt: skip
    print(json.dumps(out))
    return 0


# --- the worker ------------------------------------------------------------------------------
def worker(args) -> int:
    code = Path(args.worker)
    sys.path.insert(0, str(code))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
            "SHIFTLOG_HUEY_IMMEDIATE": "false",
            "SHIFTLOG_DEBUG": "false",
            "SHIFTLOG_LOG_LEVEL": "WARNING",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    user, big = build(args)
    build_s = time.perf_counter() - t0
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    cases = urls(big, args)
    server = Daphne(client.cookies["sessionid"].value) if args.http else None
    print("ready " + json.dumps({"cases": cases, "build_s": build_s}), flush=True)
    try:
        serve_requests(client, cases, server)
    finally:
        if server:
            server.stop()
    return 0


def serve_requests(client, cases: dict[str, str], server: Daphne | None) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for line in sys.stdin:
        ask = json.loads(line)
        url = cases[ask["case"]]
        if ask["http"]:
            answer = server.get(url)
        elif ask["count"]:
            with CaptureQueriesContext(connection) as queries:
                response = client.get(url)
            answer = {"queries": len(queries), "status": response.status_code,
                      "bytes": len(response.content)}  # fmt: skip
        else:
            t = time.perf_counter()
            response = client.get(url)
            answer = {"ms": (time.perf_counter() - t) * 1000, "status": response.status_code}
        print(json.dumps(answer), flush=True)


class Daphne:
    """This tree's web app under daphne, on a free port, with the worker's data; requests carry
    the test client's session cookie. The time is the whole HTTP request over loopback."""

    def __init__(self, session: str) -> None:
        import socket
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "shiftlog.asgi:application"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.opener = urllib.request.build_opener()
        self.opener.addheaders = [("Cookie", f"sessionid={session}")]
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("daphne did not start") from None
                time.sleep(0.2)

    def get(self, url: str) -> dict:
        t = time.perf_counter()
        with self.opener.open(f"http://127.0.0.1:{self.port}{url}", timeout=60) as r:
            r.read()
            return {"ms": (time.perf_counter() - t) * 1000, "status": r.status}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def build(args):
    """A superuser, `args.runs` runs (a session, two events and now and then an approval each;
    runs made in the same second share a created_at, as a burst of API calls would) and one big
    run: `args.sessions` sessions over `args.events` events, a checkpoint at each session's end."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from agents.models import Approval, Checkpoint, Event, Run, Session
    from tests.timeline_runs import T0, big_run

    user = get_user_model().objects.create_user("bench", is_superuser=True)
    statuses = ["succeeded", "failed", "running", "paused", "cancelled"]
    with transaction.atomic():
        runs = Run.objects.bulk_create(
            Run(
                goal=f"bench run {i}: {'tidy the docs' if i % 7 else 'fix the flaky test'}",
                model="claude-test",
                status=statuses[i % len(statuses)],
                created_by=user,
                created_at=T0 + timedelta(seconds=i // 3),
                last_seq=2,
            )
            for i in range(args.runs - 1)
        )
        ids = [r.pk for r in runs] or list(Run.objects.order_by("pk").values_list("pk", flat=True))
        Session.objects.bulk_create(Session(run_id=i, index=1, started_at=T0) for i in ids)
        when = Event._meta.get_field("created_at")
        sql = (
            f"INSERT INTO {Event._meta.db_table} (run_id, seq, session_id, kind, actor, payload, "
            "created_at) VALUES (%s, %s, NULL, %s, 'harness', '{}', %s)"
        )
        rows = []
        for n, i in enumerate(ids):
            at = when.get_db_prep_save(T0 + timedelta(seconds=n // 3 + 1), connection)
            rows += [(i, 1, "run.created", at), (i, 2, "run.status", at)]
        with connection.cursor() as cursor:
            cursor.executemany(sql, rows)
        Approval.objects.bulk_create(
            Approval(run_id=i, tool_use_id="t", tool_name="bash") for i in ids[::50]
        )
    with transaction.atomic():
        big = Run.objects.create(
            goal="the long one", model="claude-test", created_by=user, created_at=T0,
            status="running",
        )  # fmt: skip
        big_run(big, args.events, per_session=max(8, args.events // args.sessions))
        sessions = list(Session.objects.filter(run=big).order_by("index"))
        ends = dict(
            Event.objects.filter(run=big, kind="session.ended").values_list("session_id", "seq")
        )
        Checkpoint.objects.bulk_create(
            Checkpoint(
                run=big,
                number=n,
                session=s,
                seq=ends.get(s.pk, s.first_seq),
                kind="session_end",
                tree="0" * 64,
                created_at=T0,
            )
            for n, s in enumerate(sessions, 1)
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # the planner's statistics, as a live database has them
    big.refresh_from_db()
    return user, big


def urls(big, args) -> dict[str, str]:
    """The cases, as this tree's URLs: the new code's cursors, or the old ?page=N and ?all=1."""
    from agents.models import Run, Session

    try:
        from agents import pages  # the keyset pages (absent in the code before them)
    except ImportError:
        pages = None
    run_url = f"/runs/{big.pk}/"
    mid_seq = big.last_seq // 2
    if pages is None:
        n = -(-Run.objects.count() // 25)
        return {
            "runs list, first page": "/",
            "runs list, middle page": f"/?page={n // 2}",
            "runs list, last page": f"/?page={n}",
            "runs list, search, first page": "/?q=flaky",
            "runs list, approvals waiting": "/?approvals=waiting",
            "runs list, stuck": "/?stuck=1",
            "runs list, spent today (none match)": "/?since=today",
            "run page": run_url,
            'run page, "show all"': f"{run_url}?all=1",
            "run page, older events (middle)": f"/runs/{big.pk}/events/?before={mid_seq}",
            "run page, older events (oldest)": f"/runs/{big.pk}/events/?before=30",
        }
    middle = Run.objects.for_list()[Run.objects.count() // 2]
    mid_session = Session.objects.filter(run=big).count() // 2
    return {
        "runs list, first page": "/",
        "runs list, middle page": f"/?after={pages.runs_cursor(middle)}",
        "runs list, last page": "/?oldest=1",
        "runs list, search, first page": "/?q=flaky",
        "runs list, approvals waiting": "/?approvals=waiting",
        "runs list, stuck": "/?stuck=1",
        "runs list, spent today (none match)": "/?since=today",
        "run page": run_url,
        'run page, "show all"': f"{run_url}?all=1",
        "run page, older sessions (middle)": f"/runs/{big.pk}/sessions/?before={mid_session}",
        "run page, older sessions (oldest)": f"/runs/{big.pk}/sessions/?before=26",
        "run page, older checkpoints (middle)": (
            f"/runs/{big.pk}/checkpoints/?before={mid_session}"
        ),
        "run page, older checkpoints (oldest)": f"/runs/{big.pk}/checkpoints/?before=26",
        "run page, older events (middle)": f"/runs/{big.pk}/events/?before={mid_seq}",
        "run page, older events (oldest)": f"/runs/{big.pk}/events/?before=30",
    }


if __name__ == "__main__":
    sys.exit(main())
