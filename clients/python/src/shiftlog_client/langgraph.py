"""A LangGraph graph supervised as a Shiftlog external run (`pip install
"shiftlog-client[langgraph]"`).

Inside a node, `run_tool(tool, input, fn)` (or `approval(tool, input)`) pauses the graph with
LangGraph's own `interrupt()`; `drive(graph, run, input)` answers each such interrupt by asking
Shiftlog (the run's policy, or a person in the inbox) and resumes the graph with
`Command(resume=decision)`: the node gets the decision, runs the call with the input as decided
(a person may have edited it) or tells the model why not, and the result is reported. Every
graph step's AI messages are posted as turns with their usage. When the graph ends, the
workspace is uploaded and `finish` called: the harness runs the checks; if they fail, their
report goes back into the graph as a user message and it runs again.

The graph needs a checkpointer (e.g. `InMemorySaver`) for interrupts to resume.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langgraph.config import get_config
from langgraph.types import Command, interrupt

from ._external import ExternalRun, ToolFn, _split
from ._models import FinishResult

# The interrupt value that marks a request for Shiftlog (other interrupts are the caller's).
KIND = "shiftlog.tool_call"
RUN_KEY = "shiftlog_run"


@dataclass(frozen=True)
class Decision:
    """What a node gets back from `approval`: whether to run the call, with which input, and,
    if not, why (the text to give the model)."""

    allowed: bool
    input: Any
    reason: str
    call_id: str | None
    decision: str

    @classmethod
    def from_resume(cls, value: Any) -> Decision:
        if isinstance(value, Decision):
            return value
        return cls(**{f.name: value.get(f.name) for f in dataclasses.fields(cls)})


def approval(tool: str, input: Any) -> Decision:
    """Pause the graph until Shiftlog decides on this call (inside a node driven by `drive`)."""
    return Decision.from_resume(interrupt({"kind": KIND, "tool": tool, "input": input}))


def run_tool(tool: str, input: Any, fn: ToolFn) -> str:
    """In a node: ask Shiftlog about the call, run `fn(input as decided)` if allowed and report
    its output (an exception is reported as an error); return what to tell the model."""
    decision = approval(tool, input)
    if not decision.allowed:
        return f"Not run: Shiftlog refused this call: {decision.reason or decision.decision}"
    try:
        output, is_error = _split(fn(decision.input))
    except Exception as exc:
        output, is_error = f"{type(exc).__name__}: {exc}", True
    run = get_config().get("configurable", {}).get(RUN_KEY)
    if run is not None and decision.call_id:
        run.result(decision.call_id, output, is_error)
    return f"Error: {output}" if is_error else output


def _decide(run: ExternalRun, request: dict[str, Any]) -> Decision:
    answer = run.ask(request["tool"], request.get("input"))
    why = answer.reason or ("" if answer.allowed else f"the decision was {answer.decision}")
    return Decision(answer.allowed, answer.input, why, answer.id, answer.decision)


def _messages(update: Any) -> list[Any]:
    if not isinstance(update, dict):
        return []
    found = update.get("messages") or []
    return list(found) if isinstance(found, list | tuple) else [found]


def message_turn(message: Any) -> dict[str, Any] | None:
    """A LangChain AI message as `turn(...)`'s arguments, or None if it is not one."""
    if getattr(message, "type", None) != "ai":
        return None
    usage = getattr(message, "usage_metadata", None) or {}
    details = usage.get("input_token_details") or {}
    meta = getattr(message, "response_metadata", None) or {}
    content = message.content
    if isinstance(content, list):
        content = "\n".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return {
        "text": str(content or ""),
        "model": str(meta.get("model_name") or meta.get("model") or ""),
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cache_read_tokens": int(details.get("cache_read") or 0),
        "cache_write_tokens": int(details.get("cache_creation") or 0),
    }


def _checks_failed(result: FinishResult) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": result.report()}]}


def _last_text(state: Any) -> str:
    messages = state.get("messages") if isinstance(state, dict) else None
    if messages:
        return str(getattr(messages[-1], "content", "") or "")
    return "The graph ended."


def drive(
    graph: Any,
    run: ExternalRun,
    input: Any,
    *,
    workspace: str | os.PathLike[str] | None = None,
    config: dict[str, Any] | None = None,
    max_finishes: int = 3,
    on_checks_failed: Callable[[FinishResult], Any] = _checks_failed,
) -> FinishResult | None:
    """Run `graph` to its end under `run`: Shiftlog's interrupts answered, each step's usage
    posted, then the checks through `finish` (failures fed back with `on_checks_failed`, up to
    `max_finishes` times). Returns the last verdict, or None if the run stopped first."""
    config = dict(config or {})
    configurable = dict(config.get("configurable") or {})
    configurable.setdefault("thread_id", f"shiftlog-run-{run.run_id}-{uuid.uuid4().hex[:8]}")
    configurable[RUN_KEY] = run
    config["configurable"] = configurable
    verdict: FinishResult | None = None
    pending: Any = input
    for _ in range(max_finishes):
        while pending is not None:
            asks: list[Any] = []
            for update in graph.stream(pending, config, stream_mode="updates"):
                for node, values in update.items():
                    if node == "__interrupt__":
                        asks.extend(i for i in values if _is_ours(i.value))
                        continue
                    for message in _messages(values):
                        turn = message_turn(message)
                        if turn is not None:
                            run.turn(**turn)
            if not run.active:
                return None
            pending = None
            if asks:  # each pending interrupt answered by its id
                answers = {i.id: dataclasses.asdict(_decide(run, i.value)) for i in asks}
                pending = Command(resume=answers)
        if workspace is not None:
            run.upload_workspace(workspace)
        verdict = run.finish(_last_text(graph.get_state(config).values))
        if verdict.passed or not run.active:
            return verdict
        pending = on_checks_failed(verdict)
    return verdict


def _is_ours(value: Any) -> bool:
    return isinstance(value, dict) and value.get("kind") == KIND
