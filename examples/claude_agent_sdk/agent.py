"""A Claude Agent SDK agent whose tool permissions are Shiftlog's to give.

Claude Code (the CLI the SDK drives) plans and runs the tools in `--workspace`; Shiftlog is the
harness around it:

- a `PreToolUse` hook asks Shiftlog about every tool call before it runs (`ask`): allowed, it
  runs with the input Shiftlog returns (a person may have edited it: `updatedInput`); asked, the
  hook waits while a person decides in Shiftlog's inbox; denied, it does not run and Claude reads
  the reason. `can_use_tool` asks the same way for any call that reaches it undecided;
- a `PostToolUse` hook (and `PostToolUseFailure`) reports what the tool did;
- each query's usage, from its `ResultMessage`, is recorded as a turn against the run's budgets;
- when Claude stops, the workspace is uploaded and `finish` called: Shiftlog runs the run's
  checks itself, and what failed goes back to Claude as the next prompt.

    python examples/claude_agent_sdk/agent.py --url http://127.0.0.1:8000 --token shl_… \\
        --run 12 --workspace /tmp/agent-ws
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    HookContext,
    HookMatcher,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    TextBlock,
    ToolPermissionContext,
)
from shiftlog_client import AsyncClient, AsyncExternalRun, ShiftlogError, ToolDecision

# The tools Claude gets: enough to do a task in a folder.
TOOLS = ["Bash", "Read", "Write", "Edit"]
OUTPUT_LIMIT = 20_000


def tool_output(response: Any) -> str:
    """A tool's response as text for Shiftlog's log (Bash answers stdout and stderr)."""
    if isinstance(response, str):
        return response
    if isinstance(response, dict) and ("stdout" in response or "stderr" in response):
        parts = [str(response.get("stdout") or ""), str(response.get("stderr") or "")]
        return "\n".join(p for p in parts if p)
    return json.dumps(response, default=str)


class ShiftlogHooks:
    """The Shiftlog-facing part of the agent: permission decisions and results."""

    def __init__(self, run: AsyncExternalRun, log=print) -> None:
        self.run = run
        self.log = log
        # Claude's tool_use_id -> Shiftlog's decision (its call id, the input to run).
        self.decisions: dict[str, ToolDecision] = {}

    async def decide(self, tool: str, tool_input: dict[str, Any], tool_use_id: str | None):
        if tool_use_id and tool_use_id in self.decisions:
            return self.decisions[tool_use_id]
        decision = await self.run.ask(tool, tool_input)
        ran = "" if decision.input == tool_input else f" as {json.dumps(decision.input)[:160]}"
        self.log(f"  {tool} {json.dumps(tool_input)[:160]}: {decision.decision}{ran}")
        if tool_use_id:
            self.decisions[tool_use_id] = decision
        return decision

    def _refusal(self, decision: ToolDecision) -> str:
        why = decision.reason or f"the decision was {decision.decision}"
        return f"Shiftlog refused this call: {why}"

    async def pre_tool_use(
        self, input: dict[str, Any], tool_use_id: str | None, context: HookContext
    ) -> dict[str, Any]:
        """PreToolUse: Shiftlog decides every call before it runs."""
        decision = await self.decide(input["tool_name"], input["tool_input"], tool_use_id)
        if decision.allowed:
            out: dict[str, Any] = {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": f"Shiftlog: {decision.decision}",
            }
            if decision.input != input["tool_input"]:
                out["updatedInput"] = decision.input  # a person edited it
            return {"hookSpecificOutput": out}
        answer: dict[str, Any] = {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": self._refusal(decision),
            }
        }
        if not self.run.active:  # paused or cancelled: stop here
            answer["continue_"] = False
            answer["stopReason"] = f"the Shiftlog run is {self.run.status}"
        return answer

    async def can_use_tool(
        self, tool: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        """Claude Code's permission callback, for a call that reaches it undecided."""
        decision = await self.decide(tool, tool_input, context.tool_use_id)
        if decision.allowed:
            return PermissionResultAllow(updated_input=decision.input)
        return PermissionResultDeny(message=self._refusal(decision), interrupt=not self.run.active)

    async def post_tool_use(
        self, input: dict[str, Any], tool_use_id: str | None, context: HookContext
    ) -> dict[str, Any]:
        """PostToolUse: report what the tool did (once per call Shiftlog allowed)."""
        await self._report(tool_use_id, tool_output(input.get("tool_response")), False)
        return {}

    async def post_tool_use_failure(
        self, input: dict[str, Any], tool_use_id: str | None, context: HookContext
    ) -> dict[str, Any]:
        await self._report(tool_use_id, str(input.get("error") or "the tool failed"), True)
        return {}

    async def _report(self, tool_use_id: str | None, output: str, is_error: bool) -> None:
        decision = self.decisions.pop(tool_use_id or "", None)
        if decision is None or not decision.allowed or decision.id is None:
            return  # not a call Shiftlog cleared: nothing ran
        await self.run.result(decision.id, output[-OUTPUT_LIMIT:], is_error)

    async def record(self, result: ResultMessage, model: str) -> None:
        """A query's usage, as a turn of the run (counted against its budgets)."""
        usage = result.usage or {}
        await self.run.turn(
            result.result or "",
            model,
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            int(usage.get("cache_read_input_tokens") or 0),
            int(usage.get("cache_creation_input_tokens") or 0),
        )

    def hooks(self) -> dict[str, list[HookMatcher]]:
        return {
            "PreToolUse": [HookMatcher(hooks=[self.pre_tool_use], timeout=3600)],
            "PostToolUse": [HookMatcher(hooks=[self.post_tool_use])],
            "PostToolUseFailure": [HookMatcher(hooks=[self.post_tool_use_failure])],
        }


