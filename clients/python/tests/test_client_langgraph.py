"""shiftlog_client.langgraph's pure parts: a step's AI message as a turn, and which interrupts
are Shiftlog's (the whole flow runs against a real server in tests/test_framework_adapters.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from shiftlog_client.langgraph import KIND, Decision, _is_ours, message_turn


def test_an_ai_message_is_a_turn_with_its_usage_and_model():
    message = AIMessage(
        content=[{"type": "text", "text": "Looking."}, {"type": "text", "text": "Done."}],
        usage_metadata={"input_tokens": 120, "output_tokens": 7, "total_tokens": 127,
                        "input_token_details": {"cache_read": 100, "cache_creation": 3}},
        response_metadata={"model_name": "claude-sonnet-4-5"},
    )  # fmt: skip
    assert message_turn(message) == {
        "text": "Looking.\nDone.", "model": "claude-sonnet-4-5", "input_tokens": 120,
        "output_tokens": 7, "cache_read_tokens": 100, "cache_write_tokens": 3,
    }  # fmt: skip
    bare = message_turn(AIMessage(content="hi"))
    assert bare is not None and bare["input_tokens"] == 0 and bare["model"] == ""
    assert message_turn(HumanMessage(content="not a turn")) is None


def test_only_shiftlogs_interrupts_are_answered_and_a_resume_value_is_a_decision():
    assert _is_ours({"kind": KIND, "tool": "bash", "input": {}})
    assert not _is_ours({"kind": "the caller's own", "question": "which branch?"})
    assert not _is_ours("a plain question")
    decision = Decision.from_resume(
        {"allowed": False, "input": None, "reason": "no", "call_id": "c1", "decision": "denied"}
    )
    assert not decision.allowed and decision.reason == "no" and decision.call_id == "c1"
