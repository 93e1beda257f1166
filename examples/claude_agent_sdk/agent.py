"""A Claude Agent SDK agent supervised by Shiftlog, on the hooks `shiftlog-claude` ships.

Claude Code (the CLI the SDK drives) plans and runs the tools in `--workspace`; Shiftlog's hooks
(shiftlog_client.claude, installed through the SDK's `settings`) are the harness around it:
every tool call is asked (a person may approve, edit or deny it in the inbox), results and
usage are reported, and when Claude says it is done the harness runs the run's checks: failing
checks send it back to work, passing checks end the run `succeeded`. A session that ends
without the checks passing hands off, and the next starts from the handoff.

    python examples/claude_agent_sdk/agent.py --url http://127.0.0.1:8000 --run 12 \\
        --workspace /tmp/agent-ws        # SHIFTLOG_TOKEN in the environment
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query
from shiftlog_client import STOPPED_STATUSES, Client
from shiftlog_client.claude import hooked, upload

TOOLS = ["Bash", "Read", "Write", "Edit"]


async def session(prompt: str, options: ClaudeAgentOptions) -> str:
    """One Claude Code session (one context window); its last words."""
    last = ""
    async for message in query(prompt=prompt, options=options):
        if isinstance(message, ResultMessage):
            last = message.result or ""
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"))
    parser.add_argument("--run", type=int, required=True, help="the external run's id")
    parser.add_argument("--workspace", type=Path, required=True, help="the agent's own folder")
    parser.add_argument("--model", default=os.environ.get("AGENT_MODEL", "claude-sonnet-4-5"))
    parser.add_argument("--max-sessions", type=int, default=5)
    args = parser.parse_args(argv)
    token = os.environ.get("SHIFTLOG_TOKEN", "")
    if not args.url or not token:
        parser.error("--url (or SHIFTLOG_URL) and SHIFTLOG_TOKEN are required")
    root = args.workspace.resolve()
    agent = f"agent-sdk-{args.run}"
    with Client(args.url, token, agent=agent) as shiftlog:
        upload(shiftlog, args.run, root)
        with hooked(args.url, token, args.run, root, agent=agent) as (settings, _):
            options = ClaudeAgentOptions(
                cwd=str(root),
                model=args.model,
                tools=TOOLS,
                settings=str(settings),
                setting_sources=["user"],  # the repository's .claude/ cannot turn the hooks off
                env={"SHIFTLOG_TOKEN": "", "SHIFTLOG_URL": ""},
            )
            for _ in range(args.max_sessions):
                context = shiftlog.run_context(args.run)
                if context.run_status in STOPPED_STATUSES:
                    break
                print(f"run {args.run}, session {context.session}", flush=True)
                last = asyncio.run(session(context.first_message, options))
                if shiftlog.get_run(args.run).status in STOPPED_STATUSES:
                    break
                upload(shiftlog, args.run, root)  # out of context before the checks passed
                shiftlog.handoff(args.run, last or "the session ended before the checks passed")
        run = shiftlog.get_run(args.run)
    print(f"run {args.run} is {run.status}", flush=True)
    return 0 if run.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
