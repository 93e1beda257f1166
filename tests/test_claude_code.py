"""`shiftlog-claude` end to end with the REAL Claude Code CLI (pinned, installed by
`make claude-code` outside the git tree), answering from the fake Messages API, inside a network
namespace that holds only loopback: the Shiftlog server, the fake and Claude Code all run there,
and the test (a person) decides through the shared database.

One run: a risky Bash call waits in the inbox and a person approves it with an edit (it runs as
edited, and the agent is told); a Write to a protected file by absolute path is refused; Claude
Code says it is done, the harness's checks fail, it is told why, fixes the file, and the run
succeeds on the harness's checks; its usage is posted as turns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import approvals, rewinds, services
from agents.models import Approval, Event, Run
from tests.e2e.helpers import serve_env
from tests.helpers import user_with
from tests.procs import BASE_DIR, Procs, dying_with_us
from tests.test_serve import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CLAUDE_VERSION = "2.1.328"
CLAUDE = (
    Path(os.environ.get("SHIFTLOG_CLAUDE_CODE_DIR", BASE_DIR / "var" / "claude-code"))
    / "node_modules"
    / "@anthropic-ai"
    / "claude-code-linux-x64"
    / "claude"
)
CLIENT_SRC = BASE_DIR / "clients" / "python" / "src"
CHECKS = ["test -f done.txt", "grep -qx yes done.txt"]
# Claude Code calls out unless told not to (FACTS.md, "Claude Code, offline").
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


def _why_not() -> str | None:
    if not CLAUDE.exists():
        return f"Claude Code {CLAUDE_VERSION} is not installed: run `make claude-code` (npm)"
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return "needs root with unshare and nsenter for a loopback-only network namespace"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.decode()[:200]}"
    return None


def tool_use(call_id: str, name: str, **tool_input) -> dict:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def text(words: str) -> dict:
    return {"type": "text", "text": words}


class Namespace:
    """A network namespace holding only loopback, kept by a sleeping process; others join it."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.holder = self.start(
            ["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep 3600"], join=False
        )
        time.sleep(0.3)

    def start(self, argv: list[str], *, join: bool = True, **kwargs) -> subprocess.Popen:
        if join:
            argv = ["nsenter", "-t", str(self.holder.pid), "-n", "--", *argv]
        argv = [shutil.which(argv[0]) or argv[0], *argv[1:]]  # execv takes a path
        proc = subprocess.Popen(dying_with_us(argv), start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        argv = ["nsenter", "-t", str(self.holder.pid), "-n", "--", *argv]
        return subprocess.run(argv, capture_output=True, check=False, **kwargs)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in reversed(started):
        if proc.poll() is None:
            os.killpg(proc.pid, 2)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


def wait_until(what: str, check, timeout: float, logs: list[Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


class Stage:
    """The namespace with a real `manage.py serve` and the scripted fake in it, a repository
    for Claude Code, and `agent(...)`: shiftlog-claude started there with the agent's token."""

    def __init__(self, tmp_path: Path, procs: list[subprocess.Popen], steps) -> None:
        user_with("agent")
        self.boss = user_with("boss", "decide_approval", "view_run", "control_run")
        out = Procs(tmp_path).manage("create_token", "--user", "agent", "--scopes", "read,write")
        self.token = out.strip().splitlines()[-1]
        # Claude Code works in a repository of its own; HOME and TMPDIR are throwaway.
        self.play = Path(f"/var/tmp/shiftlog-claude-{os.getpid()}-{tmp_path.name}")
        self.repo, home, tmp = self.play / "repo", self.play / "home", self.play / "tmp"
        for folder in (self.repo / "build" / "tmp", home, tmp):
            folder.mkdir(parents=True)
        (self.repo / "build" / "keep.txt").write_text("kept\n")
        (self.repo / "build" / "tmp" / "junk.o").write_text("junk\n")
        (self.repo / "README.md").write_text("# a project\n")
        # A repository setting that would switch the hooks off: --setting-sources user
        # ignores it.
        (self.repo / ".claude").mkdir()
        (self.repo / ".claude" / "settings.json").write_text(json.dumps({"disableAllHooks": True}))
        self.script = self.play / "script.json"
        self.script.write_text(json.dumps(steps(self.repo)))
        self.logs = [tmp_path / "serve.log", self.play / "claude.log"]
        self.ns = Namespace(procs)
        port = free_port()
        self.ns.start(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"],
            env=serve_env(tmp_path),
            cwd=BASE_DIR,
            stdout=self.logs[0].open("w"),
            stderr=subprocess.STDOUT,
        )
        port_file = self.play / "fake.port"
        play = BASE_DIR / "tests" / "claude_play.py"
        self.ns.start([sys.executable, str(play), str(self.script), str(port_file)], cwd=BASE_DIR)
        base = f"http://127.0.0.1:{port}"
        probe = f"import urllib.request as u; u.urlopen('{base}/accounts/login/', timeout=2)"
        self.wait(
            "the server",
            lambda: (
                self.ns.run([sys.executable, "-c", probe]).returncode == 0 and port_file.exists()
            ),
            60,
        )
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))
        }
        self.env.update(
            {
                "PYTHONPATH": str(CLIENT_SRC),
                "SHIFTLOG_URL": base,
                "SHIFTLOG_TOKEN": self.token,
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port_file.read_text()}",
                "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
                "HOME": str(home),
                "TMPDIR": str(tmp),
                **QUIET,
            }
        )

    def agent(self, *args: str) -> subprocess.Popen:
        return self.ns.start(
            [
                sys.executable,
                "-m",
                "shiftlog_client.claude",
                "--agent",
                "claude-e2e",
                "--claude",
                str(CLAUDE),
                "--dir",
                str(self.repo),
                *args,
            ],
            env=self.env,
            cwd=self.repo,
            stdout=self.logs[1].open("a"),
            stderr=subprocess.STDOUT,
        )

    def wait(self, what: str, check, timeout: float):
        return wait_until(what, check, timeout, self.logs)

    def pending(self):
        return self.wait(
            "an approval", lambda: Approval.objects.filter(status="pending").first(), 120
        )

    def requests(self) -> list[dict]:
        log = self.script.with_suffix(".requests.jsonl")
        return [json.loads(line) for line in log.open()]

    def said(self) -> str:
        """Everything Claude Code sent in its main loop's requests."""
        return "\n".join(
            json.dumps([r.get("system"), r.get("messages", [])])
            for r in self.requests()
            if r.get("tools")
        )

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in self.logs if p.exists())

    def close(self) -> None:
        shutil.rmtree(self.play, ignore_errors=True)


def test_claude_code_under_shiftlog(tmp_path, procs):
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

    stage = Stage(tmp_path, procs, steps)
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


def test_a_rewind_a_pause_and_a_handoff_with_claude_code(tmp_path, procs):
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

    stage = Stage(tmp_path, procs, steps)
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
