"""`shiftlog-mcp` (clients/python/src/shiftlog_client/mcp_server.py) through the MCP SDK's own
stdio client, against a real `manage.py serve`: the client spawns the server as an MCP host
does, and calls its tools as an agent would; a person decides approvals in the test, through
agents.approvals.decide_as.

The `approve` tool answers Claude Code's --permission-prompt-tool contract: a JSON text,
`{"behavior": "allow", "updatedInput": {...}}` or `{"behavior": "deny", "message": "..."}`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agents import approvals
from agents.models import Approval, Checkpoint, Run, Session
from tests.e2e.helpers import serving
from tests.helpers import make_run, user_with
from tests.procs import BASE_DIR, Procs, dying_with_us, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CLIENT_SRC = BASE_DIR / "clients" / "python" / "src"
SERVER = [sys.executable, "-m", "shiftlog_client.mcp_server"]  # what `shiftlog-mcp` runs


def mcp_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
    env.update({"PYTHONPATH": str(CLIENT_SRC), "PYTHONDONTWRITEBYTECODE": "1", **values})
    return env


class McpSession:
    """The SDK's stdio client session, held open in a thread of its own (its event loop), so
    the test can call a tool, and decide an approval while the tool waits, from plain code."""

    def __init__(self, env: dict[str, str], errlog: Path) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.errlog = errlog.open("a")
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=env, cwd=BASE_DIR)
        self.opened = self.loop.create_future()
        self.stop = asyncio.Event()

        async def hold() -> None:
            try:
                async with (
                    stdio_client(params, errlog=self.errlog) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    self.opened.set_result(session)
                    await self.stop.wait()
            except BaseException as e:
                if not self.opened.done():
                    self.opened.set_exception(e)
                raise

        self.holder = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        self.session = asyncio.run_coroutine_threadsafe(self._opened(), self.loop).result(60)

    async def _opened(self):
        return await self.opened

    def start(self, tool: str, arguments: dict):
        """A tool call under way (a concurrent future): `.result(timeout)` is (text, is_error)."""

        async def call():
            result = await self.session.call_tool(tool, arguments)
            return "\n".join(c.text for c in result.content), bool(result.is_error)

        return asyncio.run_coroutine_threadsafe(call(), self.loop)

    def call(self, tool: str, arguments: dict, timeout: float = 120) -> tuple[str, bool]:
        return self.start(tool, arguments).result(timeout)

    def tools(self) -> list[str]:
        async def names():
            return [t.name for t in (await self.session.list_tools()).tools]

        return asyncio.run_coroutine_threadsafe(names(), self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        with contextlib.suppress(Exception):
            self.holder.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.errlog.close()


@contextlib.contextmanager
def mcp_session(env: dict[str, str], errlog: Path):
    session = McpSession(env, errlog)
    try:
        yield session
    finally:
        session.close()


def permission(text: str) -> dict:
    answer = json.loads(text)
    assert answer["behavior"] in ("allow", "deny"), answer
    return answer


def decide_when_asked(run: Run, person, **decision) -> Approval:
    """A person decides the run's pending approval, once it is in the inbox."""
    pending = wait_for(
        lambda: Approval.objects.filter(run=run, status="pending").first(),
        timeout=30,
        what=f"an approval of run {run.pk}",
    )
    return approvals.decide_as(pending.pk, user=person, **decision)


def ask(mcp: McpSession, run: Run, person, command: str, call_id: str, **decision):
    """The agent asks about a Bash call that needs a person; the person decides meanwhile."""
    under_way = mcp.start(
        "approve",
        {"tool_name": "Bash", "input": {"command": command}, "tool_use_id": call_id},
    )
    decide_when_asked(run, person, **decision)
    text, is_error = under_way.result(60)
    assert not is_error, text
    return permission(text)


@pytest.fixture
def people(tmp_path):
    agent = user_with("agent")
    person = user_with("boss", "decide_approval", "view_run", "control_run")
    out = Procs(tmp_path).manage("create_token", "--user", "agent", "--scopes", "read,write")
    return agent, person, out.strip().splitlines()[-1]


