"""Helpers for an agent that runs outside Shiftlog and drives an external run through the API:
ask before each tool, report each result, record each turn's usage, upload the workspace,
hand off, finish."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Unpack

from . import _ops as ops
from ._async_client import AsyncClient
from ._base import TRANSPORT_ERRORS
from ._client import Client
from ._models import (
    STOPPED_STATUSES,
    Context,
    FinishResult,
    ResultAck,
    ToolDecision,
    TurnResult,
    WorkspaceUpload,
)

# A tool function returns its output, or (output, is_error) to report a failure it caught.
ToolReturn = str | tuple[str, bool] | Any
ToolFn = Callable[[Any], ToolReturn]
AsyncToolFn = Callable[[Any], ToolReturn | Awaitable[ToolReturn]]

# Polling a pending call survives this many dropped connections in a row.
POLL_TRANSPORT_RETRIES = 5


@dataclass(frozen=True)
class ToolOutcome:
    """What became of one tool call: Shiftlog's decision, whether it ran, and what to tell
    the model (`output`, `is_error`)."""

    decision: ToolDecision
    output: str
    is_error: bool
    ran: bool

    def tool_result(self, tool_use_id: str) -> dict[str, Any]:
        """The outcome as a Messages API `tool_result` content block."""
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.output,
            "is_error": self.is_error,
        }


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    if isinstance(output, dict | list):
        return json.dumps(output)
    return "" if output is None else str(output)


def _split(value: ToolReturn) -> tuple[str, bool]:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bool):
        return _text(value[0]), value[1]
    return _text(value), False


def _not_allowed(decision: ToolDecision) -> ToolOutcome:
    why = decision.reason or f"the decision was {decision.decision}"
    status = f" (the run is {decision.run_status})" if decision.run_status else ""
    return ToolOutcome(decision, f"Not run: Shiftlog refused this call: {why}{status}", True, False)


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def message_usage(message: Any) -> dict[str, Any]:
    """A Messages API reply (the SDK's `Message` or its JSON) as `turn(...)`'s arguments."""
    blocks = _field(message, "content") or []
    text = "\n".join(_field(b, "text") or "" for b in blocks if _field(b, "type") == "text").strip()
    usage = _field(message, "usage") or {}
    return {
        "text": text,
        "model": _field(message, "model") or "",
        "input_tokens": _field(usage, "input_tokens") or 0,
        "output_tokens": _field(usage, "output_tokens") or 0,
        "cache_read_tokens": _field(usage, "cache_read_input_tokens") or 0,
        "cache_write_tokens": _field(usage, "cache_creation_input_tokens") or 0,
    }


def _settled(first: ToolDecision, final: ToolDecision, asked_input: Any) -> ToolDecision:
    """The final decision, keeping what only the first answer carried."""
    changes: dict[str, Any] = {}
    if final.input is None and final.allowed:
        changes["input"] = first.input if first.input is not None else asked_input
    if final.approval is None and first.approval is not None:
        changes["approval"] = first.approval
    return dataclasses.replace(final, **changes) if changes else final


class _RunState:
    run_id: int
    status: str
    session: int | None
    # The harness asks the agent to hand off (the session is at its limit): call handoff().
    handoff_requested: bool = False

    def _context(self, context: Context) -> Context:
        self.session = context.session
        self.handoff_requested = context.handoff_requested
        self._seen(context.run_status)
        return context

    def _seen(self, run_status: str) -> None:
        if run_status:
            self.status = run_status

    @property
    def active(self) -> bool:
        """False once the run is paused, cancelled, failed or succeeded: time to stop."""
        return self.status not in STOPPED_STATUSES

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


class ExternalRun(_RunState):
    """One external run, driven from here. `status` is the run's status as last answered."""

    def __init__(self, client: Client, run_id: int, *, poll_wait: float = ops.MAX_WAIT) -> None:
        self.client = client
        self.run_id = int(run_id)
        self.poll_wait = poll_wait
        self.status = ""
        self.session = None

    @classmethod
    def create(cls, client: Client, goal: str, **spec: Unpack[ops.RunSpec]) -> ExternalRun:
        """Create an external run (`checks` are its done-conditions) and drive it."""
        spec["provider"] = "external"
        run = client.create_run(goal, **spec)
        self = cls(client, run.id)
        self.status = run.status
        return self

    def context(self) -> Context:
        """What this session starts from; its `first_message` is the model's first prompt."""
        return self._context(self.client.run_context(self.run_id))

    def heartbeat(self) -> str:
        self._seen(self.client.heartbeat(self.run_id))
        return self.status

    def turn(
        self,
        text: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> TurnResult:
        """Record one model turn and its usage (counted against the run's budgets)."""
        result = self.client.record_turn(
            self.run_id,
            text,
            model,
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
        )
        self._seen(result.run_status)
        self.handoff_requested = result.handoff_requested
        return result

    def record_message(self, message: Any) -> TurnResult:
        """`turn(...)` for a Messages API reply: its text, model and usage."""
        return self.turn(**message_usage(message))

    def ask(self, tool: str, input: Any, *, timeout: float | None = None) -> ToolDecision:
        """Ask before running a tool. On `ask` wait (long-polling) until a person decides, or
        `timeout` seconds pass (TimeoutError). Run the call only if `.allowed`, with `.input`."""
        first = self.client.request_tool_call(self.run_id, tool, input)
        self._seen(first.run_status)
        decision = first
        deadline = None if timeout is None else time.monotonic() + timeout
        drops = 0
        while decision.pending:
            wait = self.poll_wait
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no decision on {tool} call {first.id} in {timeout} s")
                wait = min(wait, left)
            try:
                decision = self.client.get_tool_call(first.id, wait=max(1.0, wait))
            except TRANSPORT_ERRORS:
                drops += 1
                if drops > POLL_TRANSPORT_RETRIES:
                    raise
                self.client._sleep(1.0)
                continue
            drops = 0
            self._seen(decision.run_status)
        return _settled(first, decision, input)

    def result(self, call_id: str, output: Any, is_error: bool = False) -> ResultAck:
        """Report an allowed call's output (once per call)."""
        ack = self.client.report_tool_result(call_id, output, is_error)
        self._seen(ack.run_status)
        return ack

    def run_tool(self, tool: str, input: Any, fn: ToolFn) -> ToolOutcome:
        """Ask; if allowed or approved run `fn(input)` with the input to run (a person may have
        edited it) and report its output (an exception is reported as an error); return what to
        tell the model. `fn` may return `(output, is_error)`."""
        decision = self.ask(tool, input)
        if not decision.allowed:
            return _not_allowed(decision)
        try:
            output, is_error = _split(fn(decision.input))
        except Exception as exc:
            output, is_error = f"{type(exc).__name__}: {exc}", True
        self.result(decision.id, output, is_error)
        return ToolOutcome(decision, output, is_error, True)

    def upload_workspace(self, folder: str | os.PathLike[str]) -> WorkspaceUpload:
        """Make the run's workspace this folder's content (checked by `finish`)."""
        return self.client.upload_workspace(self.run_id, folder)

    def handoff(
        self,
        summary: str,
        *,
        done: Iterable[str] = (),
        next_steps: Iterable[str] = (),
        open_questions: Iterable[str] = (),
    ) -> Context:
        """End this session with a handoff; the answer is the next session's context."""
        context = self.client.handoff(
            self.run_id, summary, done=done, next_steps=next_steps, open_questions=open_questions
        )
        return self._context(context)

    def finish(self, summary: str) -> FinishResult:
        """Claim done: the harness runs the checks on the uploaded workspace. `passed` and
        `report()` say whether the run succeeded and, if not, what failed."""
        result = self.client.finish(self.run_id, summary)
        self._seen(result.run_status)
        return result


class AsyncExternalRun(_RunState):
    """`ExternalRun` for asyncio: the same methods, awaitable."""

    def __init__(
        self, client: AsyncClient, run_id: int, *, poll_wait: float = ops.MAX_WAIT
    ) -> None:
        self.client = client
        self.run_id = int(run_id)
        self.poll_wait = poll_wait
        self.status = ""
        self.session = None

    @classmethod
    async def create(
        cls, client: AsyncClient, goal: str, **spec: Unpack[ops.RunSpec]
    ) -> AsyncExternalRun:
        spec["provider"] = "external"
        run = await client.create_run(goal, **spec)
        self = cls(client, run.id)
        self.status = run.status
        return self

    async def context(self) -> Context:
        return self._context(await self.client.run_context(self.run_id))

    async def heartbeat(self) -> str:
        self._seen(await self.client.heartbeat(self.run_id))
        return self.status

    async def turn(
        self,
        text: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> TurnResult:
        result = await self.client.record_turn(
            self.run_id,
            text,
            model,
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
        )
        self._seen(result.run_status)
        self.handoff_requested = result.handoff_requested
        return result

    async def record_message(self, message: Any) -> TurnResult:
        return await self.turn(**message_usage(message))

    async def ask(self, tool: str, input: Any, *, timeout: float | None = None) -> ToolDecision:
        first = await self.client.request_tool_call(self.run_id, tool, input)
        self._seen(first.run_status)
        decision = first
        deadline = None if timeout is None else time.monotonic() + timeout
        drops = 0
        while decision.pending:
            wait = self.poll_wait
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no decision on {tool} call {first.id} in {timeout} s")
                wait = min(wait, left)
            try:
                decision = await self.client.get_tool_call(first.id, wait=max(1.0, wait))
            except TRANSPORT_ERRORS:
                drops += 1
                if drops > POLL_TRANSPORT_RETRIES:
                    raise
                await asyncio.sleep(1.0)
                continue
            drops = 0
            self._seen(decision.run_status)
        return _settled(first, decision, input)

    async def result(self, call_id: str, output: Any, is_error: bool = False) -> ResultAck:
        ack = await self.client.report_tool_result(call_id, output, is_error)
        self._seen(ack.run_status)
        return ack

    async def run_tool(self, tool: str, input: Any, fn: AsyncToolFn) -> ToolOutcome:
        """As `ExternalRun.run_tool`; `fn` may be a plain or an async function."""
        decision = await self.ask(tool, input)
        if not decision.allowed:
            return _not_allowed(decision)
        try:
            value = fn(decision.input)
            if inspect.isawaitable(value):
                value = await value
            output, is_error = _split(value)
        except Exception as exc:
            output, is_error = f"{type(exc).__name__}: {exc}", True
        await self.result(decision.id, output, is_error)
        return ToolOutcome(decision, output, is_error, True)

    async def upload_workspace(self, folder: str | os.PathLike[str]) -> WorkspaceUpload:
        return await self.client.upload_workspace(self.run_id, folder)

    async def handoff(
        self,
        summary: str,
        *,
        done: Iterable[str] = (),
        next_steps: Iterable[str] = (),
        open_questions: Iterable[str] = (),
    ) -> Context:
        context = await self.client.handoff(
            self.run_id, summary, done=done, next_steps=next_steps, open_questions=open_questions
        )
        return self._context(context)

    async def finish(self, summary: str) -> FinishResult:
        result = await self.client.finish(self.run_id, summary)
        self._seen(result.run_status)
        return result
