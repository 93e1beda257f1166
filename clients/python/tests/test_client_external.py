"""The external-agent helpers: asking (and long-polling), reporting, run_tool, finish."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from client_helpers import make_async, run_json
from shiftlog_client import AsyncExternalRun, ExternalRun, FinishResult

pytestmark = pytest.mark.no_services


def ok(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def call(decision: str, **extra: object) -> dict:
    body = {"id": "ext_1", "decision": decision, "reason": "", "approval": None,
            "run_status": "running", "input": {"command": "rm -rf build"}}  # fmt: skip
    body.update(extra)
    return body


def test_an_allowed_call_needs_no_poll(make_client):
    client, rec = make_client(ok(call("allow", input={"command": "ls"}), 201))
    run = ExternalRun(client, 3)
    decision = run.ask("bash", {"command": "ls"})
    assert decision.allowed and not decision.pending
    assert decision.input == {"command": "ls"}
    assert rec.requests[0].url.path == "/api/v1/runs/3/tool-calls"
    assert rec.json(0) == {"tool": "bash", "input": {"command": "ls"}}
    assert len(rec.requests) == 1
    assert run.status == "running"


def test_ask_long_polls_until_a_person_decides_and_returns_the_edited_input(make_client):
    client, rec = make_client(
        ok(call("ask", approval=12), 201),
        ok(call("pending")),
        ok(call("pending")),
        ok(call("approved", input={"command": "rm -rf build/tmp"}, approval=None)),
    )
    run = ExternalRun(client, 3)
    decision = run.ask("bash", {"command": "rm -rf build"})
    assert decision.decision == "approved" and decision.allowed
    assert decision.input == {"command": "rm -rf build/tmp"}
    assert decision.approval == 12  # kept from the first answer
    polls = rec.requests[1:]
    assert [r.url.path for r in polls] == ["/api/v1/tool-calls/ext_1"] * 3
    assert all(r.url.params["wait"] == "60" for r in polls)
    # The read timeout outlasts the server's wait.
    assert all(r.extensions["timeout"]["read"] >= 60 for r in polls)


def test_ask_gives_up_after_its_timeout(make_client):
    client, rec = make_client(ok(call("ask"), 201), ok(call("pending")))
    run = ExternalRun(client, 3, poll_wait=1)
    with pytest.raises(TimeoutError, match="ext_1"):
        run.ask("bash", {"command": "rm -rf build"}, timeout=0.05)
    assert rec.requests[-1].url.params["wait"] == "1"


def test_a_poll_survives_a_dropped_connection(make_client):
    def drop(request):
        raise httpx.ReadError("connection reset", request=request)

    client, rec = make_client(ok(call("ask"), 201), drop, ok(call("denied", reason="no")))
    decision = ExternalRun(client, 3).ask("bash", {"command": "rm -rf build"})
    assert decision.denied and decision.reason == "no"
    assert len(rec.requests) == 3


def test_run_tool_runs_an_approved_call_with_its_input_and_reports(make_client):
    client, rec = make_client(
        ok(call("ask"), 201),
        ok(call("approved", input={"command": "echo edited"})),
        ok({"seq": 30, "run_status": "running"}, 201),
    )
    seen = []
    outcome = ExternalRun(client, 3).run_tool(
        "bash", {"command": "rm -rf /"}, lambda i: seen.append(i) or "edited\n"
    )
    assert seen == [{"command": "echo edited"}]
    assert (outcome.ran, outcome.is_error, outcome.output) == (True, False, "edited\n")
    assert rec.requests[-1].url.path == "/api/v1/tool-calls/ext_1/result"
    assert rec.json() == {"output": "edited\n", "is_error": False}
    assert outcome.tool_result("toolu_1") == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "edited\n",
        "is_error": False,
    }


def test_run_tool_reports_an_exception_or_a_failure_as_an_error(make_client):
    ack = ok({"seq": 30, "run_status": "running"}, 201)
    client, rec = make_client(ok(call("allow"), 201), ack, ok(call("allow"), 201), ack)
    run = ExternalRun(client, 3)

    def boom(_):
        raise OSError("disk full")

    outcome = run.run_tool("bash", {"command": "ls"}, boom)
    assert (outcome.ran, outcome.is_error, outcome.output) == (True, True, "OSError: disk full")
    assert json.loads(rec.bodies[1]) == {"output": "OSError: disk full", "is_error": True}
    outcome = run.run_tool("bash", {"command": "false"}, lambda _: ("exit 1", True))
    assert outcome.is_error and json.loads(rec.bodies[3]) == {"output": "exit 1", "is_error": True}


def test_run_tool_does_not_run_a_denied_call_and_tracks_the_status(make_client):
    client, rec = make_client(
        ok(call("deny", reason="the run is paused", run_status="paused"), 201)
    )
    run = ExternalRun(client, 3)
    outcome = run.run_tool("bash", {"command": "ls"}, lambda _: pytest.fail("must not run"))
    assert not outcome.ran and outcome.is_error
    assert "the run is paused" in outcome.output
    assert len(rec.requests) == 1  # no result for a call that did not run
    assert run.status == "paused" and not run.active


def test_turns_heartbeat_context_handoff_and_finish(make_client):
    finish_failed = {"passed": False, "run_status": "running", "summary": "done",
                     "checks": [{"command": "test -f done.txt", "passed": False, "exit_code": 1,
                                 "output": ""}], "notes": ["protected file restored"]}  # fmt: skip
    client, rec = make_client(
        ok({"session": 1, "first_message": "Goal: make done.txt", "run_status": "running"}),
        ok({"run_status": "running"}),
        ok({"seq": 5, "run_status": "running", "cost_usd": "0.000300"}, 201),
        ok({"seq": 6, "run_status": "paused", "cost_usd": "0.9"}, 201),
        ok({"session": 2, "first_message": "Goal: … Handoff: …", "run_status": "running"}),
        ok(finish_failed),
        ok(
            {
                **finish_failed,
                "passed": True,
                "run_status": "succeeded",
                "notes": [],
                "checks": [{"command": "test -f done.txt", "passed": True, "exit_code": 0}],
            }
        ),
    )
    run = ExternalRun(client, 3)
    assert run.context().first_message.startswith("Goal")
    assert run.session == 1
    assert run.heartbeat() == "running"
    turn = run.turn("thinking", "claude-x", 100, 20, cache_read_tokens=5)
    assert str(turn.cost_usd) == "0.000300"
    assert rec.json(2) == {"text": "thinking", "model": "claude-x", "input_tokens": 100,
                           "output_tokens": 20, "cache_read_tokens": 5, "cache_write_tokens": 0}  # fmt: skip
    message = {"model": "claude-y", "content": [{"type": "text", "text": "hi"},
               {"type": "tool_use", "id": "t", "name": "bash", "input": {}}],
               "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": None,
                         "cache_creation_input_tokens": 2}}  # fmt: skip
    run.record_message(message)
    assert rec.json(3) == {"text": "hi", "model": "claude-y", "input_tokens": 7,
                           "output_tokens": 3, "cache_read_tokens": 0, "cache_write_tokens": 2}  # fmt: skip
    assert run.status == "paused" and not run.active  # past a budget cap
    context = run.handoff("half way", done=["a"], next_steps=["b"], open_questions=["c"])
    assert context.session == 2 and run.session == 2 and run.active
    assert rec.json(4) == {"summary": "half way", "done": ["a"], "next_steps": ["b"],
                           "open_questions": ["c"]}  # fmt: skip
    failed = run.finish("done")
    assert isinstance(failed, FinishResult) and not failed.passed
    report = failed.report()
    assert "FAILED (exit 1): test -f done.txt" in report
    assert "protected file restored" in report
    passed = run.finish("done")
    assert passed.passed and run.succeeded and not run.active
    assert "passed" in passed.report()
    # handoff and finish wait for the checks: a long read timeout
    assert rec.requests[-1].extensions["timeout"]["read"] >= 600


def test_create_makes_an_external_run(make_client):
    client, rec = make_client(ok(run_json(run_id=9, status="running"), 201))
    run = ExternalRun.create(client, "make done.txt", checks=["test -f done.txt"])
    assert run.run_id == 9 and run.status == "running"
    assert rec.json()["provider"] == "external"


def test_the_async_twin():
    async def tool(input):
        await asyncio.sleep(0)
        return f"ran {input['command']}"

    async def main():
        client, rec = make_async(
            ok(call("ask"), 201),
            ok(call("pending")),
            ok(call("approved", input={"command": "ls -la"})),
            ok({"seq": 9, "run_status": "running"}, 201),
            ok({"passed": True, "run_status": "succeeded", "checks": [], "notes": []}),
        )
        async with client:
            run = AsyncExternalRun(client, 3)
            outcome = await run.run_tool("bash", {"command": "ls"}, tool)
            finished = await run.finish("all done")
        return outcome, finished, rec, run

    outcome, finished, rec, run = asyncio.run(main())
    assert outcome.output == "ran ls -la" and outcome.ran
    assert finished.passed and run.succeeded
    assert [r.method for r in rec.requests] == ["POST", "GET", "GET", "POST", "POST"]
    assert rec.requests[1].headers["authorization"] == "Bearer shl_test"


def test_finish_waits_for_a_queued_verdict(make_client):
    """A current server answers finish at once (202, checking) and runs the checks in a worker:
    the client long-polls the verdict, and the call returns it as before."""
    verdict = {"id": "ext_f1", "state": "done", "passed": True, "run_status": "succeeded",
               "summary": "ok", "checks": [{"command": "true", "passed": True, "exit_code": 0}]}  # fmt: skip
    checking = {**verdict, "state": "checking", "passed": False, "run_status": "running"}
    client, rec = make_client(
        ok({"id": "ext_f1", "state": "checking", "run_status": "running"}, 202),
        ok(checking),
        ok(verdict),
    )
    run = ExternalRun(client, 3)
    result = run.finish("done")
    assert result.passed and run.succeeded
    assert [r.method for r in rec.requests] == ["POST", "GET", "GET"]
    assert rec.requests[1].url.path == "/api/v1/runs/3/finish/ext_f1"
    assert rec.requests[1].url.params["wait"]
