"""The real SDK path through the runtime, against a local fake Messages API over real HTTP."""

from __future__ import annotations

import pytest

from agents.models import Event, RunStatus
from tests.helpers import FAKE_API_KEY as KEY
from tests.helpers import drive_until_idle, make_run

pytestmark = pytest.mark.django_db


def anthropic_run(**kwargs):
    return make_run(provider="anthropic", **kwargs)


def tool_use(id_, name, **tool_input):
    return {"type": "tool_use", "id": id_, "name": name, "input": tool_input}


def test_a_run_with_tool_use_turns_succeeds_and_usage_and_cost_add_up(fake_api):
    fake_api.push_message(
        [
            {"type": "text", "text": "Writing it."},
            tool_use("toolu_1", "write_file", path="a.txt", content="hi"),
        ],
        stop_reason="tool_use",
        usage={"input_tokens": 1000, "output_tokens": 100, "cache_read_input_tokens": 2000},
    )
    fake_api.push_message(
        [{"type": "text", "text": "Let me think."}],
        usage={"input_tokens": 1200, "output_tokens": 50},
    )
    fake_api.push_message([tool_use("toolu_2", "finish", summary="done")], stop_reason="tool_use")
    run = drive_until_idle(anthropic_run(checks=["test -f a.txt"]))
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert run.model == "claude-sonnet-4-5"
    assert run.input_tokens == 1000 + 1200 + 10
    assert run.cache_read_tokens == 2000
    # sonnet-4-5: $3/M input, $15/M output, $0.30/M cache read
    expected = (2210 * 3 + 155 * 15 + 2000 * 0.30) / 1_000_000
    assert float(run.cost_usd) == pytest.approx(expected, abs=1e-6)
    # The second request carries the tool result; the third answers the text-only turn.
    second = fake_api.requests[1]["body"]["messages"]
    assert second[-1]["role"] == "user"
    assert second[-1]["content"][0]["type"] == "tool_result"
    assert second[-1]["content"][0]["tool_use_id"] == "toolu_1"
    third = fake_api.requests[2]["body"]["messages"]
    assert "without calling a tool" in str(third[-1])
    assert [t["name"] for t in fake_api.requests[0]["body"]["tools"]][:2] == ["bash", "read_file"]


def test_several_tool_use_blocks_in_one_turn_all_run(fake_api):
    fake_api.push_message(
        [
            tool_use("t1", "write_file", path="x", content="1"),
            tool_use("t2", "write_file", path="y", content="2"),
        ],
        stop_reason="tool_use",
    )
    fake_api.push_message([tool_use("t3", "finish", summary="ok")], stop_reason="tool_use")
    run = drive_until_idle(anthropic_run(checks=["test -f x && test -f y"]))
    assert run.status == RunStatus.SUCCEEDED
    results = fake_api.requests[1]["body"]["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["t1", "t2"]


def test_a_max_tokens_stop_is_recorded_and_the_agent_is_told(fake_api):
    fake_api.push_message([{"type": "text", "text": "A very long"}], stop_reason="max_tokens")
    fake_api.push_message([tool_use("t1", "finish", summary="ok")], stop_reason="tool_use")
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.SUCCEEDED
    turn = Event.objects.filter(run=run, kind="model.turn").first()
    assert turn.payload["stop_reason"] == "max_tokens"
    assert "cut off" in str(fake_api.requests[1]["body"]["messages"][-1])


def test_a_rejected_key_stops_the_run_at_once_saying_what_to_set(fake_api):
    fake_api.push_error(401, "invalid x-api-key", "authentication_error")
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.PAUSED
    assert "ANTHROPIC_API_KEY" in run.status_reason
    assert len(fake_api.requests) == 1  # no retries on a bad key
    assert KEY not in run.status_reason


def test_a_missing_key_stops_the_run_without_calling_the_api(fake_api, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ANTHROPIC_API_KEY": ""}
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.PAUSED
    assert "ANTHROPIC_API_KEY is not set" in run.status_reason
    assert fake_api.requests == []


def test_overloaded_after_retries_pauses_the_run_and_resume_continues(fake_api):
    from agents import services

    for _ in range(2):
        fake_api.push_error(529, "Overloaded", "overloaded_error", headers={"retry-after-ms": "1"})
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.PAUSED
    assert "529" in run.status_reason and "resume" in run.status_reason
    assert len(fake_api.requests) == 2  # one try and one retry (max_retries=1)
    error = Event.objects.get(run=run, kind="error")
    assert error.payload["status_code"] == 529
    fake_api.push_message([tool_use("t1", "finish", summary="ok")], stop_reason="tool_use")
    services.resume_run(run.pk, actor="user:olivia")
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED


def test_rate_limited_once_is_retried_and_the_run_carries_on(fake_api):
    fake_api.push_error(429, "slow down", "rate_limit_error", headers={"retry-after-ms": "1"})
    fake_api.push_message([tool_use("t1", "finish", summary="ok")], stop_reason="tool_use")
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.SUCCEEDED
    assert len(fake_api.requests) == 2


def test_a_bad_request_fails_the_run_with_the_apis_message(fake_api):
    fake_api.push_error(400, "messages: roles must alternate", "invalid_request_error")
    run = drive_until_idle(anthropic_run())
    assert run.status == RunStatus.FAILED
    assert "roles must alternate" in run.status_reason


def test_a_model_in_no_price_table_is_charged_the_dearest_rate_and_shown_as_an_estimate(
    fake_api, owner
):
    from io import StringIO

    from django.core.management import call_command

    from tests.helpers import client_for

    for model, content in [
        ("claude-sonnet-4-7", [tool_use("toolu_1", "write_file", path="a.txt", content="hi")]),
        ("claude-sonnet-4-7", [tool_use("toolu_2", "finish", summary="done")]),
    ]:
        fake_api.push_message(content, stop_reason="tool_use", model=model,
                              usage={"input_tokens": 1000, "output_tokens": 100})  # fmt: skip
    run = drive_until_idle(
        anthropic_run(checks=["test -f a.txt"], model="claude-sonnet-4-7", created_by=owner)
    )
    assert run.status == RunStatus.SUCCEEDED and run.cost_estimated
    turn = Event.objects.filter(run=run, kind="model.turn").first().payload
    assert turn["price"] == "fallback"
    # At the dearest listed rate (opus 4.1: $15/M in, $75/M out), never less.
    assert float(run.cost_usd) == pytest.approx(2 * (1000 * 15 + 100 * 75) / 1e6, abs=1e-6)
    assert "Cost (estimated)" in client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "est." in client_for(owner).get("/").content.decode()
    out = StringIO()
    call_command("show_run", str(run.pk), stdout=out)
    assert "(estimated: a model in no price table" in out.getvalue()
