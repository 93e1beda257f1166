"""An OpenAI Agents SDK agent supervised as a Shiftlog external run (`pip install
"shiftlog-client[openai-agents]"`).

`drive(agent, run, input)` runs the agent with the SDK's own human-in-the-loop flow: every
function tool is made to need approval (`needs_approval`; or only those you marked, with
`ask_every_tool=False`), each interruption (`result.interruptions`) is asked of Shiftlog (the
run's policy answers, or a person in the inbox), and the answer resumes the run from its
`RunState`: `approve`, or `reject` with the reason as the text the model reads. Each model
response's usage is posted as a turn, each tool's output reported. When the agent gives its
final output, the workspace is uploaded and `finish` called: the harness runs the run's checks;
if they fail, their report goes back to the agent as a user message and it goes on.

The SDK approves a call only as the model made it: a person's edit cannot be run in its place,
so an edited call is rejected with the edited arguments in the message, for the model to call
again with them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from agents.items import ModelResponse, ToolApprovalItem

from agents import Agent, FunctionTool, RunHooks, Runner

from ._external import AsyncExternalRun, _text
from ._models import FinishResult

NOT_RUN = "Not run: Shiftlog refused this call: "


def _arguments(item: ToolApprovalItem) -> Any:
    raw = item.arguments
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _model_name(agent: Agent[Any]) -> str:
    model = agent.model
    if isinstance(model, str):
        return model
    return str(getattr(model, "model", None) or type(model).__name__ if model else "")


def response_text(response: ModelResponse) -> str:
    """The text of a model response's messages (tool calls left out)."""
    parts: list[str] = []
    for item in response.output:
        if getattr(item, "type", None) != "message":
            continue
        for content in getattr(item, "content", None) or []:
            text = getattr(content, "text", None)
            if text:
                parts.append(text)
    return "\n".join(parts).strip()


class ShiftlogHooks(RunHooks[Any]):
    """Posts each model response's usage as a turn and reports each approved call's output."""

    def __init__(self, run: AsyncExternalRun) -> None:
        self.run = run
        self.calls: dict[str, str] = {}  # the SDK's call id -> Shiftlog's

    async def on_llm_end(self, context: Any, agent: Agent[Any], response: ModelResponse) -> None:
        usage = response.usage
        cached = getattr(usage.input_tokens_details, "cached_tokens", 0) or 0
        await self.run.turn(
            response_text(response),
            _model_name(agent),
            usage.input_tokens,
            usage.output_tokens,
            cache_read_tokens=cached,
        )

    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Any, result: Any) -> None:
        call = self.calls.pop(getattr(context, "tool_call_id", None) or "", None)
        if call is not None:
            await self.run.result(call, _text(result))


def asking(agent: Agent[Any]) -> Agent[Any]:
    """A copy of `agent` whose every function tool needs approval (so Shiftlog sees each)."""
    tools = [
        dataclasses.replace(t, needs_approval=True) if isinstance(t, FunctionTool) else t
        for t in agent.tools
    ]
    return agent.clone(tools=tools)


async def answer(run: AsyncExternalRun, state: Any, item: ToolApprovalItem, hooks: ShiftlogHooks):
    """Ask Shiftlog about one interruption and approve or reject it on `state`."""
    asked = _arguments(item)
    decision = await run.ask(item.name or "tool", asked)
    if decision.allowed and decision.input not in (None, asked):
        edited = json.dumps(decision.input)
        if decision.id:
            await run.result(decision.id, "not run: the SDK cannot run an edited call", True)
        state.reject(
            item,
            rejection_message=f"Not run as asked: a person edited this call. Call {item.name} "
            f"again with exactly these arguments: {edited}",
        )
    elif decision.allowed:
        if decision.id and item.call_id:
            hooks.calls[item.call_id] = decision.id
        state.approve(item)
    else:
        why = decision.reason or f"the decision was {decision.decision}"
        state.reject(item, rejection_message=NOT_RUN + why)
    return decision


async def drive(
    agent: Agent[Any],
    run: AsyncExternalRun,
    input: Any,
    *,
    workspace: str | os.PathLike[str] | None = None,
    max_finishes: int = 3,
    ask_every_tool: bool = True,
    **run_kwargs: Any,
) -> FinishResult | None:
    """Run `agent` to its final output under `run` (interruptions answered by Shiftlog, usage
    posted), then the checks through `finish`, feeding failures back up to `max_finishes`
    times. `run_kwargs` go to `Runner.run` (max_turns, run_config, context). Returns the last
    verdict, or None if the run stopped first (paused, cancelled, over a budget)."""
    if ask_every_tool:
        agent = asking(agent)
    hooks = ShiftlogHooks(run)
    result = await Runner.run(agent, input, hooks=hooks, **run_kwargs)
    verdict: FinishResult | None = None
    for _ in range(max_finishes):
        while result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                await answer(run, state, item, hooks)
            if not run.active:
                return None
            result = await Runner.run(agent, state, hooks=hooks, **run_kwargs)
        if not run.active:
            return None
        if workspace is not None:
            await run.upload_workspace(workspace)
        verdict = await run.finish(_text(result.final_output) or "Done.")
        if verdict.passed or not run.active:
            return verdict
        again = [*result.to_input_list(), {"role": "user", "content": verdict.report()}]
        result = await Runner.run(agent, again, hooks=hooks, **run_kwargs)
    return verdict
