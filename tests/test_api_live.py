"""The API over real HTTP against a real `manage.py serve` (daphne, a huey consumer): an
external agent end to end, the event stream resumed after a drop, and schemathesis against the
live schema."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import threading
import time

import httpx
import pytest

from agents.models import Event, Run
from agents.runspec import RunSpec
from tests.e2e.helpers import serving
from tests.helpers import user_with
from tests.procs import Procs, dying_with_us

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def token(tmp_path, user: str, scopes: str) -> str:
    return Procs(tmp_path).manage("create_token", "--user", user, "--scopes", scopes).split()[-1]


def tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def test_an_external_agent_end_to_end_over_http(tmp_path):
    user_with("agent", "decide_approval")
    write = token(tmp_path, "agent", "read,write")
    read = token(tmp_path, "agent", "read")
    decide = token(tmp_path, "agent", "read,decide")
    with serving(tmp_path) as base:
        agent = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {write}"}, timeout=60
        )
        run = agent.post(
            "/runs",
            json={"goal": "leave done.txt", "checks": ["test -f done.txt"], "provider": "external"},
        ).json()
        run_id = run["id"]
        assert run["external"] and run["status"] == "queued"
        assert "leave done.txt" in agent.get(f"/runs/{run_id}/context").json()["first_message"]

        # A risky call waits for a person, in the same inbox as every run.
        call = agent.post(
            f"/runs/{run_id}/tool-calls",
            json={"tool": "Bash", "input": {"command": "rm -rf build"}},
        ).json()
        assert call["decision"] == "ask"
        inbox = httpx.get(
            f"{base}/api/v1/approvals",
            params={"status": "pending"},
            headers={"Authorization": f"Bearer {read}"},
        ).json()
        assert [a["id"] for a in inbox["items"]] == [call["approval"]]

        # The agent long-polls while a person decides; a read token is refused, a decide token is not.
        answers = []
        poll = threading.Thread(
            target=lambda: answers.append(
                agent.get(f"/tool-calls/{call['id']}", params={"wait": 30}).json()
            )
        )
        started = time.monotonic()
        poll.start()
        time.sleep(0.5)
        refused = httpx.post(
            f"{base}/api/v1/approvals/{call['approval']}/decision",
            json={"decision": "approve"},
            headers={"Authorization": f"Bearer {read}"},
        )
        assert (
            refused.status_code == 403
            and refused.headers["content-type"] == "application/problem+json"
        )
        decided = httpx.post(
            f"{base}/api/v1/approvals/{call['approval']}/decision",
            json={"decision": "approve", "reason": "fine"},
            headers={"Authorization": f"Bearer {decide}"},
        )
        assert decided.status_code == 200, decided.text
        poll.join(timeout=40)
        assert answers and answers[0]["decision"] == "approved", answers
        assert time.monotonic() - started < 20  # it answered when decided, not at the wait's end
        assert (
            agent.post(f"/tool-calls/{call['id']}/result", json={"output": "removed"}).status_code
            == 201
        )

        # The harness runs the checks itself: without done.txt, finish is refused.
        up = agent.put(
            f"/runs/{run_id}/workspace",
            content=tarball({"notes.txt": "wip"}),
            headers={"Content-Type": "application/gzip"},
        )
        assert up.status_code == 201, up.text
        refused = finish(agent, run_id, "done, trust me")
        assert refused["passed"] is False and refused["run_status"] == "running"
        up = agent.put(
            f"/runs/{run_id}/workspace",
            content=tarball({"notes.txt": "wip", "done.txt": "yes"}),
            headers={"Content-Type": "application/gzip"},
        )
        assert up.status_code == 201
        done = finish(agent, run_id, "done.txt is there")
        assert done["passed"] is True and done["run_status"] == "succeeded", done

        kinds = [
            e["kind"]
            for e in agent.get(f"/runs/{run_id}/events", params={"limit": 1000}).json()["items"]
        ]
        for kind in ("approval.requested", "approval.decided", "check.result"):
            assert kind in kinds
    assert Run.objects.get(pk=run_id).status == "succeeded"
    checks = Event.objects.filter(run_id=run_id, kind="check.result").order_by("seq")
    assert [e.payload["passed"] for e in checks] == [False, True]


def read_stream(base: str, auth: str, run_id: int, *, last_id: str | None, stop_after: int | None):
    """(seqs, ended) from the stream; stops reading (drops the connection) after `stop_after`."""
    headers = {"Authorization": f"Bearer {auth}", "Accept": "text/event-stream"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    seqs, ended, current = [], False, {}
    with httpx.stream(
        "GET", f"{base}/api/v1/runs/{run_id}/events/stream", headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and current:
                if current.get("event") == "end":
                    ended = True
                    break
                if "id" in current:
                    assert current["data"]["seq"] == current["id"]
                    seqs.append(current["id"])
                current = {}
                if stop_after is not None and len(seqs) >= stop_after:
                    break
    return seqs, ended


def test_the_event_stream_resumes_after_a_drop_without_gap_or_duplicate(tmp_path):
    from django.contrib.auth import get_user_model

    from agents import services

    user_with("watcher", "view_run", "control_run", "decide_approval")
    auth = token(tmp_path, "watcher", "read,decide")
    run = services.create_demo_run(
        created_by=get_user_model().objects.get(username="watcher"), turn_delay_seconds=0.05
    )
    with serving(tmp_path) as base:
        first, ended = read_stream(base, auth, run.pk, last_id=None, stop_after=5)
        assert first == [1, 2, 3, 4, 5] and not ended
        # The run goes on (it waits for its risky step; approve it through the API meanwhile).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pending = httpx.get(
                f"{base}/api/v1/approvals",
                params={"status": "pending", "run": run.pk},
                headers={"Authorization": f"Bearer {auth}"},
            ).json()["items"]
            if pending:
                break
            time.sleep(0.2)
        assert pending, "the demo never asked"
        httpx.post(
            f"{base}/api/v1/approvals/{pending[0]['id']}/decision",
            json={"decision": "approve"},
            headers={"Authorization": f"Bearer {auth}"},
        ).raise_for_status()
        rest, ended = read_stream(base, auth, run.pk, last_id=str(first[-1]), stop_after=None)
    assert ended, "the stream should end once the run is over"
    seqs = first + rest
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert seqs == list(range(1, run.last_seq + 1))


@pytest.mark.any_db  # the schema is the same on any database: once, on SQLite
def test_schemathesis_finds_no_server_error_or_schema_violation(tmp_path):
    from django.contrib.auth import get_user_model

    from agents import services

    user_with("fuzz", "view_run", "control_run", "decide_approval")
    fuzz = get_user_model().objects.get(username="fuzz")
    services.create_demo_run(created_by=fuzz, turn_delay_seconds=0)
    services.create_run(
        RunSpec(goal="an external run", checks=["true"], provider="external"), created_by=fuzz
    )
    auth = token(tmp_path, "fuzz", "read,write,decide")
    with serving(
        tmp_path,
        SHIFTLOG_API_RATE_PER_MINUTE=1_000_000,
        SHIFTLOG_API_MAX_WAIT_SECONDS=0.5,
        SHIFTLOG_API_STREAM_SECONDS=1,
    ) as base:
        argv = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{base}/api/v1/openapi.json",
            "--header", f"Authorization: Bearer {auth}",
            "--checks", "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
            "--max-examples", "6",
            "--phases", "coverage,fuzzing,stateful",
            "--request-timeout", "60",
            "--generation-deterministic",
            "--no-color",
        ]  # fmt: skip
        done = subprocess.run(
            dying_with_us(argv), capture_output=True, text=True, timeout=540, cwd=tmp_path
        )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    summary = report.split("SUMMARY")[-1]
    assert "Fuzzing" in summary and "failures" not in summary, report


def finish(agent, run_id: int, summary: str) -> dict:
    """finish answers at once (202, the checks run in a worker); the verdict is a long poll."""
    queued = agent.post(f"/runs/{run_id}/finish", json={"summary": summary})
    assert queued.status_code == 202, queued.text
    answer = queued.json()
    while answer.get("state") == "checking":
        answer = agent.get(f"/runs/{run_id}/finish/{answer['id']}", params={"wait": 30}).json()
    return answer


def test_a_slow_finish_holds_no_other_request(tmp_path):
    """The checks an agent's finish runs (here 6 s) hold no other request, nor the long poll
    for its verdict: under ASGI each request has its own thread for sync code (Django's
    ThreadSensitiveContext), and this keeps it so."""
    user_with("agent", "decide_approval")
    auth = token(tmp_path, "agent", "read,write")
    with serving(tmp_path) as base:
        agent = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {auth}"}, timeout=60
        )
        run_id = agent.post(
            "/runs", json={"goal": "wait", "checks": ["sleep 6"], "provider": "external"}
        ).json()["id"]
        agent.get(f"/runs/{run_id}/context")
        finished = []
        slow = threading.Thread(target=lambda: finished.append(finish(agent, run_id, "s")))
        slow.start()
        time.sleep(1.5)  # the checks are running
        started = time.monotonic()
        for _ in range(3):
            assert agent.get(f"/runs/{run_id}").status_code == 200
            assert httpx.get(f"{base}/accounts/login/").status_code == 200
        quick = time.monotonic() - started
        assert not finished, "the checks should still be running"
        slow.join(timeout=60)
    assert quick < 3, f"six requests took {quick:.1f} s while the checks ran"
    assert finished[0]["passed"] is True
