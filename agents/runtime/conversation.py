"""A session's conversation, rebuilt from the event log and extended step by step.

The log is the truth; this is a view of it that the runtime keeps in memory only for the length
of one slice. Rebuilding it from the events and extending it turn by turn give the same messages,
which the tests check.

Notes from people (human.note) and messages from the harness reach the agent in the user message
after the model turn that was being computed when they arrived: each model.turn records the last
seq its request saw (`context_seq`), so a note that came in while the model was thinking is placed
after that turn, as it really was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agents.models import EventKind

INTERRUPTED = (
    "interrupted: the worker stopped while this tool call was in progress. It was not run "
    "again; check the workspace before relying on its effects."
)


@dataclass
class _Pending:
    seq: int
    block: dict[str, Any]


@dataclass
class Conversation:
    first_message: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0
    # tool_use blocks of the latest assistant turn, and which of them were started / answered
    open_tool_uses: list[dict[str, Any]] = field(default_factory=list)
    called: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    handoff_requested: bool = False
    last_text: str = ""
    _results: list[_Pending] = field(default_factory=list)
    _texts: list[_Pending] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages.append(
                {"role": "user", "content": [{"type": "text", "text": self.first_message}]}
            )
            self.chars += len(self.first_message)

    # --- building -----------------------------------------------------------------------
    def add_assistant(
        self, content: list[dict[str, Any]], *, context_seq: int | None = None
    ) -> None:
        self._flush(upto=context_seq)
        self.messages.append({"role": "assistant", "content": content})
        self.chars += len(json.dumps(content))
        self.open_tool_uses = [b for b in content if b.get("type") == "tool_use"]
        self.called, self.answered = set(), set()
        self.last_text = "\n".join(b["text"] for b in content if b.get("type") == "text")

    def add_tool_call(self, tool_use_id: str) -> None:
        self.called.add(tool_use_id)

    def add_tool_result(self, seq: int, tool_use_id: str, output: str, is_error: bool) -> None:
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": output,
        }
        if is_error:
            block["is_error"] = True
        self._results.append(_Pending(seq, block))
        self.answered.add(tool_use_id)
        self.chars += len(output) + 60

    def add_text(self, seq: int, text: str) -> None:
        self._texts.append(_Pending(seq, {"type": "text", "text": text}))
        self.chars += len(text)

    def _flush(self, upto: int | None = None) -> None:
        texts = [p for p in self._texts if upto is None or p.seq <= upto]
        if not self._results and not texts:
            return
        # The API wants tool results first in a user message, then any text.
        blocks = [p.block for p in self._results] + [p.block for p in texts]
        self._results = []
        self._texts = [p for p in self._texts if p not in texts]
        last = self.messages[-1]
        if last["role"] == "user":
            last["content"].extend(blocks)
        else:
            self.messages.append({"role": "user", "content": blocks})

    def request_messages(self) -> list[dict[str, Any]]:
        """The messages for the next request (everything pending is delivered)."""
        self._flush()
        return self.messages

    # --- state --------------------------------------------------------------------------
    def unfinished_tool_uses(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(started but never answered, never started) tool uses of the latest turn."""
        interrupted = [
            b
            for b in self.open_tool_uses
            if b["id"] in self.called and b["id"] not in self.answered
        ]
        # A call answered without being called (denied by the policy, refused as a flood) is
        # done: it is not planned again.
        not_started = [
            b
            for b in self.open_tool_uses
            if b["id"] not in self.called and b["id"] not in self.answered
        ]
        return interrupted, not_started

    # --- rebuilding ---------------------------------------------------------------------
    @classmethod
    def from_events(cls, events: list[tuple[int, str, dict[str, Any]]]) -> Conversation:
        """Rebuild from (seq, kind, payload) of one session, in seq order."""
        if not events or events[0][1] != EventKind.SESSION_STARTED:
            raise ValueError("a session's events must start with session.started")
        conv = cls(first_message=events[0][2]["first_message"])
        for seq, kind, payload in events[1:]:
            conv.apply(seq, kind, payload)
        return conv

    def apply(self, seq: int, kind: str, payload: dict[str, Any]) -> None:
        if kind == EventKind.MODEL_TURN:
            self.add_assistant(payload["content"], context_seq=payload.get("context_seq"))
        elif kind == EventKind.TOOL_CALL:
            self.add_tool_call(payload["tool_use_id"])
        elif kind == EventKind.TOOL_RESULT:
            self.add_tool_result(
                seq, payload["tool_use_id"], payload["output"], payload["is_error"]
            )
        elif kind == EventKind.HUMAN_NOTE:
            self.add_text(
                seq, f"A note from {payload.get('author', 'a person')}: {payload['text']}"
            )
        elif kind == EventKind.HARNESS_MESSAGE:
            self.add_text(seq, payload["text"])
            if payload.get("reason") == "handoff_requested":
                self.handoff_requested = True
