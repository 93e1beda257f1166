"""The real model provider: one Messages API call per turn, through the anthropic SDK.

The SDK does the retrying (exponential backoff with jitter, honouring `retry-after`) on 429,
5xx, 529 and connection errors; this module only turns what is left into a ProviderError the
runtime can act on, and marks the stable prefix of every request for prompt caching.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import pydantic

from agents.providers.base import (
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailable,
    Turn,
    TurnRequest,
    Usage,
)

EPHEMERAL = {"type": "ephemeral"}

# Block types that may carry cache_control (thinking blocks, for one, may not).
_CACHEABLE_BLOCKS = {"text", "image", "document", "tool_use", "tool_result"}

_PAUSED = "the run is paused — resume it later"

_STATUS_LABELS = {
    408: "timed out",
    409: "reported a conflict",
    429: "rate limited the run",
    500: "had an internal error",
    502: "had a bad gateway",
    503: "is unavailable",
    504: "timed out at the gateway",
    529: "is overloaded",
}


class AnthropicProvider:
    name = "anthropic"
    offline = False

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        max_retries: int = 4,
        timeout: float = 600.0,
        strict: bool = False,
    ) -> None:
        self._api_key = api_key or ""
        self.max_retries = max_retries
        self.timeout = timeout
        # Without a key there is nothing to build: next_turn says so instead of calling out.
        self._client: anthropic.Anthropic | None = None
        if self._api_key:
            self._client = anthropic.Anthropic(
                api_key=self._api_key,
                base_url=base_url,
                max_retries=max_retries,
                timeout=timeout,
                _strict_response_validation=strict,
            )

    def next_turn(self, request: TurnRequest) -> Turn:
        if self._client is None:
            raise ProviderAuthError(
                "ANTHROPIC_API_KEY is not set: set it in the environment of the worker "
                "(or choose the scripted provider), then resume the run"
            )
        started = time.perf_counter()
        try:
            message = self._client.messages.create(
                model=request.model,
                max_tokens=request.max_tokens,
                system=_system_blocks(request.system),
                tools=_tools_with_cache_breakpoint(request.tools),
                messages=_messages_with_cache_breakpoint(request.messages),
                **({"tool_choice": request.tool_choice} if request.tool_choice else {}),
            )
        except anthropic.APIError as err:
            raise self._translate(err) from err
        except json.JSONDecodeError as err:
            # The SDK lets a 2xx with a non-JSON body escape as a bare decode error.
            raise ProviderUnavailable(_malformed(f"not JSON: {err.msg}"), status_code=None) from err
        latency_ms = (time.perf_counter() - started) * 1000
        return _to_turn(message, latency_ms)

    def _translate(self, err: anthropic.APIError) -> ProviderError:
        """The ProviderError the runtime should see for an SDK error, with a message for people."""
        attempts = _plural(_attempts(err, self.max_retries))
        if isinstance(err, anthropic.APIResponseValidationError):
            return ProviderUnavailable(
                _malformed(self._redact(_validation_summary(err))), status_code=err.status_code
            )
        if isinstance(err, anthropic.APITimeoutError):
            return ProviderUnavailable(
                f"Anthropic API did not answer within {self.timeout:g}s after {attempts}; {_PAUSED}"
            )
        if isinstance(err, anthropic.APIConnectionError):
            reason = self._redact(str(err.__cause__ or err.message))
            return ProviderUnavailable(
                f"Could not connect to the Anthropic API at {err.request.url} after {attempts} "
                f"({reason}); {_PAUSED}"
            )
        if not isinstance(err, anthropic.APIStatusError):
            return ProviderUnavailable(
                f"Anthropic API error: {self._redact(err.message)}; {_PAUSED}"
            )

        status = err.status_code
        detail = self._redact(err.api_message or _body_text(err.body))
        if status == 401:
            return ProviderAuthError(
                "Anthropic API rejected the API key (401): check ANTHROPIC_API_KEY, then resume",
                status_code=status,
            )
        if status == 403:
            return ProviderAuthError(
                f"Anthropic API denied permission (403): {detail}. Check that ANTHROPIC_API_KEY "
                "may use this model, then resume",
                status_code=status,
            )
        if status == 402:
            # A billing problem is fixed by a person, after which the same run can go on.
            return ProviderAuthError(
                f"Anthropic API refused the request for billing (402): {detail}. Fix billing "
                "for ANTHROPIC_API_KEY, then resume",
                status_code=status,
            )
        if status in _STATUS_LABELS or status >= 500:
            label = _STATUS_LABELS.get(status, "failed")
            return ProviderUnavailable(
                f"Anthropic API {label} ({status}) after {attempts}: {detail}; {_PAUSED}",
                status_code=status,
            )
        # 400, 404, 413, 422 and the like: the request itself is wrong, so retrying cannot help.
        return ProviderRequestError(
            f"Anthropic API rejected the request ({status}): {detail}", status_code=status
        )

    def _redact(self, text: str) -> str:
        """`text` from the API or the SDK, with the key blanked out should it ever appear."""
        # A real key is long; a very short one (tests, typos) would match inside ordinary words.
        if len(self._api_key) < 8:
            return text
        return text.replace(self._api_key, "[redacted]")


def _system_blocks(system: str) -> list[dict[str, Any]] | anthropic.Omit:
    # The API rejects an empty text block, so an empty system prompt is left out.
    if not system:
        return anthropic.omit
    return [{"type": "text", "text": system, "cache_control": EPHEMERAL}]


def _tools_with_cache_breakpoint(
    tools: list[dict[str, Any]],
) -> list[dict[str, Any]] | anthropic.Omit:
    # The cached prefix runs tools, then system, then messages: a breakpoint after the last tool
    # keeps the tools cached even when the system prompt differs (another run, another goal).
    if not tools:
        return anthropic.omit
    return [*tools[:-1], {**tools[-1], "cache_control": EPHEMERAL}]


def _messages_with_cache_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` with a cache breakpoint on the last block of the last message.

    In an agent loop each request repeats the previous one plus a turn or two, so marking the
    end of the conversation lets the next request read everything before it from the cache
    instead of paying full price for the whole history again.
    """
    if not messages:
        return []
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str) and content:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content and isinstance(content[-1], dict):
        blocks = list(content)
    else:
        return list(messages)
    if blocks[-1].get("type") not in _CACHEABLE_BLOCKS:
        return list(messages)
    blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
    return [*messages[:-1], {**last, "content": blocks}]


