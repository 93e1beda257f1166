"""What a trace says of the model's and the tools' content, when the operator asks for it.

Off by default: the spans then hold sizes and short previews only (agents/telemetry.py). With
SHIFTLOG_OTEL_CONTENT=1 the spans carry the GenAI semantic conventions' content attributes, as
JSON strings (the conventions allow that on spans):

- a `chat` span: `gen_ai.output.messages` (the turn: its text and tool calls, with the finish
  reason) and `gen_ai.input.messages` (what the model was given since its previous turn in the
  session: the session's first message, then the tools' results, people's notes, the harness's
  messages; the whole conversation is the session's chat spans in order);
- an `execute_tool` span: `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result`.

Every text (a message part, a tool's arguments or result) is cut to OTEL_CONTENT_CHARS
characters, and the secrets the log knows of are redacted again on the way out
(`eventlog.redact`): the log redacted them when it stored the payload, and a secret configured
since is caught here too.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from agents import eventlog

INPUT = "gen_ai.input.messages"
OUTPUT = "gen_ai.output.messages"
ARGUMENTS = "gen_ai.tool.call.arguments"
RESULT = "gen_ai.tool.call.result"


def enabled() -> bool:
    """Whether the operator asked for content (`export_trace --content` asks for one export)."""
    return bool(settings.SHIFTLOG["OTEL_CONTENT"])


def cut(text: str) -> str:
    """`text` redacted, then cut to the stated size with what was left out said."""
    text = eventlog.redact(text)
    limit = max(int(settings.SHIFTLOG["OTEL_CONTENT_CHARS"]), 1)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def messages(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, ensure_ascii=False)


def text_message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": cut(text)}]}


def tool_response(tool_use_id: str, output: Any) -> dict[str, Any]:
    return {
        "role": "tool",
        "parts": [
            {"type": "tool_call_response", "id": tool_use_id, "result": cut(as_text(output))}
        ],
    }


def output_message(content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
    """A model turn's content blocks as one output message of the conventions."""
    parts: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and block.get("text"):
            parts.append({"type": "text", "content": cut(str(block["text"]))})
        elif block.get("type") == "tool_use":
            parts.append(
                {
                    "type": "tool_call",
                    "id": str(block.get("id") or ""),
                    "name": str(block.get("name") or ""),
                    "arguments": cut(as_text(block.get("input") or {})),
                }
            )
    return {"role": "assistant", "parts": parts, "finish_reason": str(stop_reason or "")}


def turn_attributes(
    on: bool, given: list[dict[str, Any]], content: list[dict[str, Any]], stop_reason: str | None
) -> dict[str, str]:
    if not on:
        return {}
    return {
        INPUT: messages(given),
        OUTPUT: messages([output_message(content, stop_reason)]),
    }


def tool_arguments(on: bool, tool_input: Any) -> dict[str, str]:
    if not on or tool_input is None:
        return {}
    return {ARGUMENTS: cut(as_text(tool_input))}


def tool_result(on: bool, output: Any) -> dict[str, str]:
    if not on:
        return {}
    return {RESULT: cut(as_text(output))}
