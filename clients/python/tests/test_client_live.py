"""The client against a real Shiftlog: set SHIFTLOG_TEST_URL and SHIFTLOG_TEST_TOKEN (a token
with the read, write and decide scopes, whose user has the agents.decide_approval permission).
The project's tests/test_client_live.py starts a real `manage.py serve` and runs these."""

from __future__ import annotations

import asyncio
import http.client
import http.server
import io
import os
import tarfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
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


# --- retries through a flaky gateway ------------------------------------------------------------
class FlakyGateway:
    """A real HTTP proxy in front of the server that answers each request as its script says:
    "forward"; "drop" (closes the connection, nothing sent on); "forward-drop" (the server does
    the work, then the answer is lost); "502", "503", "504". It keeps what it was sent."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, Idempotency-Key
        target = urlsplit(URL)
        gateway = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gateway.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                action = gateway.script.pop(0) if gateway.script else "forward"
                if action == "drop":
                    self.close_connection = True
                    return
                if action.isdigit():
                    self.send_response(int(action))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                if action == "forward-drop":
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FlakyGateway:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def fast(client):
    client._sleep = lambda _s: None  # the backoff's waits are not what is tested here
    return client


def test_reads_are_retried_through_dropped_connections_and_gateway_errors(client):
    with (
        FlakyGateway(["503", "drop", "502", "forward"]) as gateway,
        fast(Client(gateway.url, TOKEN)) as flaky,
    ):
        assert flaky.get_run(new_run(client).run_id).status
    assert [s[0] for s in gateway.seen] == ["GET"] * 4


def test_a_create_run_whose_answer_was_lost_is_retried_and_makes_one_run(client):
    goal = f"made once ({uuid.uuid4().hex[:8]})"
    with (
        FlakyGateway(["forward-drop", "504", "forward"]) as gateway,
        fast(Client(gateway.url, TOKEN)) as flaky,
    ):
        made = flaky.create_run(goal, provider="external", checks=CHECKS)
    keys = {s[2] for s in gateway.seen}
    assert len(gateway.seen) == 3 and len(keys) == 1 and None not in keys
    assert [r.id for r in client.list_runs(q=goal).items] == [made.id]
    # A second call is a new request: a new key, a second run.
    again = client.create_run(goal, provider="external", checks=CHECKS)
    assert again.id != made.id


def test_a_retried_tool_call_is_asked_once(client):
    run = new_run(client)
    run.context()
    with (
        FlakyGateway(["forward-drop", "forward"]) as gateway,
        fast(Client(gateway.url, TOKEN)) as flaky,
    ):
        decision = flaky.request_tool_call(run.run_id, "bash", {"command": "ls"})
    listed = [e for e in client.iter_events(run.run_id) if e.kind == "tool.call"]
    assert len(listed) == 1 and decision.id
    assert len({s[2] for s in gateway.seen}) == 1


def test_a_put_is_not_sent_again_after_its_answer_was_lost(client, tmp_path: Path):
    # A PUT carries no key: once the request went out, a lost answer is an error, not a retry.
    (tmp_path / "done.txt").write_text("yes\n")
    run = new_run(client)
    with (
        FlakyGateway(["forward-drop", "forward"]) as gateway,
        fast(Client(gateway.url, TOKEN)) as flaky,
        pytest.raises(httpx.TransportError),
    ):
        flaky.upload_workspace(run.run_id, tmp_path)
    assert len(gateway.seen) == 1 and gateway.seen[0][2] is None


def test_the_async_client_retries_a_create_run_once_too():
    goal = f"made once, async ({uuid.uuid4().hex[:8]})"

    async def main():
        async with AsyncClient(gateway.url, TOKEN) as flaky:

            async def no_wait(_s):
                return None

            flaky._sleep = no_wait
            return await flaky.create_run(goal, provider="external", checks=CHECKS)

    with FlakyGateway(["drop", "forward-drop", "503", "forward"]) as gateway:
        made = asyncio.run(main())
    with Client(URL, TOKEN) as c:
        assert [r.id for r in c.list_runs(q=goal).items] == [made.id]
    assert len({s[2] for s in gateway.seen}) == 1
