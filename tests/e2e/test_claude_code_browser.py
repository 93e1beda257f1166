"""A person supervises the REAL Claude Code CLI in the browser (issue 30): they make a token for
the external run on its page ("Connect an agent"), shiftlog-claude drives the run with it, Claude
Code's risky Bash call waits in the inbox, the person approves it in headless Chromium, the call
runs and the run goes on to succeed on the harness's checks.

Claude Code, its `manage.py serve` and the fake Messages API run in a loopback-only network
namespace (tests/claude_stage.py); the person's browser talks to a daphne outside it, on the same
database, as a second web server of one deployment does."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from agents import services
from agents.models import Approval
from agents.runspec import RunSpec
from api.models import ApiToken
from tests.claude_stage import CHECKS, Stage, _why_not, text, tool_use
from tests.e2e.helpers import CHROMIUM, log_in, serve_env, wait_http
from tests.procs import Procs, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_a_person_approves_claude_codes_risky_call_in_the_browser(
    tmp_path, namespace_procs, pages, eve
):
    if (why := _why_not()) is not None:
        pytest.skip(why)

    def steps(repo: Path) -> list:
        return [
            [text("Cleaning up first."), tool_use("toolu_b1", "Bash", command="rm -rf build")],
            [tool_use("toolu_b2", "Write", file_path=f"{repo}/done.txt", content="yes\n")],
            [text("Done: done.txt says yes.")],
        ]

    stage = Stage(tmp_path, namespace_procs, steps)
    web = Procs(tmp_path)
    try:
        port = free_port()
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        web.spawn("daphne", [*argv, "shiftlog.asgi:application"], serve_env(tmp_path))
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/accounts/login/", timeout=60)
        spec = RunSpec(goal="Write done.txt saying yes", checks=CHECKS, provider="external")
        run = services.create_run(spec, created_by=eve)
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")
        page.click("#make-run-token")
        command = page.inner_text("#connect-command-text")
        token = re.fullmatch(
            r"SHIFTLOG_URL=\S+ SHIFTLOG_TOKEN=(\S+) shiftlog-claude --run \d+", command
        )
        assert token and command.endswith(f"--run {run.pk}"), command
        # The agent drives the run with the token made for it (and nothing else could).
        stage.env["SHIFTLOG_TOKEN"] = token.group(1)
        agent = stage.agent("--run", str(run.pk))
        waiting = stage.pending()
        assert waiting.tool_name == "Bash" and waiting.tool_input["command"] == "rm -rf build"
        assert (stage.repo / "build").exists()  # it waits: nothing ran

        page.goto(f"{base}/approvals/")
        assert "rm -rf build" in page.inner_text("#approval-list")
        page.click(".approval.a-pending button[value=approve]", timeout=30_000)
        page.wait_for_selector(".approval.a-approved", timeout=30_000)

        assert agent.wait(timeout=180) == 0, stage.tail()
        run.refresh_from_db()
        assert run.status == "succeeded", (run.status, run.status_reason, stage.tail())
        decided = Approval.objects.get(pk=waiting.pk)
        assert decided.status == "approved" and decided.decided_by == eve
        assert not (stage.repo / "build").exists()  # the approved call ran
        assert (stage.repo / "done.txt").read_text() == "yes\n"
        assert ApiToken.objects.get(run=run).last_used_at is not None  # its token drove it
    finally:
        web.close()
        stage.close()
