"""The worked examples (examples/), end to end against a real `manage.py serve` and a fake
Messages API over real HTTP (tests/fake_anthropic.py): the agent asks before each tool, a risky
call waits for a person, the test approves it through the API with a decide token, the agent runs
it, uploads its workspace and finishes, and the harness's checks make the run succeed."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agents.models import Event, Run
from tests.fake_anthropic import FakeAnthropic
from tests.helpers import CHECKS, EXAMPLES, agent_env, text, tool_use
from tests.procs import BASE_DIR, dying_with_us

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def approve_when_asked(decider, run_id: int, agent: subprocess.Popen, log: Path):
    """Wait for the run's approval (while the agent lives) and approve it through the API."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        waiting = decider.list_approvals(status="pending", run=run_id)
        if waiting:
            return decider.decide(waiting[0].id, "approve", reason="fine in the workspace")
        if agent.poll() is not None:
            raise AssertionError(f"the agent exited {agent.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"no approval came:\n{log.read_text()}")


def test_the_plain_anthropic_loop_succeeds_after_an_approval_and_a_failed_finish(
    shiftlog, tmp_path
):
    from shiftlog_client import Client, ExternalRun

    base, agent_token, boss_token = shiftlog
    with Client(base, agent_token) as agent_api:
        run_id = ExternalRun.create(agent_api, "Write done.txt saying yes", checks=CHECKS).run_id
    workspace = tmp_path / "agent-ws"
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "junk.o").write_text("junk")
    log = tmp_path / "agent.log"

    with FakeAnthropic() as fake:
        fake.push_message([text("Looking first."), tool_use("toolu_1", "bash", command="ls")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([tool_use("toolu_2", "write_file", path="done.txt", content="no\n")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([text("Done.")])  # the harness's checks will say otherwise
        fake.push_message(
            [text("Cleaning up and fixing it."),
             tool_use("toolu_3", "bash", command="rm -rf build && echo yes > done.txt")],
            stop_reason="tool_use", usage={"input_tokens": 300, "output_tokens": 40},
        )  # fmt: skip
        fake.push_message([text("Done now: done.txt says yes.")])
        argv = [sys.executable, str(EXAMPLES / "plain_anthropic_loop" / "agent.py"),
                "--url", base, "--token", agent_token, "--run", str(run_id),
                "--workspace", str(workspace), "--model", "claude-sonnet-4-5"]  # fmt: skip
        with log.open("w") as out:
            agent = subprocess.Popen(
                dying_with_us(argv), env=agent_env(fake), stdout=out, stderr=subprocess.STDOUT
            )
        try:
            with Client(base, boss_token) as decider:
                decided = approve_when_asked(decider, run_id, agent, log)
            assert decided.status == "approved" and decided.decided_by == "boss"
            assert decided.input == {"command": "rm -rf build && echo yes > done.txt"}
            assert agent.wait(timeout=120) == 0, log.read_text()
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        requests = [r["body"] for r in fake.requests]

    output = log.read_text()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", output
    assert (workspace / "done.txt").read_text() == "yes\n"
    assert not (workspace / "build").exists()
    assert len(requests) == 5 and fake.pending == 0, output
    # The model was told what happened: each tool's result, then the harness's verdict.
    results = {
        block["tool_use_id"]: block
        for body in requests
        for message in body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    }
    assert set(results) == {"toolu_1", "toolu_2", "toolu_3"}
    assert "build" in results["toolu_1"]["content"] and not results["toolu_1"]["is_error"]
    assert not results["toolu_3"]["is_error"]
    verdict = requests[3]["messages"][-1]
    assert verdict["role"] == "user" and "FAILED" in verdict["content"], verdict
    assert {t["name"] for t in requests[0]["tools"]} == {"bash", "write_file"}
    # Shiftlog's log holds the whole story, in the agent's words and the harness's.
    kinds = list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))
    for kind in ("model.turn", "tool.call", "tool.result", "approval.requested",
                 "approval.decided", "check.result", "checkpoint.created"):  # fmt: skip
        assert kind in kinds, (kind, kinds)
    # Each turn's usage, as the fake answered it, counted against the run's budgets.
    assert run.turns == 5
    assert run.input_tokens == 300 + 4 * 10 and run.output_tokens == 40 + 4 * 5


# --- the Claude Agent SDK example -------------------------------------------------------------


@functools.cache
def sdk_python() -> str | None:
    """A Python with claude-agent-sdk (and httpx): SHIFTLOG_CLAUDE_SDK_PYTHON, or this one."""
    python = os.environ.get("SHIFTLOG_CLAUDE_SDK_PYTHON") or sys.executable
    probe = subprocess.run(
        [python, "-c", "import claude_agent_sdk, httpx"], capture_output=True, timeout=60
    )
    return python if probe.returncode == 0 else None


class FakeForClaudeCode(FakeAnthropic):
    """The script answers Claude Code's agent requests (those offering its tools); anything
    else the CLI may ask on the side (a title, a summary) gets a short reply off the script."""

    def _next_response(self, request: dict[str, Any]) -> tuple[int, Any, dict[str, str], float]:
        body = request.get("body") if isinstance(request.get("body"), dict) else {}
        if not any(t.get("name") == "Bash" for t in body.get("tools") or []):
            with self._lock:
                self.requests.append(request)
            reply = self.message_body([text("ok")], model=body.get("model", "claude-haiku-4-5"))
            return 200, reply, {}, 0.0
        return super()._next_response(request)


def test_the_claude_agent_sdk_agent_asks_shiftlog_before_each_tool(shiftlog, tmp_path):
    python = sdk_python()
    if python is None:
        pytest.skip(
            "claude-agent-sdk is not installed for this Python: pip install -r "
            "examples/claude_agent_sdk/requirements.txt, or set SHIFTLOG_CLAUDE_SDK_PYTHON to a "
            "Python that has it (its wheel bundles the Claude Code CLI)"
        )
    from shiftlog_client import Client, ExternalRun

    base, agent_token, boss_token = shiftlog
    with Client(base, agent_token) as agent_api:
        run_id = ExternalRun.create(agent_api, "Write done.txt saying yes", checks=CHECKS).run_id
    workspace = tmp_path / "agent-ws"
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "junk.o").write_text("junk")
    (workspace / "build" / "keep.txt").write_text("keep")
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "agent.log"
    risky = "rm -rf build && echo yes > done.txt"
    edited = "rm -f build/junk.o && echo yes > done.txt"

    with FakeForClaudeCode() as fake:
        fake.push_message(
            [text("Looking first."), tool_use("toolu_1", "Bash", command="ls", description="list")],
            stop_reason="tool_use",
        )
        fake.push_message([tool_use("toolu_2", "Bash", command="echo no > done.txt")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([text("Done.")])  # the harness's checks will say otherwise
        fake.push_message([tool_use("toolu_3", "Bash", command=risky)], stop_reason="tool_use",
                          usage={"input_tokens": 300, "output_tokens": 40})  # fmt: skip
        fake.push_message([text("Done now: done.txt says yes.")])
        argv = [python, str(EXAMPLES / "claude_agent_sdk" / "agent.py"),
                "--url", base, "--run", str(run_id),
                "--workspace", str(workspace), "--model", "claude-sonnet-4-5"]  # fmt: skip
        env = agent_env(
            fake,
            SHIFTLOG_TOKEN=agent_token,
            HOME=str(home),
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
        )
        with log.open("w") as out:
            agent = subprocess.Popen(dying_with_us(argv), env=env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            with Client(base, boss_token) as decider:
                deadline = time.monotonic() + 120
                while not (waiting := decider.list_approvals(status="pending", run=run_id)):
                    assert agent.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
                assert waiting[0].input == {"command": risky, "description": ""} or (
                    waiting[0].input["command"] == risky
                ), waiting[0]
                decided = decider.decide(
                    waiting[0].id, "edit", input={**waiting[0].input, "command": edited}
                )
            assert decided.status == "approved"
            assert agent.wait(timeout=120) == 0, log.read_text()
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, 9)
                agent.wait()
        scripted = [r["body"] for r in fake.requests if any(
            t.get("name") == "Bash" for t in r["body"].get("tools") or [])]  # fmt: skip

    output = log.read_text()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", output
    assert fake.pending == 0 and len(scripted) == 5, output
    # The person's edit is what ran: junk.o went, the rest of build/ stayed.
    assert (workspace / "done.txt").read_text() == "yes\n"
    assert not (workspace / "build" / "junk.o").exists()
    assert (workspace / "build" / "keep.txt").exists()
    # Shiftlog's log: each call asked, run and reported, the approval, the checks.
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    kinds = [e.kind for e in events]
    for kind in ("model.turn", "tool.call", "tool.result", "approval.requested",
                 "approval.decided", "check.result"):  # fmt: skip
        assert kind in kinds, (kind, kinds)
    results = [e.payload for e in events if e.kind == "tool.result"]
    assert any("build" in str(p.get("output", "")) for p in results), results
    # Claude was told the checks fail (the Stop hook's reason), then went on.
    assert "do not pass yet" in str(scripted[3]["messages"]), scripted[3]["messages"][-1]
    # Each of its five messages' usage, read from the transcript and posted as a turn.
    assert run.turns == 5 and run.input_tokens >= 300


# --- the README's loop --------------------------------------------------------------------------


def readme_loop() -> str:
    text = (BASE_DIR / "clients" / "python" / "README.md").read_text()
    return text.split("<!-- readme-loop")[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_projects_readme_shows_the_same_loop():
    readme = (BASE_DIR / "README.md").read_text()
    assert f"```python\n{readme_loop()}```" in readme


def test_the_readme_loop_runs_as_written(shiftlog, tmp_path, monkeypatch):
    import anthropic
    from shiftlog_client import Client, ExternalRun

    base, agent_token, _ = shiftlog
    with Client(base, agent_token) as api:
        run_id = ExternalRun.create(api, "Write done.txt saying yes", checks=CHECKS).run_id
    workspace = tmp_path / "ws"
    workspace.mkdir()

    def run_bash(input):
        done = subprocess.run(["bash", "-c", input["command"]], cwd=workspace,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        return done.stdout + done.stderr, done.returncode != 0

    with FakeAnthropic() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-key")
        fake.push_message([tool_use("toolu_1", "bash", command="echo no > done.txt")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([text("Done.")])
        fake.push_message([tool_use("toolu_2", "bash", command="echo yes > done.txt")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([text("Done.")])
        scope = {
            "anthropic": anthropic,
            "Client": Client,
            "ExternalRun": ExternalRun,
            "URL": base,
            "TOKEN": agent_token,
            "RUN_ID": run_id,
            "MODEL": "claude-sonnet-4-5",
            "TOOLS": [
                {
                    "name": "bash",
                    "description": "Run a command.",
                    "input_schema": {
                        "type": "object",
                        "properties": {"command": {"type": "string"}},
                    },
                }
            ],
            "HANDS": {"bash": run_bash},
            "WORKSPACE": workspace,
        }
        exec(compile(readme_loop(), "clients/python/README.md", "exec"), scope)
        requests = [r["body"] for r in fake.requests]

    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert len(requests) == 4 and "FAILED" in str(requests[2]["messages"][-1]["content"])
