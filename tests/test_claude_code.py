"""`shiftlog-claude` end to end with the REAL Claude Code CLI (pinned, installed by
`make claude-code` outside the git tree), answering from the fake Messages API, inside a network
namespace that holds only loopback: the Shiftlog server, the fake and Claude Code all run there,
and the test (a person) decides through the shared database.

One run: a risky Bash call waits in the inbox and a person approves it with an edit (it runs as
edited, and the agent is told); a Write to a protected file by absolute path is refused; Claude
Code says it is done, the harness's checks fail, it is told why, fixes the file, and the run
succeeds on the harness's checks; its usage is posted as turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import approvals, rewinds, services
from agents.models import Approval, Event, Run
from tests.claude_stage import CHECKS, Stage, _why_not, text, tool_use

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_claude_code_under_shiftlog(tmp_path, namespace_procs):
    if (why := _why_not()) is not None:
        pytest.skip(why)

    def steps(repo: Path) -> list:
        return [
            [text("Cleaning up first."), tool_use("toolu_01", "Bash", command="rm -rf build")],
            [tool_use("toolu_05", "Bash", command="env > env.txt")],
            [tool_use("toolu_02", "Write", file_path=f"{repo}/tests/test_a.py", content="x")],
            [tool_use("toolu_03", "Write", file_path=f"{repo}/done.txt", content="no\n")],
            [text("Done: done.txt is written.")],
            [tool_use("toolu_04", "Write", file_path=f"{repo}/done.txt", content="yes\n")],
            [text("Fixed: done.txt says yes.")],
        ]

    stage = Stage(tmp_path, namespace_procs, steps)
    repo = stage.repo
    args = [a for c in CHECKS for a in ("--check", c)]
    agent = stage.agent("--goal", "Write done.txt saying yes", *args, "--protect", "tests/")
    # A person edits the risky call before approving it.
    waiting = stage.pending()
    assert waiting.tool_name == "Bash" and waiting.tool_input["command"] == "rm -rf build"
    approvals.decide(
        waiting.pk,
        user=stage.boss,
        approve=True,
        edited_input={**waiting.tool_input, "command": "rm -rf build/tmp"},
        comment="keep build/keep.txt",
    )
    assert agent.wait(timeout=180) == 0, stage.tail()

    run = Run.objects.get()
    assert run.status == "succeeded", (run.status, run.status_reason, stage.tail())
    assert run.is_external and run.turns >= 6 and run.input_tokens >= 6000, run.__dict__
    # The edited call ran as edited.
    assert (repo / "build" / "keep.txt").exists() and not (repo / "build" / "tmp").exists()
    assert (repo / "done.txt").read_text() == "yes\n"
    assert not (repo / "tests").exists()
    events = list(Event.objects.filter(run=run).order_by("seq").values_list("kind", "payload"))
    calls = [p for k, p in events if k == "tool.call"]
    assert any(p.get("input", {}).get("command") == "rm -rf build/tmp" for p in calls), calls
    results = [p for k, p in events if k == "tool.result"]
    assert any("tests/test_a.py is protected" in p.get("output", "") for p in results), results
    checks = [p["passed"] for k, p in events if k == "check.result"]
    assert False in checks and checks[-2:] == [True, True], checks
    # What Claude Code read: the person's edit, the refusal, the failing checks.
    said = stage.said()
    assert "edited this call" in said and "keep build/keep.txt" in said
    assert "is protected" in said
    assert "do not pass yet" in said and "grep -qx yes done.txt" in said
    # The agent's token never reached Claude Code's requests or its tools' environment.
    assert stage.token not in said
    seen_by_bash = (repo / "env.txt").read_text()
    assert "ANTHROPIC_BASE_URL" in seen_by_bash and stage.token not in seen_by_bash
    stage.close()


def test_a_rewind_a_pause_and_a_handoff_with_claude_code(tmp_path, namespace_procs):
    """A rewind while the agent waits ends its session, restores the local files and the next
    session is told; a pause while it waits ends the session (the call is withdrawn); attached
    again after the resume, a context window that ends hands off to a session that starts from
    the handoff; the harness's checks end the run."""
    if (why := _why_not()) is not None:
        pytest.skip(why)

    def steps(repo: Path) -> list:
        return [
            [tool_use("toolu_11", "Write", file_path=f"{repo}/notes.txt", content="one\n")],
            [tool_use("toolu_12", "Bash", command="rm -rf build")],  # waits: rewound
            [tool_use("toolu_13", "Bash", command="rm -rf build")],  # waits: paused
            [tool_use("toolu_14", "Write", file_path=f"{repo}/done.txt", content="no\n")],
            [tool_use("toolu_15", "Write", file_path=f"{repo}/more.txt", content="x\n")],
            [tool_use("toolu_16", "Write", file_path=f"{repo}/done.txt", content="yes\n")],
            [text("Done.")],
        ]

    stage = Stage(tmp_path, namespace_procs, steps)
    repo = stage.repo
    args = [a for c in CHECKS for a in ("--check", c)]
    agent = stage.agent("--goal", "Write done.txt saying yes", *args)
    first = stage.pending()
    run = Run.objects.get()
    assert (repo / "notes.txt").exists()
    start = run.checkpoints.filter(kind="upload").order_by("number").first()
    rewinds.rewind(run.pk, start.pk, actor="user:boss", note="start again, keep build")
    second = stage.wait(
        "the next session's call",
        lambda: Approval.objects.filter(status="pending").exclude(pk=first.pk).first(),
        120,
    )
    assert Approval.objects.get(pk=first.pk).status == "discarded"
    # The local folder is the checkpoint's again, and the new session was told.
    assert not (repo / "notes.txt").exists() and (repo / "build" / "tmp" / "junk.o").exists()
    assert f"rewind to checkpoint {start.number}) start again, keep build" in stage.said()

    services.pause_run(run.pk, actor="user:boss", reason="lunch")
    assert agent.wait(timeout=120) == 1, stage.tail()
    assert Approval.objects.get(pk=second.pk).status == "withdrawn"
    assert "is paused (lunch)" in stage.logs[1].read_text()
    assert Run.objects.get().status == "paused"

    services.resume_run(run.pk, actor="user:boss")
    again = stage.agent("--run", str(run.pk), "--", "--max-turns", "2")
    assert again.wait(timeout=180) == 0, stage.tail()
    run = Run.objects.get()
    assert run.status == "succeeded", (run.status, run.status_reason, stage.tail())
    sessions = list(run.sessions.order_by("index").values_list("index", "end_reason"))
    assert len(sessions) >= 3, sessions
    # The session that ran out of turns handed off; the next started from the handoff.
    handoff = Event.objects.filter(run=run, kind="session.started").order_by("seq").last()
    assert "the session ended before the checks passed" in handoff.payload["first_message"]
    assert "the session ended before the checks passed" in stage.said()
    assert (repo / "done.txt").read_text() == "yes\n"
    stage.close()
