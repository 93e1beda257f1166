"""An OpenAI Agents SDK agent driving an external Shiftlog run (shiftlog_client.openai_agents).

Its two tools (`bash`, `write_file`, confined to `--workspace`) need approval: each call becomes
an interruption the adapter asks Shiftlog about (the run's policy, or a person in the inbox), and
the answer resumes the run. Each model response's usage is a turn; when the agent is done, the
workspace is uploaded and the harness runs the run's checks, feeding failures back.

    OPENAI_API_KEY=… python examples/openai_agents/agent.py --url http://127.0.0.1:8000 \\
        --token shl_… --run 12 --workspace /tmp/agent-ws
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

from shiftlog_client import AsyncClient, AsyncExternalRun
from shiftlog_client.openai_agents import drive

from agents import Agent, function_tool

INSTRUCTIONS = (
    "You work in a folder of your own through two tools: `bash` runs a command there and "
    "`write_file` writes a file there. A supervisor checks every call; a refused call comes back "
    "saying why: do not try to get around it. When the goal is met, answer without a tool call: "
    "the supervisor then runs the goal's checks and tells you what failed, if anything."
)
OUTPUT_LIMIT = 20_000


def build_agent(workspace: Path, model: Any, timeout: float = 120.0) -> Agent[Any]:
    root = workspace.resolve()

    @function_tool(needs_approval=True)
    def bash(command: str) -> str:
        """Run a bash command in the workspace folder; returns its output and exit code."""
        try:
            done = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:g} s"
        output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:].rstrip()
        return f"{output}\n[exit {done.returncode}]".lstrip()

    @function_tool(needs_approval=True)
    def write_file(path: str, content: str) -> str:
        """Write a text file (path relative to the workspace), replacing it."""
        target = (root / path).resolve()
        if not target.is_relative_to(root):
            return f"{path} is outside the workspace"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    return Agent(name="worker", instructions=INSTRUCTIONS, tools=[bash, write_file], model=model)


async def supervise(args: argparse.Namespace, model: Any) -> str:
    async with AsyncClient(args.url, args.token) as shiftlog:
        run = AsyncExternalRun(shiftlog, args.run)
        context = await run.context()
        print(f"run {run.run_id}, session {context.session}: {context.run_status}", flush=True)
        verdict = await drive(
            build_agent(args.workspace, model),
            run,
            context.first_message,
            workspace=args.workspace,
            max_finishes=args.max_finishes,
            max_turns=args.max_turns,
        )
        print(verdict.report() if verdict else f"the run stopped: {run.status}", flush=True)
        return run.status


def main(argv: list[str] | None = None, model: Any = None) -> int:
    """`model`: a model name, or an `agents` Model object (the tests pass a scripted one)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"))
    parser.add_argument("--token", default=os.environ.get("SHIFTLOG_TOKEN"))
    parser.add_argument("--run", type=int, required=True, help="the external run's id")
    parser.add_argument("--workspace", type=Path, required=True, help="the agent's own folder")
    parser.add_argument("--model", default=os.environ.get("AGENT_MODEL", "gpt-5-mini"))
    parser.add_argument("--max-turns", type=int, default=20)
    parser.add_argument("--max-finishes", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token (or SHIFTLOG_URL and SHIFTLOG_TOKEN) are required")
    args.workspace.mkdir(parents=True, exist_ok=True)
    status = asyncio.run(supervise(args, model if model is not None else args.model))
    print(f"run status: {status}", flush=True)
    return 0 if status == "succeeded" else 1


if __name__ == "__main__":
    raise SystemExit(main())
