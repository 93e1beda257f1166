"""`shiftlog-claude --run N` on a run its agent cannot go on with: it says how the run stands
and exits, instead of a traceback on the server's 409. Among them a run a person paused while
its passing checks ran and then resumed: the agent's first call marks it succeeded (the chaos
soak's finding, agents/runtime/loop.py: finished_session), and the driver exits 0."""

from __future__ import annotations

import threading
import time

import pytest

from agents import services
from agents.models import Run, RunStatus

AGENT = "claude-code-test"  # the driver goes on as the agent that began the run
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def drive(base: str, token: str, run_id: int, folder, monkeypatch, capsys) -> tuple[int, str]:
    from shiftlog_client import claude

    monkeypatch.setenv("SHIFTLOG_TOKEN", token)
    argv = ["--run", str(run_id), "--url", base, "--dir", str(folder), "--agent", AGENT]
    code = claude.main([*argv, "--claude", "/bin/false"])
    return code, capsys.readouterr().err


def test_on_a_cancelled_run_it_says_so_and_exits(shiftlog, tmp_path, monkeypatch, capsys):
    from shiftlog_client import Client

    base, agent_token, _ = shiftlog
    with Client(base, agent_token, agent=AGENT) as client:
        run_id = client.create_run("write done.txt", checks=["true"], provider="external").id
    services.cancel_run(run_id, actor="user:boss")
    code, err = drive(base, agent_token, run_id, tmp_path, monkeypatch, capsys)
    assert code == 1 and f"run {run_id} is cancelled" in err, err
    assert "Traceback" not in err


def test_a_run_paused_as_its_checks_passed_ends_succeeded_when_its_agent_comes_back(
    shiftlog, tmp_path, monkeypatch, capsys
):
    from shiftlog_client import Client

    base, agent_token, _ = shiftlog
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "done.txt").write_text("yes")
    with Client(base, agent_token, agent=AGENT) as client:
        run = client.create_run(
            "write done.txt", checks=["sleep 2 && test -f done.txt"], provider="external"
        )
        client.upload_workspace(run.id, folder)
        verdict: dict = {}
        finishing = threading.Thread(
            target=lambda: verdict.update(v=client.finish(run.id, "done")), daemon=True
        )
        finishing.start()
        deadline = time.monotonic() + 30
        while Run.objects.get(pk=run.id).status != RunStatus.VERIFYING:
            assert time.monotonic() < deadline, "the checks never started"
            time.sleep(0.02)
        services.pause_run(run.id, actor="user:boss")  # while the checks run
        finishing.join(60)
        assert verdict["v"].passed is False and verdict["v"].run_status == "paused", verdict
    services.resume_run(run.id, actor="user:boss")

    code, err = drive(base, agent_token, run.id, folder, monkeypatch, capsys)
    assert code == 0 and f"run {run.id} is succeeded" in err, err
    assert "when the run was resumed" in err
    done = Run.objects.get(pk=run.id)
    assert done.status == RunStatus.SUCCEEDED and done.sessions.count() == 1


@pytest.mark.parametrize("cause", ["rewind", "person"])
def test_a_hook_on_a_run_paused_for_a_rewind_says_a_rewind_is_under_way(
    cause, shiftlog, tmp_path, monkeypatch, capsys
):
    """Claude Code's session ends at its next hook when the run is paused; when the pause is a
    person's rewind under way, the agent is told that (not "the run is paused")."""
    import io
    import json

    from shiftlog_client import Client, claude

    from agents import lifecycle
    from agents.models import PauseCause

    base, agent_token, _ = shiftlog
    with Client(base, agent_token, agent=AGENT) as client:
        run_id = client.create_run("write done.txt", checks=["true"], provider="external").id
    lifecycle.transition(
        run_id, RunStatus.PAUSED, actor="user:boss", reason="by a person", cause=PauseCause(cause)
    )
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "url": base,
                "token": agent_token,
                "agent": AGENT,
                "run": run_id,
                "root": str(tmp_path),
            }
        )
    )
    event = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(event)))
    assert claude.hook(str(state)) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["continue"] is False
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    if cause == "rewind":
        assert "rewinding the run to an earlier checkpoint" in answer["stopReason"], answer
    else:
        assert answer["stopReason"].startswith("Shiftlog: the run is paused"), answer
    assert json.loads(state.read_text())["stop"] == answer["stopReason"]
