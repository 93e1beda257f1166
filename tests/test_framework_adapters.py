"""The OpenAI Agents SDK and LangGraph adapters of the client (shiftlog_client.openai_agents,
shiftlog_client.langgraph), each through its example against a real `manage.py serve`: a risky
call waits in the inbox and a person denies it with a reason the agent reads, a write runs, the
harness's checks fail on the first finish and the failure goes back to the agent, a second risky
call is approved and runs, and the checks pass. The OpenAI agent talks to a local fake of the
Responses API over real HTTP, through the SDK's own OpenAI model and client
(tests/openai_agents_scripted.py); the graph's model is the fake Messages API over real HTTP."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.models import Event, Run
from tests.fake_anthropic import FakeAnthropic
from tests.helpers import CHECKS, CLIENT_SRC, EXAMPLES, agent_env, text, tool_use
from tests.procs import BASE_DIR, dying_with_us

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

RISKY = "rm -rf build"
FIX = "rm -rf build/junk.o && echo yes > done.txt"
REASON = "keep build/, only junk.o may go"
EDITABLE = f"{RISKY} && echo yes > done.txt"  # a person edits it to FIX


@functools.cache
def openai_agents_python() -> str | None:
    """A Python with openai-agents: SHIFTLOG_OPENAI_AGENTS_PYTHON, the virtualenv `make
    openai-agents` makes, or this one. Its package is named `agents` like Shiftlog's app, so it
    is probed (and run) outside the repository."""
    own = BASE_DIR / "var" / "openai-agents-venv" / "bin" / "python"
    for python in (os.environ.get("SHIFTLOG_OPENAI_AGENTS_PYTHON"), own, sys.executable):
        if python and Path(python).exists():
            probe = subprocess.run([python, "-c", "from agents import Runner, RunState"],
                                   capture_output=True, timeout=60, cwd="/")  # fmt: skip
            if probe.returncode == 0:
                return str(python)
    return None


def make_run(base: str, token: str, workspace: Path) -> int:
    from shiftlog_client import Client, ExternalRun

    with Client(base, token) as api:
        run_id = ExternalRun.create(api, "Write done.txt saying yes", checks=CHECKS).run_id
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "junk.o").write_text("junk")
    (workspace / "build" / "keep.txt").write_text("keep")
    return run_id


def deny_then_approve(base, boss_token, run_id, agent, log: Path, edit=None) -> list:
    """The person: deny the first call that waits (with a reason), approve the second (edited
    to `edit`, if given)."""
    from shiftlog_client import Client

    decided = []
    with Client(base, boss_token) as decider:
        deadline = time.monotonic() + 120
        while len(decided) < 2:
            waiting = decider.list_approvals(status="pending", run=run_id)
            if waiting:
                if decided and edit:
                    decided.append(decider.decide(waiting[0].id, "edit", input=edit))
                elif decided:
                    decided.append(decider.decide(waiting[0].id, "approve"))
                else:
                    decided.append(decider.decide(waiting[0].id, "deny", reason=REASON))
                continue
            assert agent.poll() is None, f"the agent exited {agent.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    return decided


def run_agent(argv, env, base, boss_token, run_id, log: Path, cwd=None, edit=None) -> list:
    with log.open("w") as out:
        agent = subprocess.Popen(dying_with_us(argv), env=env, stdout=out, cwd=cwd,
                                 stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        decided = deny_then_approve(base, boss_token, run_id, agent, log, edit)
        assert agent.wait(timeout=120) == 0, log.read_text()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()
    return decided


def assert_the_story(run_id: int, workspace: Path, decided: list, output: str) -> Run:
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", output
    assert [d.status for d in decided] == ["denied", "approved"], decided
    assert decided[0].input["command"] == RISKY, decided[0]
    assert decided[1].input["command"] in (FIX, EDITABLE), decided[1]  # as asked
    # The denied call did not run, the approved one did (as edited, if it was: build/ stays).
    assert (workspace / "done.txt").read_text() == "yes\n"
    assert not (workspace / "build" / "junk.o").exists()
    assert (workspace / "build" / "keep.txt").exists()
    kinds = list(Event.objects.filter(run_id=run_id).values_list("kind", flat=True))
    for kind in ("model.turn", "tool.call", "tool.result", "approval.decided", "check.result"):
        assert kind in kinds, (kind, kinds)
    results = [e.payload for e in Event.objects.filter(run_id=run_id, kind="tool.result")]
    assert any("wrote" in str(p.get("output", "")) for p in results), results
    checks = [e.payload for e in Event.objects.filter(run_id=run_id, kind="check.result")]
    assert any(not p.get("passed", True) for p in checks), checks  # the first finish failed
    return run


def test_an_openai_agents_sdk_agent_asks_shiftlog_and_ends_on_the_checks(shiftlog, tmp_path):
    python = openai_agents_python()
    if python is None:
        pytest.skip(
            "openai-agents is not installed for this Python: pip install -r "
            "examples/openai_agents/requirements.txt in a virtualenv of its own (make openai-agents), "
            "or set SHIFTLOG_OPENAI_AGENTS_PYTHON"
        )
    base, agent_token, boss_token = shiftlog
    workspace = tmp_path / "agent-ws"
    run_id = make_run(base, agent_token, workspace)
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"call": "bash", "args": {"command": RISKY}},
        {"call": "write_file", "args": {"path": "done.txt", "content": "no\n"}},
        {"text": "Done."},  # the harness's checks will say otherwise
        {"call": "bash", "args": {"command": FIX}, "usage": {"input_tokens": 300}},
        {"text": "Done now: done.txt says yes."},
    ]))  # fmt: skip
    inputs = tmp_path / "inputs.json"
    argv = [python, str(BASE_DIR / "tests" / "openai_agents_scripted.py"), str(script),
            str(inputs), "--", "--url", base, "--token", agent_token, "--run", str(run_id),
            "--workspace", str(workspace)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
    env.update(PYTHONPATH=str(CLIENT_SRC), PYTHONUNBUFFERED="1", OPENAI_API_KEY="sk-not-a-key",
               OPENAI_AGENTS_DISABLE_TRACING="1")  # fmt: skip
    log = tmp_path / "agent.log"
    decided = run_agent(argv, env, base, boss_token, run_id, log, cwd=tmp_path)

    output = log.read_text()
    run = assert_the_story(run_id, workspace, decided, output)
    seen = [json.dumps(i) for i in json.loads(inputs.read_text())]
    assert len(seen) == 5, output
    assert REASON in seen[1], seen[1]  # the person's reason reached the model
    assert "FAILED" in seen[3], seen[3]  # and so did the checks' failure
    assert run.turns == 5 and run.input_tokens == 300 + 4 * 10 and run.output_tokens == 5 * 5


def test_a_langgraph_graph_asks_shiftlog_through_interrupts_and_ends_on_the_checks(
    shiftlog, tmp_path
):
    pytest.importorskip(
        "langgraph", reason="pip install -r examples/langgraph_graph/requirements.txt"
    )
    base, agent_token, boss_token = shiftlog
    workspace = tmp_path / "agent-ws"
    run_id = make_run(base, agent_token, workspace)
    log = tmp_path / "agent.log"
    with FakeAnthropic() as fake:
        fake.push_message([text("Clearing out."), tool_use("toolu_1", "bash", command=RISKY)],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([tool_use("toolu_2", "write_file", path="done.txt", content="no\n")],
                          stop_reason="tool_use")  # fmt: skip
        fake.push_message([text("Done.")])
        # The person edits this one to FIX: the node runs the call as edited.
        fake.push_message([tool_use("toolu_3", "bash", command=EDITABLE)],
                          stop_reason="tool_use",
                          usage={"input_tokens": 300, "output_tokens": 40})  # fmt: skip
        fake.push_message([text("Done now: done.txt says yes.")])
        argv = [sys.executable, str(EXAMPLES / "langgraph_graph" / "agent.py"), "--url", base,
                "--token", agent_token, "--run", str(run_id), "--workspace", str(workspace)]  # fmt: skip
        decided = run_agent(argv, agent_env(fake), base, boss_token, run_id, log,
                            edit={"command": FIX})  # fmt: skip
        requests = [r["body"] for r in fake.requests]

    output = log.read_text()
    run = assert_the_story(run_id, workspace, decided, output)
    assert len(requests) == 5 and fake.pending == 0, output
    assert REASON in json.dumps(requests[1]["messages"]), requests[1]["messages"]
    assert "FAILED" in json.dumps(requests[3]["messages"][-1]), requests[3]["messages"][-1]
    assert run.turns == 5
    assert run.input_tokens == 300 + 4 * 10 and run.output_tokens == 40 + 4 * 5