def options(hooks: ShiftlogHooks, workspace: Path, model: str, max_turns: int, **extra: Any):
    return ClaudeAgentOptions(
        cwd=str(workspace),
        model=model,
        tools=TOOLS,
        hooks=hooks.hooks(),  # type: ignore[arg-type]
        can_use_tool=hooks.can_use_tool,
        setting_sources=[],  # no user or project settings: Shiftlog's word is the only one
        max_turns=max_turns,
        **extra,
    )


async def one_query(client: ClaudeSDKClient, prompt: str, log) -> ResultMessage | None:
    await client.query(prompt)
    result = None
    async for message in client.receive_response():
        if isinstance(message, AssistantMessage):
            for block in message.content:
                if isinstance(block, TextBlock) and block.text.strip():
                    log(f"claude: {block.text.strip()[:200]!r}")
        elif isinstance(message, ResultMessage):
            result = message
    return result


async def drive(
    run: AsyncExternalRun,
    workspace: Path,
    *,
    model: str,
    max_rounds: int = 10,
    max_turns: int = 30,
    log=print,
    **extra: Any,
) -> str:
    """Run Claude on the run's goal until the run succeeds or stops, or the rounds run out."""
    hooks = ShiftlogHooks(run, log)
    context = await run.context()
    prompt = context.first_message
    log(f"run {run.run_id}, session {context.session}: {context.run_status}")
    rounds = 0
    while rounds < max_rounds and run.active:
        async with ClaudeSDKClient(options(hooks, workspace, model, max_turns, **extra)) as claude:
            while rounds < max_rounds and run.active:
                rounds += 1
                result = await one_query(claude, prompt, log)
                if result is None:
                    raise RuntimeError("Claude Code ended without a result")
                await hooks.record(result, model)
                if not run.active:
                    break
                if run.handoff_requested:
                    await run.upload_workspace(workspace)
                    context = await run.handoff(result.result or "See the workspace.")
                    prompt = context.first_message
                    log(f"handed off; session {context.session} starts")
                    break  # a fresh Claude session for the next Shiftlog session
                upload = await run.upload_workspace(workspace)
                log(f"uploaded the workspace: checkpoint {upload.checkpoint}")
                verdict = await run.finish(result.result or "Done.")
                log(f"finish: passed={verdict.passed}, run {verdict.run_status}")
                if verdict.passed:
                    return run.status
                prompt = verdict.report()
    return run.status


async def amain(args: argparse.Namespace) -> int:
    async with AsyncClient(args.url, args.token) as shiftlog:
        run = AsyncExternalRun(shiftlog, args.run)
        try:
            status = await drive(
                run,
                args.workspace,
                model=args.model,
                max_rounds=args.max_rounds,
                max_turns=args.max_turns,
                log=lambda line: print(line, flush=True),
            )
        except ShiftlogError as e:
            print(f"Shiftlog refused: {e}", file=sys.stderr)
            return 2
    print(f"run {args.run} is {status}", flush=True)
    return 0 if status == "succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"))
    parser.add_argument("--token", default=os.environ.get("SHIFTLOG_TOKEN"))
    parser.add_argument("--run", type=int, required=True, help="the external run's id")
    parser.add_argument("--workspace", type=Path, required=True, help="the agent's own folder")
    parser.add_argument("--model", default=os.environ.get("AGENT_MODEL", "claude-sonnet-4-5"))
    parser.add_argument("--max-rounds", type=int, default=10, help="finish attempts at most")
    parser.add_argument("--max-turns", type=int, default=30, help="Claude's turns per round")
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token (or SHIFTLOG_URL and SHIFTLOG_TOKEN) are required")
    args.workspace.mkdir(parents=True, exist_ok=True)
    args.workspace = args.workspace.resolve()
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
