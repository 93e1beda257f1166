"""A plain agent loop with the `anthropic` SDK, driving an external Shiftlog run.

Shiftlog is the harness: the agent asks it before every tool call (a risky one waits for a
person), reports every result, records every turn's usage against the run's budgets, uploads its
workspace and calls `finish`, and Shiftlog runs the run's checks itself. The model and the tools
run here, in this process and in `--workspace`.

    python examples/plain_anthropic_loop/agent.py --url http://127.0.0.1:8000 \\
        --token shl_… --run 12 --workspace /tmp/agent-ws

The Messages API is reached with ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL, if set).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
from shiftlog_client import Client, ExternalRun, ShiftlogError

SYSTEM = (
    "You work in a folder of your own through two tools: `bash` runs a command there and "
    "`write_file` writes a file there. Every tool call is checked by a supervisor; a call it "
    "refuses comes back as an error saying why: do not try to get around it. When the goal is "
    "met, answer without a tool call: the supervisor then runs the goal's checks itself and tells "
    "you what failed, if anything."
)

TOOLS: list[dict[str, Any]] = [
    {
        "name": "bash",
        "description": "Run a bash command in the workspace folder; returns its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "write_file",
        "description": "Write a text file (path relative to the workspace), replacing it.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
]

OUTPUT_LIMIT = 20_000


class Tools:
    """The agent's hands, confined to its workspace folder."""

    def __init__(self, workspace: Path, timeout: float) -> None:
        self.workspace = workspace.resolve()
        self.timeout = timeout

    def bash(self, input: dict[str, Any]) -> tuple[str, bool]:
        try:
            done = subprocess.run(
                ["bash", "-c", str(input["command"])],
                cwd=self.workspace,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {self.timeout:g} s", True
        output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:].rstrip()
        return f"{output}\n[exit {done.returncode}]".lstrip(), done.returncode != 0

    def write_file(self, input: dict[str, Any]) -> str:
        target = (self.workspace / str(input["path"])).resolve()
        if not target.is_relative_to(self.workspace):
            raise ValueError(f"{input['path']} is outside the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        content = str(input["content"])
        target.write_text(content)
        return f"wrote {len(content)} characters to {input['path']}"

    def __getitem__(self, name: str):
        if name not in ("bash", "write_file"):
            raise KeyError(name)
        return getattr(self, name)


class Agent:
    def __init__(
        self,
        run: ExternalRun,
        model: anthropic.Anthropic,
        tools: Tools,
        *,
        model_name: str,
        max_iterations: int,
        max_tokens: int = 4096,
        log=print,
    ) -> None:
        self.run = run
        self.model = model
        self.tools = tools
        self.model_name = model_name
        self.max_iterations = max_iterations
        self.max_tokens = max_tokens
        self.log = log

    def call_tool(self, block: Any) -> dict[str, Any]:
        try:
            fn = self.tools[block.name]
        except KeyError:
            return {"type": "tool_result", "tool_use_id": block.id, "is_error": True,
                    "content": f"no tool named {block.name}"}  # fmt: skip
        outcome = self.run.run_tool(block.name, block.input, fn)
        how = "ran" if outcome.ran else "refused"
        self.log(f"  {block.name} {outcome.decision.decision} ({how}): {outcome.output[:200]!r}")
        return outcome.tool_result(block.id)

    def hand_off(self, messages: list[dict[str, Any]], last_text: str) -> list[dict[str, Any]]:
        """The harness asks for a handoff (the session is at its limit): upload the workspace,
        hand off, and start the next session from what Shiftlog gives back."""
        self.run.upload_workspace(self.tools.workspace)
        context = self.run.handoff(
            last_text or "Working towards the goal; see the workspace.",
            next_steps=["carry on towards the goal from the workspace as it is"],
        )
        self.log(f"handed off; session {context.session} starts")
        return [{"role": "user", "content": context.first_message}]

    def loop(self) -> str:
        """Drive the run until it succeeds, stops (paused, cancelled, failed) or the iterations
        run out; returns the run's status as last seen."""
        context = self.run.context()
        self.log(f"run {self.run.run_id}, session {context.session}: {context.run_status}")
        messages: list[dict[str, Any]] = [{"role": "user", "content": context.first_message}]
        for iteration in range(1, self.max_iterations + 1):
            if not self.run.active:
                break
            reply = self.model.messages.create(
                model=self.model_name,
                max_tokens=self.max_tokens,
                system=SYSTEM,
                tools=TOOLS,
                messages=messages,
            )
            self.run.record_message(reply)
            text = "\n".join(b.text for b in reply.content if b.type == "text").strip()
            self.log(f"turn {iteration}: {text[:200]!r}")
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            calls = [b for b in reply.content if b.type == "tool_use"]
            if calls:
                messages.append({"role": "user", "content": [self.call_tool(b) for b in calls]})
                if self.run.handoff_requested and self.run.active:
                    messages = self.hand_off(messages, text)
                continue
            if not self.run.active:
                break
            # No tool call: the model says it is done. Shiftlog checks.
            upload = self.run.upload_workspace(self.tools.workspace)
            self.log(
                f"uploaded the workspace: checkpoint {upload.checkpoint}, {upload.files} files"
            )
            result = self.run.finish(text or "Done.")
            self.log(f"finish: passed={result.passed}, run {result.run_status}")
            if result.passed:
                break
            messages.append({"role": "user", "content": result.report()})
        return self.run.status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"), required=False)
    parser.add_argument("--token", default=os.environ.get("SHIFTLOG_TOKEN"))
    parser.add_argument("--run", type=int, required=True, help="the external run's id")
    parser.add_argument("--workspace", type=Path, required=True, help="the agent's own folder")
    parser.add_argument("--model", default=os.environ.get("AGENT_MODEL", "claude-sonnet-4-5"))
    parser.add_argument("--max-iterations", type=int, default=40)
    parser.add_argument("--bash-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token (or SHIFTLOG_URL and SHIFTLOG_TOKEN) are required")
    args.workspace.mkdir(parents=True, exist_ok=True)
    with Client(args.url, args.token) as shiftlog:
        agent = Agent(
            ExternalRun(shiftlog, args.run),
            anthropic.Anthropic(),
            Tools(args.workspace, args.bash_timeout),
            model_name=args.model,
            max_iterations=args.max_iterations,
            log=lambda line: print(line, flush=True),
        )
        try:
            status = agent.loop()
        except ShiftlogError as e:
            print(f"Shiftlog refused: {e}", file=sys.stderr)
            return 2
    print(f"run {args.run} is {status}", flush=True)
    return 0 if status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