def test_an_agent_is_supervised_through_the_mcp_tools(tmp_path, people):
    agent, person, token = people
    folder = Path(f"/var/tmp/shiftlog-mcp-{os.getpid()}-{tmp_path.name}")
    folder.mkdir(parents=True)
    (folder / "done.txt").write_text("no\n")
    run = make_run(
        provider="external",
        created_by=agent,
        checks=["grep -qx yes done.txt"],
        tool_policy=[{"tool": "Bash", "pattern": "^make deploy", "action": "deny"}],
    )
    try:
        with serving(tmp_path) as base:
            env = mcp_env(
                SHIFTLOG_URL=base,
                SHIFTLOG_TOKEN=token,
                SHIFTLOG_RUN=str(run.pk),
                SHIFTLOG_AGENT="mcp-agent",
                SHIFTLOG_DIR=str(folder),
            )
            with mcp_session(env, tmp_path / "mcp.log") as mcp:
                assert set(mcp.tools()) == {
                    "approve",
                    "remember",
                    "recall",
                    "handoff",
                    "checkpoint",
                    "finish",
                }
                _approvals(mcp, run, person, folder)
                _memory_handoff_checkpoint(mcp, run)
                _finish(mcp, run, folder)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _approvals(mcp: McpSession, run: Run, person, folder: Path) -> None:
    # The policy allows: Shiftlog answers at once, with the input as asked.
    text, is_error = mcp.call(
        "approve", {"tool_name": "Bash", "input": {"command": "ls"}, "tool_use_id": "toolu_1"}
    )
    assert not is_error, text
    assert permission(text) == {"behavior": "allow", "updatedInput": {"command": "ls"}}
    # A rule denies, with its reason; no person is asked.
    text, _ = mcp.call(
        "approve", {"tool_name": "Bash", "input": {"command": "make deploy"}, "tool_use_id": "t2"}
    )
    answer = permission(text)
    assert answer["behavior"] == "deny" and "Shiftlog refused" in answer["message"], answer
    assert not Approval.objects.filter(run=run).exists()
    # A risky call waits for a person, who approves it.
    answer = ask(mcp, run, person, "rm -rf build", "toolu_3", decision="approve")
    assert answer == {"behavior": "allow", "updatedInput": {"command": "rm -rf build"}}
    # A person denies one with a reason: the agent reads it.
    answer = ask(
        mcp, run, person, "rm -rf dist", "toolu_4", decision="deny", reason="dist is shipped"
    )
    assert answer["behavior"] == "deny" and "dist is shipped" in answer["message"], answer
    # A person edits one: it runs as edited (updatedInput), an absolute path under the folder.
    edited = {"command": f"rm -rf {folder}/out/tmp"}
    answer = ask(mcp, run, person, f"rm -rf {folder}/out", "toolu_5", decision="edit", input=edited)
    assert answer == {"behavior": "allow", "updatedInput": edited}
    # Asked again with the same tool_use_id (a retry), the same answer, and no second approval.
    again, _ = mcp.call(
        "approve",
        {"tool_name": "Bash", "input": {"command": "rm -rf dist"}, "tool_use_id": "toolu_4"},
    )
    assert permission(again)["behavior"] == "deny"
    assert Approval.objects.filter(run=run).count() == 3


def _memory_handoff_checkpoint(mcp: McpSession, run: Run) -> None:
    text, is_error = mcp.call("remember", {"key": "build", "text": "run `make` before tests"})
    assert not is_error and "Remembered 'build'" in text, text
    mcp.call("remember", {"key": "style", "text": "four spaces", "pinned": True})
    text, _ = mcp.call("recall", {"query": "MAKE"})
    assert "- build [run]: run `make` before tests" in text and "style" not in text, text
    text, _ = mcp.call("recall", {})
    assert "style [run] (pinned): four spaces" in text and "build" in text, text
    text, _ = mcp.call("recall", {"query": "nothing like it"})
    assert text == "Nothing remembered matches 'nothing like it'.", text

    text, is_error = mcp.call(
        "handoff",
        {"summary": "cleaned the build", "next_steps": ["write yes"], "done": ["rm -rf build"]},
    )
    assert not is_error and text.startswith("Handoff stored; session 2 starts from it"), text
    assert "write yes" in text  # the next session's first message holds the handoff
    handed = Session.objects.get(run=run, index=1).handoff
    assert handed["summary"] == "cleaned the build" and handed["next_steps"] == ["write yes"]

    text, is_error = mcp.call("checkpoint", {})
    assert not is_error and text.startswith("Checkpoint "), text
    number = int(text.split()[1].rstrip(":"))
    assert Checkpoint.objects.filter(run=run, number=number, kind="upload").exists()
    text, _ = mcp.call("checkpoint", {"label": "before the fix"})
    labelled = Checkpoint.objects.get(run=run, label="before the fix")
    assert text == f"Checkpoint {labelled.number} (before the fix).", text


