#!/usr/bin/env python
"""How long a person's approval takes to reach the agent waiting on it: p50 and p99.

    .venv/bin/python bench/approval_latency.py                    # 20 decisions of each kind
    .venv/bin/python bench/approval_latency.py --compare-tree ../old --n 10
    .venv/bin/python bench/approval_latency.py --json             # last line: one JSON object

A real `manage.py serve` (daphne + a huey consumer of 2 threads) on a fresh SQLite data folder;
this process is the person, deciding with agents.approvals.decide_as from another process than
the server's (as a second web process would; the server's own process deciding is no slower).

  own runs   a scripted run whose every step is a bash call the gate asks a person about
             (`rm -rf build/tmpN`). The worker parks the run (no thread, no task) while it
             waits; after --think seconds the person approves. Measured: the decision's commit
             (its approval.decided event) -> the first event a worker writes after it (the run
             taken up again: to_worker), -> the approved call's tool.call (the step starting:
             to_call), and -> its tool.result (to_result: the sandboxed command included).
  external   an external agent's risky call (POST /api/v1/runs/R/tool-calls) that asks; the
             agent long-polls GET /api/v1/tool-calls/C?wait=30 over HTTP while the person
             decides after --think seconds. Measured: the decision's commit -> the agent holding
             the answer (to_agent), and -> the agent's read taking the run up again, its
             `run.status` -> running (to_read: the wake and the read's start).

Both are on one clock (this machine's; event times are stored in microseconds). With
--compare-tree the same runs in another checkout's code (its server, its worker), alternately,
so a change is measured before and after in one run; the load average is printed beside.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE="shiftlog.settings",
        SHIFTLOG_DATA_DIR=str(data),
        SHIFTLOG_HUEY_IMMEDIATE="false",
        SHIFTLOG_DEBUG="false",
        SHIFTLOG_LOG_LEVEL="WARNING",
    )
    return env


def _q(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


# --- child: one server, both measurements ---------------------------------------------------
def child(tree: Path, n: int, think: float) -> dict:
    data = Path(tempfile.mkdtemp(prefix="shiftlog-bench-", dir="/var/tmp"))
    os.environ.update(_env(data))
    sys.path.insert(0, str(tree))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    port = _port()
    log = (data / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"],
        cwd=tree,
        env=_env(data),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/accounts/login/")
        own = _own_runs(n, think)
        external = _external(base, n, think)
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        from django.db import connections

        connections.close_all()
        shutil.rmtree(data, ignore_errors=True)
    return {"own": own, "external": external}


def _wait_http(url: str, within: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer at {url}")


def _person():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(
        username="bench-person", defaults={"is_superuser": True, "is_staff": True}
    )
    return user


def _pending(run_id: int, within: float = 120):
    from agents.models.approvals import Approval

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = Approval.objects.filter(run_id=run_id, status="pending").order_by("pk").first()
        if found is not None:
            return found
        time.sleep(0.005)
    raise SystemExit(f"run {run_id}: no approval was asked for")


def _own_runs(n: int, think: float) -> dict:
    from agents.approvals import decide_as
    from agents.models import Event, EventKind
    from agents.runspec import RunSpec
    from agents.services import create_run

    person = _person()
    turns = [
        {
            "text": f"Step {i}",
            "tool_calls": [{"name": "bash", "input": {"command": f"rm -rf build/tmp{i}"}}],
        }
        for i in range(n)
    ]
    turns.append(
        {"text": "Done.", "tool_calls": [{"name": "finish", "input": {"summary": "done"}}]}
    )
    run = create_run(
        RunSpec(
            goal="Benchmark: every step waits for a person.",
            checks=["true"],
            script={"name": "bench", "description": "approval latency", "turns": turns},
            script_name="bench",
        ),
        created_by=person,
    )
    to_worker, to_call, to_result = [], [], []
    for _ in range(n):
        approval = _pending(run.pk)
        time.sleep(think)  # the worker has parked the run meanwhile
        decide_as(approval.pk, user=person, decision="approve")
        decided = (
            Event.objects.filter(run_id=run.pk, kind=EventKind.APPROVAL_DECIDED)
            .order_by("-seq")
            .first()
        )
        deadline = time.monotonic() + 60
        while True:
            after = list(
                Event.objects.filter(run_id=run.pk, seq__gt=decided.seq)
                .order_by("seq")
                .values_list("kind", "actor", "created_at")
            )
            result = [t for kind, _, t in after if kind == EventKind.TOOL_RESULT]
            if result:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"run {run.pk}: the approved call did not run")
            time.sleep(0.005)
        worker = next(t for _, actor, t in after if actor.startswith("worker:"))
        call = next(t for kind, _, t in after if kind == EventKind.TOOL_CALL)
        for into, at in ((to_worker, worker), (to_call, call), (to_result, result[0])):
            into.append((at - decided.created_at).total_seconds() * 1000)
    return {"to_worker_ms": to_worker, "to_call_ms": to_call, "to_result_ms": to_result}


def _external(base: str, n: int, think: float) -> dict:
    import httpx

    from agents.approvals import decide_as
    from agents.models import Event, EventKind
    from api.models import ApiToken

    person = _person()
    _, token = ApiToken.issue(person, ["read", "write"], name="bench")
    agent = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    run = agent.post(
        "/runs", json={"goal": "approval latency", "checks": ["true"], "provider": "external"}
    ).json()
    latencies: list[float] = []
    to_read: list[float] = []
    for i in range(n):
        call = agent.post(
            f"/runs/{run['id']}/tool-calls",
            json={"tool": "Bash", "input": {"command": f"rm -rf build/tmp{i}"}},
        ).json()
        assert call["decision"] == "ask", call
        answers: list[tuple[float, dict]] = []

        def wait_for_it(c=call, got=answers) -> None:
            answer = agent.get(f"/tool-calls/{c['id']}", params={"wait": 30}).json()
            got.append((time.time(), answer))  # when the agent holds it

        poll = threading.Thread(target=wait_for_it)
        poll.start()
        time.sleep(think)
        decide_as(call["approval"], user=person, decision="approve")
        poll.join(60)
        got_at, answer = answers[0]
        assert answer["decision"] == "approved", answer
        decided = (
            Event.objects.filter(run_id=run["id"], kind=EventKind.APPROVAL_DECIDED)
            .order_by("-seq")
            .first()
        )
        latencies.append((got_at - decided.created_at.timestamp()) * 1000)
        # Where the time goes: the agent's read taking the run up again (its run.status ->
        # running), written once the wake has come and the read has begun.
        taken_up = (
            Event.objects.filter(
                run_id=run["id"],
                seq__gt=decided.seq,
                kind=EventKind.RUN_STATUS,
                payload__to="running",
            )
            .order_by("seq")
            .first()
        )
        if taken_up is not None:
            to_read.append((taken_up.created_at - decided.created_at).total_seconds() * 1000)
        agent.post(f"/tool-calls/{call['id']}/result", json={"output": ""})
    return {"to_agent_ms": latencies, "to_read_ms": to_read}


# --- parent ---------------------------------------------------------------------------------
def _one(tree: Path, n: int, think: float) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), "--n", str(n), "--think", str(think)],
        capture_output=True,
        text=True,
        cwd=tree,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"benchmark child failed in {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="decisions of each kind per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--think", type=float, default=1.0, help="seconds before each decision")
    parser.add_argument("--compare-tree", type=Path, help="another checkout, measured alike")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.n, args.think)))
        return 0
    trees = {"this": ROOT} | ({"compared": args.compare_tree} if args.compare_tree else {})
    load_start = [round(x, 2) for x in os.getloadavg()]
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            got = _one(tree.resolve(), args.n, args.think)
            for kind, rows in got.items():
                for what, values in rows.items():
                    samples[name].setdefault(f"{kind} {what}", []).extend(values)
    load_end = [round(x, 2) for x in os.getloadavg()]
    out: dict = {"load_average_start": load_start, "load_average_end": load_end}
    print(
        f"# Approval -> waiting agent, {args.n * args.rounds} decisions of each kind, "
        f"{args.think:g} s after the ask; load average {load_start} at the start, "
        f"{load_end} at the end"
    )
    print()
    print("| tree | what | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for name, rows in samples.items():
        out[name] = {}
        for what, values in rows.items():
            p50, p99 = statistics.median(values), _q(values, 0.99)
            out[name][what] = {
                "p50_ms": p50,
                "p99_ms": p99,
                "max_ms": max(values),
                "n": len(values),
            }
            print(f"| {name} | {what} | {p50:.1f} | {p99:.1f} | {max(values):.1f} |")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
