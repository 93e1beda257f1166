"""The client against a real Shiftlog: set SHIFTLOG_TEST_URL and SHIFTLOG_TEST_TOKEN (a token
with the read, write and decide scopes, whose user has the agents.decide_approval permission).
The project's tests/test_client_live.py starts a real `manage.py serve` and runs these."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from shiftlog_client import (
    AsyncClient,
    AsyncExternalRun,
    Client,
    Conflict,
    ExternalRun,
    Invalid,
    NotFound,
    ShiftlogError,
    Unauthorized,
)

URL = os.environ.get("SHIFTLOG_TEST_URL", "")
TOKEN = os.environ.get("SHIFTLOG_TEST_TOKEN", "")

pytestmark = [
    pytest.mark.no_services,  # it talks to a server of its own, never to the test database
    pytest.mark.skipif(
        not (URL and TOKEN),
        reason="needs a running Shiftlog: set SHIFTLOG_TEST_URL and SHIFTLOG_TEST_TOKEN "
        "(read,write,decide); the project's tests/test_client_live.py does",
    ),
]

CHECKS = ["test -f done.txt", "grep -q yes done.txt"]


@pytest.fixture
def client():
    with Client(URL, TOKEN) as c:
        yield c


def new_run(client: Client, **spec) -> ExternalRun:
    goal = f"write done.txt saying yes ({uuid.uuid4().hex[:8]})"
    return ExternalRun.create(client, goal, checks=CHECKS, **spec)


def wait_for_approval(client: Client, run_id: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = client.list_approvals(status="pending", run=run_id)
        if waiting:
            return waiting[0]
        time.sleep(0.1)
    raise AssertionError(f"no approval came for run {run_id}")


def test_errors_come_back_as_exceptions(client):
    with Client(URL, "shl_not-a-token") as stranger, pytest.raises(Unauthorized) as info:
        stranger.list_runs()
    assert info.value.status == 401 and "token" in info.value.detail
    with pytest.raises(NotFound):
        client.get_run(2**40)
    with pytest.raises(Invalid) as info:
        client.create_run("x", checks=["true"], max_sessions=0)
    assert info.value.errors and "max_sessions" in info.value.detail
    with pytest.raises(Invalid):
        client.create_run("x", checks=["true"], bogus=1)  # type: ignore[call-arg]
    run = new_run(client)
    with pytest.raises(Conflict):
        client.resume_run(run.run_id)  # queued, not paused


def test_an_external_run_from_start_to_success(client, tmp_path: Path):
    run = new_run(client)
    context = run.context()
    assert context.session == 1 and "done.txt" in context.first_message
    assert run.status == "running"
    turn = run.turn("Looking around first.", "claude-sonnet-4-5", 120, 30)
    assert turn.seq > 0 and run.active

    ls = run.run_tool("bash", {"command": "ls"}, lambda i: f"ran {i['command']}")
    assert ls.ran and ls.decision.decision == "allow" and ls.output == "ran ls"

    # A risky call waits for a person; a person edits it through the API.
    asked: dict = {}
    asker = threading.Thread(
        target=lambda: asked.update(d=run.ask("bash", {"command": "rm -rf build"}, timeout=60))
    )
    asker.start()
    approval = wait_for_approval(client, run.run_id)
    assert approval.tool == "bash" and approval.input == {"command": "rm -rf build"}
    assert client.get_run(run.run_id).status == "awaiting_approval"
    decided = client.decide(approval.id, "edit", input={"command": "rm -rf build/tmp"})
    assert decided.status == "approved" and decided.edited_input == {"command": "rm -rf build/tmp"}
    asker.join(60)
    decision = asked["d"]
    assert decision.decision == "approved" and decision.allowed
    assert decision.input == {"command": "rm -rf build/tmp"}
    assert run.result(decision.id, "removed").seq > 0
    with pytest.raises(Conflict):
        run.result(decision.id, "again")  # once per call
    with pytest.raises(Conflict):
        client.decide(approval.id, "approve")  # decided already

    # Claiming done before the work is done: the harness's checks say no.
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.md").write_text("started\n")
    first = run.upload_workspace(work)
    assert first.files == 1
    failed = run.finish("done, I think")
    assert not failed.passed and failed.run_status == "running"
    assert any(not c.passed for c in failed.checks)
    assert "FAILED" in failed.report()

    (work / "done.txt").write_text("yes\n")
    (work / "sub").mkdir()
    (work / "sub" / "link.md").symlink_to("../notes.md")
    second = run.upload_workspace(work)
    assert second.checkpoint > first.checkpoint
    passed = run.finish("done.txt says yes")
    assert passed.passed and passed.run_status == "succeeded", passed
    assert all(c.passed for c in passed.checks)
    assert run.succeeded and not run.active

    final = client.get_run(run.run_id)
    assert final.status == "succeeded" and final.external and final.turns >= 1
    assert final.tokens.input >= 120

    # The log, paged and streamed, holds the same events in order.
    paged = [e.seq for e in client.iter_events(run.run_id, page_size=7)]
    assert paged == list(range(1, final.last_seq + 1))
    streamed = [e.seq for e in client.stream_events(run.run_id)]  # ends: the run is over
    assert streamed == paged
    assert [e.seq for e in client.stream_events(run.run_id, after=paged[-3])] == paged[-2:]
    kinds = {e.kind for e in client.iter_events(run.run_id)}
    assert {"tool.call", "tool.result", "approval.requested", "approval.decided"} <= kinds

    # Checkpoints, the diff between the uploads, the export and the patch.
    numbers = [c.number for c in client.list_checkpoints(run.run_id)]
    assert first.checkpoint in numbers and second.checkpoint in numbers
    diff = client.diff(run.run_id, first.checkpoint, second.checkpoint)
    assert "done.txt" in {c.path for c in diff.changes}
    assert "done.txt" in client.diff_patch(run.run_id, first.checkpoint, second.checkpoint)
    target = tmp_path / "cp.tar.gz"
    size = client.export_checkpoint(run.run_id, second.checkpoint, target)
    assert size == target.stat().st_size > 0
    with tarfile.open(target) as tar:
        names = tar.getnames()
    assert any(n.endswith("/done.txt") for n in names), names
    sink = io.BytesIO()
    client.export_checkpoint(run.run_id, second.checkpoint, sink)
    assert sink.getvalue() == target.read_bytes()

    for artifact in client.list_artifacts(run.run_id):
        assert client.get_artifact(artifact.id).name == artifact.name
        assert len(client.artifact_content(artifact.id)) == artifact.size

    listed = [r.id for r in client.iter_runs(provider="external", page_size=2)]
    assert run.run_id in listed


def test_pause_note_resume_and_cancel(client):
    run = new_run(client)
    run.context()
    assert client.note_run(run.run_id, "keep it short") > 0
    assert run.context().messages[-1]["text"] == "keep it short"
    assert client.pause_run(run.run_id, "lunch").status == "paused"
    refused = run.run_tool("bash", {"command": "ls"}, lambda _: pytest.fail("must not run"))
    assert not refused.ran and run.status == "paused" and not run.active
    assert client.resume_run(run.run_id, max_tokens=100_000).status in ("queued", "running")
    assert run.heartbeat() in ("queued", "running")
    assert client.cancel_run(run.run_id, "enough").status == "cancelled"
    with pytest.raises(ShiftlogError):
        client.cancel_run(run.run_id)


def test_the_async_client_drives_a_run_too(tmp_path):
    (tmp_path / "done.txt").write_text("yes\n")

    async def main():
        async with AsyncClient(URL, TOKEN) as client:
            run = await AsyncExternalRun.create(
                client, f"async {uuid.uuid4().hex[:6]}: done.txt says yes", checks=CHECKS
            )
            await run.context()
            outcome = await run.run_tool("write_file", {"path": "done.txt"}, lambda _: "written")
            await run.turn("wrote it", "claude-haiku-4-5", 10, 5)
            await run.upload_workspace(tmp_path)
            result = await run.finish("done")
            events = [e async for e in client.stream_events(run.run_id)]
            return run, outcome, result, events

    run, outcome, result, events = asyncio.run(main())
    assert outcome.ran and result.passed and run.succeeded
    assert events and events[-1].seq == len(events)