def _to_turn(message: anthropic.types.Message, latency_ms: float) -> Turn:
    usage = message.usage
    return Turn(
        content=[_block_dict(block) for block in message.content],
        stop_reason=message.stop_reason or "",
        usage=Usage(
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        ),
        model=message.model,
        latency_ms=latency_ms,
        meta={"request_id": message.id},
    )


def _block_dict(block: Any) -> dict[str, Any]:
    """A content block as a plain dict that can be sent back in the next request."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    # thinking, redacted_thinking, server tool blocks...: keep them whole (a thinking block's
    # signature must come back unchanged), minus the None fields the API would not accept.
    return block.model_dump(mode="json", exclude_none=True)


def _attempts(err: anthropic.APIError, max_retries: int) -> int:
    # The SDK stamps each attempt with its retry number; fall back to the configured maximum.
    try:
        return int(err.request.headers["x-stainless-retry-count"]) + 1
    except (AttributeError, KeyError, ValueError):
        return max_retries + 1


def _plural(attempts: int) -> str:
    return "1 attempt" if attempts == 1 else f"{attempts} attempts"


def _body_text(body: object) -> str:
    if body is None:
        return "no details given"
    text = body if isinstance(body, str) else json.dumps(body)
    return text[:300]


def _validation_summary(err: anthropic.APIResponseValidationError) -> str:
    cause = err.__cause__
    if isinstance(cause, pydantic.ValidationError):
        problems = [
            f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}"
            for e in cause.errors()[:3]
        ]
        return "; ".join(problems)
    return err.message


def _malformed(detail: str) -> str:
    return (
        f"Anthropic API returned a response that is not a valid Message ({detail}); the run is "
        "paused — check the base URL and the anthropic SDK version, then resume"
    )
