"""What every model provider speaks: a request for one assistant turn, and the turn.

Messages and content blocks use the Anthropic Messages API shapes (plain dicts), so the
scripted provider and the real one are interchangeable behind the same runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_input_tokens
            + self.cache_creation_input_tokens
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
        }


@dataclass
class TurnRequest:
    model: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int = 4096
    # The `meta` of the previous model.turn in this run (the scripted provider keeps its place
    # in the script there, so it stays stateless between steps).
    previous_meta: dict[str, Any] = field(default_factory=dict)
    # True when the harness has just asked the agent to write its handoff.
    handoff_requested: bool = False
    # Characters in system + tools + messages, kept up to date by the runtime, so an offline
    # provider can estimate input tokens without serialising the whole conversation each step.
    input_chars: int = 0
    # The seq where the run's live branch began (0 until a rewind): a replayed script turn gets
    # new tool_use ids, so its calls are new calls with their own approvals.
    branch: int = 0
    # Force a tool (the judge must answer with `verdict`).
    tool_choice: dict[str, Any] | None = None


@dataclass
class Turn:
    content: list[
        dict[str, Any]
    ]  # {"type": "text", "text"} | {"type": "tool_use", "id", "name", "input"}
    stop_reason: str  # end_turn | tool_use | max_tokens | stop_sequence | ...
    usage: Usage
    model: str
    latency_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(b["text"] for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]


class ProviderError(Exception):
    """A provider could not produce a turn. `action` says what the run should do."""

    action = "pause"  # pause | fail

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class ProviderUnavailable(ProviderError):
    """Rate limited, overloaded or down, still so after retries: pause, resume later."""

    action = "pause"


class ProviderAuthError(ProviderError):
    """Missing or rejected credentials: stop at once and say what to set."""

    action = "pause"


class ProviderRequestError(ProviderError):
    """The provider rejected the request itself (400): retrying will not help."""

    action = "fail"


class ScriptExhausted(ProviderError):
    action = "fail"


class ProviderCrashed(ProviderError):
    """The provider raised something it should not have (a bug, or input it could not read):
    the run fails with what happened rather than the worker retrying it forever."""

    action = "fail"


class Provider(Protocol):
    name: str
    offline: bool

    def next_turn(self, request: TurnRequest) -> Turn: ...
