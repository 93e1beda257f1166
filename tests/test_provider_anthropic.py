"""AnthropicProvider through the real SDK and real HTTP, against a local fake Messages API."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agents.providers.anthropic import AnthropicProvider
from agents.providers.base import (
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailable,
    TurnRequest,
    Usage,
)
from agents.providers.pricing import DEFAULT_MODEL, PRICES, cost_usd, price_for
from tests.fake_anthropic import FakeAnthropic

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer

KEY = "sk-ant-test-0123456789-secret"

BASH = {
    "name": "bash",
    "description": "Run a shell command in the workspace.",
    "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
READ = {
    "name": "read_file",
    "description": "Read a file from the workspace.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
# Fast retries: the fake sends this with every retryable error, so the SDK waits 1 ms.
NO_WAIT = {"retry-after-ms": "1"}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def make_provider(fake: FakeAnthropic, **overrides: Any) -> AnthropicProvider:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": fake.base_url,
        "max_retries": 0,
        "timeout": 5.0,
        "strict": True,
    }
    options.update(overrides)
    return AnthropicProvider(**options)


def make_request(**overrides: Any) -> TurnRequest:
    fields: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "system": "You are a careful engineer.",
        "messages": [{"role": "user", "content": "Make the failing test pass."}],
        "tools": [BASH, READ],
        "max_tokens": 1024,
    }
    fields.update(overrides)
    return TurnRequest(**fields)


def raised_by(fake: FakeAnthropic, **provider_options: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        make_provider(fake, **provider_options).next_turn(make_request())
    assert KEY not in str(info.value)
    return info.value


# -- turns -------------------------------------------------------------------------------------


def test_a_text_turn_maps_text_stop_reason_usage_and_cost(fake: FakeAnthropic) -> None:
    fake.push_message(
        [{"type": "text", "text": "All tests pass now."}],
        model="claude-sonnet-4-5-20250929",
        usage={
            "input_tokens": 1000,
            "output_tokens": 500,
            "cache_creation_input_tokens": 2000,
            "cache_read_input_tokens": 10000,
        },
    )

    turn = make_provider(fake).next_turn(make_request())

    assert turn.text == "All tests pass now."
    assert turn.content == [{"type": "text", "text": "All tests pass now."}]
    assert turn.stop_reason == "end_turn"
    assert turn.usage == Usage(
        input_tokens=1000,
        output_tokens=500,
        cache_creation_input_tokens=2000,
        cache_read_input_tokens=10000,
    )
    assert turn.model == "claude-sonnet-4-5-20250929"
    assert turn.meta["request_id"].startswith("msg_fake_")
    assert turn.latency_ms > 0
    # 1000*3 + 500*15 + 2000*3.75 + 10000*0.30 = 21,000 micro-dollars
    assert cost_usd(turn.model, turn.usage) == Decimal("0.021000")


def test_missing_cache_counts_become_zero(fake: FakeAnthropic) -> None:
    body = fake.message_body([{"type": "text", "text": "hi"}])
    body["usage"] = {"input_tokens": 7, "output_tokens": 3}
    fake.push(body)

    turn = make_provider(fake).next_turn(make_request())

    assert turn.usage == Usage(input_tokens=7, output_tokens=3)


def test_a_tool_use_turn_returns_the_call_as_a_plain_dict(fake: FakeAnthropic) -> None:
    call = {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"cmd": "pytest -q"}}
    fake.push_message(
        [{"type": "text", "text": "Running the tests."}, call], stop_reason="tool_use"
    )

    turn = make_provider(fake).next_turn(make_request())

    assert turn.stop_reason == "tool_use"
    assert turn.tool_uses == [call]
    assert turn.content[1] == call
    assert type(turn.content[1]) is dict


def test_several_tool_calls_in_one_turn_keep_their_order(fake: FakeAnthropic) -> None:
    calls = [
        {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {"n": n}}
        for n, name in enumerate(["read_file", "bash", "read_file", "bash"])
    ]
    fake.push_message(calls, stop_reason="tool_use")

    turn = make_provider(fake).next_turn(make_request())

    assert [c["id"] for c in turn.tool_uses] == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
    assert turn.tool_uses == calls


def test_a_max_tokens_stop_is_reported(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "The plan is: first"}], stop_reason="max_tokens")

    turn = make_provider(fake).next_turn(make_request())

    assert turn.stop_reason == "max_tokens"
    assert turn.text == "The plan is: first"


def test_thinking_blocks_are_kept_and_can_be_sent_back(fake: FakeAnthropic) -> None:
    thinking = {"type": "thinking", "thinking": "The test expects 3.", "signature": "sig-abc"}
    call = {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"cmd": "ls"}}
    fake.push_message([thinking, call], stop_reason="tool_use")
    fake.push_message([{"type": "text", "text": "Done."}])
    provider = make_provider(fake)

    first = provider.next_turn(make_request())
    assert first.content == [thinking, call]

    history = [
        {"role": "user", "content": "Make the failing test pass."},
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "a.py"}],
        },
    ]
    provider.next_turn(make_request(messages=history))

    assert fake.requests[1]["body"]["messages"][1]["content"] == [thinking, call]


# -- what is sent ------------------------------------------------------------------------------


def test_the_request_carries_the_turn_request_and_cache_breakpoints(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "ok"}])
    history = [
        {"role": "user", "content": "Make the failing test pass."},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
    ]

    make_provider(fake).next_turn(make_request(model="claude-haiku-4-5", messages=history))

    [sent] = fake.requests
    assert sent["method"] == "POST"
    assert sent["path"] == "/v1/messages"
    body = sent["body"]
    assert body["model"] == "claude-haiku-4-5"
    assert body["max_tokens"] == 1024
    assert body["system"] == [
        {
            "type": "text",
            "text": "You are a careful engineer.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    assert body["tools"] == [BASH, {**READ, "cache_control": {"type": "ephemeral"}}]
    # Passed through, except for the breakpoint on the very last block.
    assert body["messages"][:2] == history[:2]
    assert body["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}],
    }


def test_a_plain_string_last_message_gets_its_breakpoint_as_a_block(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "ok"}])

    make_provider(fake).next_turn(make_request())

    assert fake.requests[0]["body"]["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Make the failing test pass.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
    ]


def test_the_callers_lists_are_not_changed(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "ok"}])
    request = make_request(
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello."}]}]
    )
    before = (copy.deepcopy(request.messages), copy.deepcopy(request.tools))

    make_provider(fake).next_turn(request)

    assert (request.messages, request.tools) == before


def test_an_empty_system_prompt_and_no_tools_are_left_out(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "ok"}])

    make_provider(fake).next_turn(make_request(system="", tools=[]))

    body = fake.requests[0]["body"]
    assert "system" not in body
    assert "tools" not in body


def test_the_key_is_sent_as_a_header(fake: FakeAnthropic) -> None:
    fake.push_message([{"type": "text", "text": "ok"}])

    make_provider(fake).next_turn(make_request())

    headers = fake.requests[0]["headers"]
    assert headers.get("authorization") == f"Bearer {KEY}" or headers.get("x-api-key") == KEY
    assert KEY not in str(fake.requests[0]["body"])


# -- errors ------------------------------------------------------------------------------------


def test_a_missing_key_stops_at_once_without_calling_out(fake: FakeAnthropic) -> None:
    for key in (None, ""):
        error = raised_by(fake, api_key=key)

        assert isinstance(error, ProviderAuthError)
        assert "ANTHROPIC_API_KEY is not set" in error.message
        assert "resume" in error.message
    assert fake.requests == []


def test_a_rejected_key_is_an_auth_error_naming_the_variable(fake: FakeAnthropic) -> None:
    fake.push_error(401, "invalid x-api-key", "authentication_error")

    error = raised_by(fake, max_retries=2)

    assert isinstance(error, ProviderAuthError)
    assert error.status_code == 401
    assert error.action == "pause"
    assert "ANTHROPIC_API_KEY" in error.message
    assert len(fake.requests) == 1  # not retried


def test_permission_denied_is_an_auth_error(fake: FakeAnthropic) -> None:
    fake.push_error(403, "Your key may not use this model.", "permission_error")

    error = raised_by(fake)

    assert isinstance(error, ProviderAuthError)
    assert error.status_code == 403
    assert "Your key may not use this model." in error.message


def test_a_billing_problem_pauses_for_a_person(fake: FakeAnthropic) -> None:
    fake.push_error(402, "Your credit balance is too low.", "billing_error")

    error = raised_by(fake)

    assert isinstance(error, ProviderAuthError)
    assert error.status_code == 402
    assert "Your credit balance is too low." in error.message


@pytest.mark.parametrize(
    ("status", "err_type", "api_message"),
    [
        (400, "invalid_request_error", "messages.1: tool_use ids must be unique"),
        (404, "not_found_error", "model: claude-nope not found"),
        (413, "request_too_large", "Request exceeds the maximum allowed size"),
        (422, "invalid_request_error", "max_tokens: must be at least 1"),
    ],
)
def test_a_rejected_request_fails_with_the_apis_message(
    fake: FakeAnthropic, status: int, err_type: str, api_message: str
) -> None:
    fake.push_error(status, api_message, err_type)

    error = raised_by(fake, max_retries=2)

    assert isinstance(error, ProviderRequestError)
    assert error.action == "fail"
    assert error.status_code == status
    assert api_message in error.message
    assert len(fake.requests) == 1  # retrying cannot help, and the SDK knows it


def test_the_key_is_redacted_if_the_api_echoes_it(fake: FakeAnthropic) -> None:
    fake.push_error(400, f"bad header value {KEY}", "invalid_request_error")

    error = raised_by(fake)

    assert "[redacted]" in error.message


def test_a_rate_limit_is_retried_and_then_succeeds(fake: FakeAnthropic) -> None:
    fake.push_error(429, "Rate limited", "rate_limit_error", headers=NO_WAIT)
    fake.push_message([{"type": "text", "text": "Back again."}])

    turn = make_provider(fake, max_retries=2).next_turn(make_request())

    assert turn.text == "Back again."
    assert len(fake.requests) == 2
    assert fake.requests[0]["body"] == fake.requests[1]["body"]


def test_overload_that_outlasts_the_retries_pauses_the_run(fake: FakeAnthropic) -> None:
    for _ in range(3):
        fake.push_error(529, "Overloaded", "overloaded_error", headers=NO_WAIT)

    error = raised_by(fake, max_retries=2)

    assert isinstance(error, ProviderUnavailable)
    assert error.action == "pause"
    assert error.status_code == 529
    assert len(fake.requests) == 3
    assert "overloaded (529) after 3 attempts" in error.message
    assert "paused" in error.message
    assert "resume" in error.message


def test_a_server_error_that_persists_pauses_the_run(fake: FakeAnthropic) -> None:
    fake.push_error(500, "Internal server error", "api_error", headers=NO_WAIT)
    fake.push_error(500, "Internal server error", "api_error", headers=NO_WAIT)

    error = raised_by(fake, max_retries=1)

    assert isinstance(error, ProviderUnavailable)
    assert error.status_code == 500
    assert "after 2 attempts" in error.message


def test_an_unreachable_api_pauses_the_run() -> None:
    with FakeAnthropic() as closed:
        url = closed.base_url  # nothing listens here once the fake has stopped

    with pytest.raises(ProviderUnavailable) as info:
        AnthropicProvider(api_key=KEY, base_url=url, max_retries=0, timeout=2.0).next_turn(
            make_request()
        )

    assert "Could not connect to the Anthropic API" in info.value.message
    assert "paused" in info.value.message
    assert KEY not in info.value.message


def test_a_slow_api_times_out_and_pauses_the_run(fake: FakeAnthropic) -> None:
    fake.push(fake.message_body([{"type": "text", "text": "late"}]), delay=1.0)

    error = raised_by(fake, timeout=0.2)

    assert isinstance(error, ProviderUnavailable)
    assert "did not answer within 0.2s" in error.message


def test_a_response_without_usage_fails_strict_validation_clearly(fake: FakeAnthropic) -> None:
    body = fake.message_body([{"type": "text", "text": "hi"}])
    del body["usage"]
    fake.push(body)

    error = raised_by(fake)

    # Not the request's fault and perhaps fixed by an SDK upgrade or another base URL: pause.
    assert isinstance(error, ProviderUnavailable)
    assert "not a valid Message" in error.message
    assert "usage: Field required" in error.message


def test_a_response_that_is_not_json_pauses_the_run(fake: FakeAnthropic) -> None:
    fake.push(None, status=200)

    error = raised_by(fake)

    assert isinstance(error, ProviderUnavailable)
    assert "not JSON" in error.message


def test_the_fake_says_when_its_script_ran_out(fake: FakeAnthropic) -> None:
    error = raised_by(fake, max_retries=3)

    assert "script ran out" in error.message
    assert len(fake.requests) == 1


# -- pricing -----------------------------------------------------------------------------------


def test_tokens_cost_the_listed_price() -> None:
    # 100,000 in and out: the price per million, a tenth of it (below any long-context tier).
    tenth = Usage(input_tokens=100_000, output_tokens=100_000)

    assert cost_usd("claude-opus-4-5", tenth) == Decimal("3.000000")
    assert cost_usd("claude-opus-4-1", tenth) == Decimal("9.000000")
    assert cost_usd("claude-haiku-4-5", tenth) == Decimal("0.600000")
    assert cost_usd("claude-3-5-haiku", tenth) == Decimal("0.480000")


def test_cache_tokens_are_priced_separately() -> None:
    usage = Usage(cache_creation_input_tokens=100_000, cache_read_input_tokens=100_000)

    assert cost_usd("claude-sonnet-4-5", usage) == Decimal("0.405000")  # (3.75 + 0.30) / 10


def test_prices_come_from_the_maintained_table_which_knows_long_context_tiers() -> None:
    from agents.providers.pricing import cost

    short = cost("claude-sonnet-4-5", Usage(input_tokens=100_000))
    long = cost("claude-sonnet-4-5", Usage(input_tokens=300_000))
    assert short.source == long.source == "genai-prices"
    assert long.usd > 3 * short.usd  # past 200,000 tokens a request costs more per token


def test_a_model_in_no_table_is_priced_at_the_dearest_rate_and_marked_an_estimate() -> None:
    from agents.providers.pricing import cost

    priced = cost("claude-sonnet-4-7", Usage(input_tokens=100_000))
    assert priced.source == "fallback"
    assert priced.usd == cost("claude-opus-4-1", Usage(input_tokens=100_000)).usd
    assert cost("scripted", Usage(input_tokens=100_000)).source == "offline"


def test_cost_is_rounded_to_micro_dollars() -> None:
    assert cost_usd("claude-haiku-4-5", Usage(input_tokens=1)) == Decimal("0.000001")
    assert cost_usd("claude-haiku-4-5", Usage(input_tokens=1)).as_tuple().exponent == -6


@pytest.mark.parametrize(
    ("model", "listed"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("claude-sonnet-4-0", "claude-sonnet-4-0"),
    ],
)
def test_dated_ids_are_priced_as_their_model(model: str, listed: str) -> None:
    assert price_for(model) == (PRICES[listed], True)


@pytest.mark.parametrize("model", ["claude-sonnet-4-7", "claude-unknown-7", "gpt-4o", ""])
def test_unknown_models_are_priced_conservatively(model: str) -> None:
    price, known = price_for(model)
    assert price == max(PRICES.values(), key=lambda p: p.output)

    assert known is False
    usage = Usage(input_tokens=1000, output_tokens=1000, cache_read_input_tokens=1000)
    assert all(cost_usd(model, usage) >= cost_usd(listed, usage) for listed in PRICES)


def test_the_scripted_model_is_free() -> None:
    usage = Usage(input_tokens=10**6, output_tokens=10**6)

    assert cost_usd("scripted", usage) == Decimal("0")
    assert price_for("scripted")[1] is True


def test_the_default_model_is_priced() -> None:
    assert price_for(DEFAULT_MODEL) == (PRICES["claude-sonnet-4-5"], True)
