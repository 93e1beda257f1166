"""The real Claude Code CLI under shiftlog-claude, staged for a test (tests/test_claude_code.py,
tests/e2e/test_claude_code_browser.py): a network namespace that holds only loopback, a real
`manage.py serve` and the scripted fake Messages API (tests/claude_play.py) in it, a repository
for Claude Code, and the agent started there with a token of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.models import Approval
from tests.e2e.helpers import serve_env
from tests.helpers import user_with
from tests.procs import BASE_DIR, Procs, dying_with_us, free_port

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
def namespace_procs():
    """The processes a Stage starts (tests/conftest.py makes it every test's fixture)."""
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
