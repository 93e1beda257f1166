"""How long `timeline.json` takes on a long run, on SQLite: the first request (which builds the
run's index in the web process) and later ones, for the whole run and for narrower windows.

    .venv/bin/python bench/timeline.py                  # 100,000 events
    .venv/bin/python bench/timeline.py --events 20000 --repeat 5

A fresh data folder (deleted at the end) holds a SQLite database with one run whose log is written
straight into the events table (tests/timeline_runs.py: sessions of 120 events, turns of 2-5 s,
tool calls, errors, checkpoints, waits). Requests go through Django's test client in this process,
so the figures are the view's own time (the `server_ms` the answer carries), no network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from benchlib import machine  # bench/benchlib.py, beside this script  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=10, help="timed requests per row")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="shiftlog-bench-timeline-")
    try:
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
                "SHIFTLOG_DATA_DIR": data_dir,
                "SHIFTLOG_HUEY_IMMEDIATE": "false",
                "SHIFTLOG_DEBUG": "false",
                "SHIFTLOG_LOG_LEVEL": "WARNING",
            }
        )
        os.environ.pop("DATABASE_URL", None)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return run(args)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run(args) -> int:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from agents.models import Run
    from dashboard import timeline_index
    from tests.timeline_runs import big_run

    print(machine())
    print(f"load average: {os.getloadavg()[0]:.2f} (other work on the machine slows every row)")
    user = get_user_model().objects.create_user("bench", is_superuser=True)
    run_row = Run.objects.create(goal="bench", model="claude-test", created_by=user)
    t0 = time.perf_counter()
    big_run(run_row, args.events)
    print(f"run of {args.events:,} events written in {time.perf_counter() - t0:.1f} s\n")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    last = args.events
    mid = last // 2

    def get(query: str) -> dict:
        cpu = time.process_time()
        response = client.get(f"/runs/{run_row.pk}/timeline.json?{query}")
        assert response.status_code == 200, response.content[:300]
        answer = response.json()
        answer["cpu_ms"] = (time.process_time() - cpu) * 1000  # this process's CPU, not waits
        return answer

    rows = []
    first = get("width=1200")
    rows.append(("first request (builds the index), whole run, 1200 px", [first], first))
    cases = [
        ("whole run, 1200 px", "width=1200"),
        ("whole run, 4000 px", "width=4000"),
        ("30,000-event window, 1200 px", f"from={mid - 15_000}&to={mid + 15_000}&width=1200"),
        ("2,000-event window, 1200 px", f"from={mid - 1_000}&to={mid + 1_000}&width=1200"),
        ("800-event window, 1200 px", f"from={mid - 400}&to={mid + 400}&width=1200"),
    ]
    for label, query in cases:
        answers = [get(query) for _ in range(args.repeat)]
        rows.append((label, answers, answers[-1]))

    print("server_ms: the view's wall time; cpu ms: this process's CPU time for the request")
    print(f"{'request':<55} {'median ms':>10} {'max ms':>8} {'cpu ms':>7}  mode     items  size")
    for label, answers, answer in rows:
        times = [a["server_ms"] for a in answers]
        cpu = statistics.median(a["cpu_ms"] for a in answers)
        w = answer["window"]
        size = len(str(answer).encode()) // 1024
        print(
            f"{label:<55} {statistics.median(times):>10.1f} {max(times):>8.1f} {cpu:>7.1f}  "
            f"{w['mode']:<8} {w['counts']['items']:>6}  ~{size} KB"
        )
    with timeline_index.LOCK:
        index = timeline_index.index_for(Run.objects.get(pk=run_row.pk))
    print(f"\nindex in memory: ~{index.nbytes() / 2**20:.1f} MB for {args.events:,} events "
          f"(cap {timeline_index.MEMORY_CAP_BYTES / 2**20:.0f} MB a process)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