def _finish(mcp: McpSession, run: Run, folder: Path) -> None:
    text, is_error = mcp.call("finish", {"summary": "done, I think"})
    assert not is_error, text
    assert "Not done yet" in text and "FAILED (exit 1): grep -qx yes done.txt" in text, text
    run.refresh_from_db()
    assert run.status != "succeeded"
    (folder / "done.txt").write_text("yes\n")
    text, is_error = mcp.call("finish", {"summary": "done.txt says yes"})
    assert not is_error and text == "The checks passed; the run is succeeded.", text
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_bad_runs_tokens_and_arguments_get_plain_errors(tmp_path, people):
    agent, _, token = people
    run = make_run(provider="external", created_by=agent)
    log = tmp_path / "mcp.log"
    with serving(tmp_path) as base:
        unknown = mcp_env(SHIFTLOG_URL=base, SHIFTLOG_TOKEN=token, SHIFTLOG_RUN="999999")
        with mcp_session(unknown, log) as mcp:
            text, is_error = mcp.call("remember", {"key": "k", "text": "t"})
            assert is_error and "Shiftlog has no run 999999 this token may see" in text, text
            # The permission prompt fails closed: a deny that says why.
            text, is_error = mcp.call("approve", {"tool_name": "Bash", "input": {"command": "ls"}})
            answer = permission(text)
            assert answer["behavior"] == "deny" and "999999" in answer["message"], answer
        bad = mcp_env(SHIFTLOG_URL=base, SHIFTLOG_TOKEN="shl_not-a-token", SHIFTLOG_RUN=str(run.pk))
        with mcp_session(bad, log) as mcp:
            text, is_error = mcp.call("finish", {"summary": "done"})
            assert is_error and "does not accept this token" in text, text
            text, _ = mcp.call("approve", {"tool_name": "Bash", "input": {"command": "ls"}})
            assert permission(text)["behavior"] == "deny"
            assert "does not accept this token" in permission(text)["message"]
        good = mcp_env(SHIFTLOG_URL=base, SHIFTLOG_TOKEN=token, SHIFTLOG_RUN=str(run.pk))
        with mcp_session(good, log) as mcp:
            text, is_error = mcp.call("approve", {"input": {"command": "ls"}})
            assert is_error and "tool_name" in text, text
            text, is_error = mcp.call("remember", {"key": "k"})
            assert is_error and "text" in text, text
            text, is_error = mcp.call("approve", {"tool_name": "Bash", "input": "ls"})
            assert is_error and "input" in text, text
    assert "Traceback" not in log.read_text()
    run.refresh_from_db()
    assert not run.events.filter(kind="tool.call").exists()
    # Without its settings the server does not start, and says what is missing.
    done = subprocess.run(
        dying_with_us(SERVER), env=mcp_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "set SHIFTLOG_URL, SHIFTLOG_TOKEN, SHIFTLOG_RUN (or --run)" in done.stderr
    assert "Traceback" not in done.stderr


def test_claude_code_asks_shiftlog_through_the_permission_prompt_tool(tmp_path):
    """The real Claude Code CLI (tests/test_claude_code.py's stage: a loopback-only network
    namespace, the fake Messages API) with `--permission-prompt-tool mcp__shiftlog__approve`:
    a risky call waits for a person, who edits it (it runs as edited); a call the policy denies
    does not run and Claude reads why; Claude calls `finish` and the harness's checks end the
    run."""
    from tests.claude_stage import CLAUDE, Stage, _why_not, text, tool_use

    if (why := _why_not()) is not None:
        pytest.skip(why)
    procs: list[subprocess.Popen] = []

    def steps(repo: Path) -> list:
        return [
            [tool_use("toolu_m1", "Bash", command="rm -rf build")],
            [tool_use("toolu_m2", "Bash", command="curl -s http://x.example/i.sh")],
            [tool_use("toolu_m3", "Write", file_path=f"{repo}/done.txt", content="yes\n")],
            [tool_use("toolu_m4", "mcp__shiftlog__finish", summary="done.txt says yes")],
            [text("Done.")],
        ]

    try:
        stage = Stage(tmp_path, procs, steps)
        repo = stage.repo
        from django.contrib.auth import get_user_model

        run = make_run(
            provider="external",
            created_by=get_user_model().objects.get(username="agent"),
            checks=["grep -qx yes done.txt"],
            tool_policy=[{"tool": "Bash", "pattern": "^curl", "action": "deny"}],
        )
        config = stage.play / "mcp.json"
        server_env = {
            "PYTHONPATH": str(CLIENT_SRC),
            "SHIFTLOG_URL": stage.env["SHIFTLOG_URL"],
            "SHIFTLOG_TOKEN": stage.token,
            "SHIFTLOG_RUN": str(run.pk),
            "SHIFTLOG_DIR": str(repo),
        }
        servers = {"shiftlog": {"command": SERVER[0], "args": SERVER[1:], "env": server_env}}
        config.write_text(json.dumps({"mcpServers": servers}))
        env = {k: v for k, v in stage.env.items() if not k.startswith("SHIFTLOG_")}
        claude = stage.ns.start(
            [str(CLAUDE), "-p", "Write done.txt saying yes", "--mcp-config", str(config),
             "--permission-prompt-tool", "mcp__shiftlog__approve",
             "--allowedTools", "mcp__shiftlog", "--setting-sources", "user",
             "--output-format", "json"],
            env=env, cwd=repo, stdout=stage.logs[1].open("a"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        waiting = stage.pending()
        assert waiting.tool_name == "Bash" and waiting.tool_input["command"] == "rm -rf build"
        approvals.decide_as(
            waiting.pk,
            user=stage.boss,
            decision="edit",
            input={**waiting.tool_input, "command": "rm -rf build/tmp"},
        )
        assert claude.wait(timeout=180) == 0, stage.tail()
        run.refresh_from_db()
        assert run.status == "succeeded", (run.status, run.status_reason, stage.tail())
        # The edit is what ran; the denied call did not; Claude read the refusal.
        assert (repo / "build" / "keep.txt").exists() and not (repo / "build" / "tmp").exists()
        assert (repo / "done.txt").read_text() == "yes\n"
        said = stage.said()
        assert "Shiftlog refused this call" in said and "The checks passed" in said, said[-3000:]
        assert stage.token not in said
        stage.close()
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, 2)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
