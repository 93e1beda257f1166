"""The runtime driven in-process with the scripted provider, through the real tools."""

from __future__ import annotations

import copy
import re
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import providers, services
from agents.models import Artifact, Event, Run, RunScript, RunStatus, Session
from agents.runtime.conversation import Conversation
from agents.runtime.loop import drive
from tests.helpers import call, demo_to_success, drive_until_idle, finish_turn, kinds, make_run

pytestmark = pytest.mark.django_db


def events_of(run, kind):
    return list(Event.objects.filter(run=run, kind=kind).order_by("seq"))


def test_the_demo_goes_through_two_sessions_to_success_with_real_checks(decider):
    run = demo_to_success(decider)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    sessions = list(run.sessions.order_by("index"))
    assert len(sessions) >= 2
    assert sessions[0].end_reason == "handoff"
    assert sessions[-1].end_reason == "finished"
    checks = [e.payload for e in events_of(run, "check.result")]
    # finish (refused), the harness's own reading at the handoff, finish (passed)
    assert [(c["at"], c["passed"]) for c in checks] == [
        ("finish", False),
        ("session_end", False),
        ("finish", True),
    ]
    assert "FAILED" in checks[0]["output"] or "Error" in checks[0]["output"]
    # The work is really in the workspace.
    assert "text.split()" in (run.workspace_path / "textstats.py").read_text()
    # The handoff is kept on the session and as an artifact.
    assert "word_count" in sessions[0].handoff["summary"]
    assert Artifact.objects.filter(run=run, kind="handoff").count() >= 1
    assert Artifact.objects.filter(run=run, kind="file", name="textstats.py").exists()


def test_a_new_session_starts_from_goal_checks_handoff_and_check_results(decider):
    run = demo_to_success(decider)
    second = run.sessions.get(index=2)
    first_message = Event.objects.get(session=second, kind="session.started").payload[
        "first_message"
    ]
    assert run.goal in first_message  # verbatim, never a summary
    assert "python3 -m unittest -q" in first_message
    assert run.sessions.get(index=1).handoff["summary"] in first_message
    assert "FAILED (exit 1)" in first_message  # the latest check results
    assert "textstats.py" in first_message  # the workspace listing
    # Not the old transcript.
    assert "good enough to me" not in first_message


def test_the_agents_word_is_not_enough_a_failing_check_keeps_the_run_going(db):
    run = make_run(
        turns=[finish_turn("all done, trust me"), {"text": "hmm"}],
        checks=["test -f result.txt"],
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.FAILED  # the script ran out: it never succeeded
    statuses = [e.payload["to"] for e in events_of(run, "run.status")]
    assert statuses == ["running", "verifying", "running", "failed"]
    finish_result = events_of(run, "tool.result")[0].payload
    assert finish_result["is_error"] is True
    assert "0 of 1 passed" in finish_result["output"]


def test_when_the_script_runs_out_the_run_fails_with_that_reason(db):
    run = drive_until_idle(make_run(turns=[{"text": "thinking"}]))
    assert run.status == RunStatus.FAILED
    assert "script ran out after 1 turns" in run.status_reason
    assert run.sessions.get().end_reason == "failed"


def test_bad_tool_input_is_a_tool_error_and_the_run_goes_on(db):
    run = make_run(
        turns=[
            {"tool_calls": [call("no_such_tool", x=1)]},
            {"tool_calls": [call("write_file", path="a.txt")]},
            {"tool_calls": [call("read_file", path="../../etc/passwd")]},
            {"tool_calls": [call("edit_file", path="missing.txt", old_string="a", new_string="b")]},
            {"tool_calls": [call("write_file", path="a.txt", content="ok")]},
            finish_turn(),
        ],
        checks=["test -f a.txt"],
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    results = [e.payload for e in events_of(run, "tool.result")]
    assert [r["is_error"] for r in results[:4]] == [True, True, True, True]
    assert "no_such_tool" in results[0]["output"]
    assert "content" in results[1]["output"]
    assert not (run.workspace_path.parent.parent / "passwd").exists()


def test_several_tool_calls_in_one_turn_each_get_a_result_in_order(db):
    run = make_run(
        turns=[
            {
                "tool_calls": [
                    call("write_file", path="a", content="1"),
                    call("write_file", path="b", content="2"),
                    call("bash", command="cat a b > c"),
                ]
            },
            finish_turn(),
        ],
        checks=['test "$(cat c)" = 12'],
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    seq_kinds = kinds(run)
    turn = seq_kinds.index("model.turn")
    assert seq_kinds[turn : turn + 7] == ["model.turn"] + ["tool.call", "tool.result"] * 3


def test_at_the_turn_limit_the_harness_asks_for_a_handoff_and_writes_one_if_ignored(
    stubborn_agent,
):
    chatter = [{"tool_calls": [call("list_files")]} for _ in range(4)]
    run = make_run(turns=[*chatter, *chatter, finish_turn()], max_turns_per_session=2)
    run = drive_until_idle(run)
    first = run.sessions.get(index=1)
    assert first.handoff["forced"] is True
    assert first.turns == 2 + 2  # the limit plus the grace turns
    requests = [
        e for e in events_of(run, "harness.message") if e.payload["reason"] == "handoff_requested"
    ]
    assert requests and requests[0].session_id == first.pk


def test_the_scripted_agent_hands_off_when_asked(db):
    run = make_run(
        turns=[{"tool_calls": [call("list_files")]}] * 3 + [finish_turn()], max_turns_per_session=2
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert run.sessions.count() == 2
    assert run.sessions.get(index=1).end_reason == "handoff"


def test_usage_is_summed_per_session_and_per_run(decider):
    run = demo_to_success(decider)
    sessions = list(run.sessions.all())
    assert run.turns == sum(s.turns for s in sessions) == len(events_of(run, "model.turn"))
    assert run.input_tokens == sum(s.input_tokens for s in sessions) > 0
    assert run.output_tokens == sum(
        e.payload["usage"]["output_tokens"] for e in events_of(run, "model.turn")
    )
    assert run.cost_usd == 0  # offline


def test_token_budget_warns_then_pauses_and_raising_it_resumes(db):
    turns = [
        {"tool_calls": [call("list_files")], "usage": {"input_tokens": 100, "output_tokens": 0}}
    ] * 6
    run = make_run(turns=[*turns, finish_turn()], budgets=services.Budgets(max_tokens=500))
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED
    assert "max tokens (500) reached" in run.status_reason
    assert [e.payload["budget"] for e in events_of(run, "budget.warning")] == ["tokens"]
    assert len(events_of(run, "budget.exceeded")) == 1
    with pytest.raises(services.RunError, match="still over its budget"):
        services.resume_run(run.pk, actor="user:olivia")
    services.resume_run(run.pk, actor="user:olivia", budgets=services.Budgets(max_tokens=10_000))
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED


def test_session_budget_pauses_before_a_session_too_many(db):
    run = make_run(
        turns=[{"tool_calls": [call("list_files")]}] * 6 + [finish_turn()],
        max_turns_per_session=2,
        budgets=services.Budgets(max_sessions=2),
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED
    assert "max sessions (2) reached" in run.status_reason
    assert run.sessions.count() == 2
    services.resume_run(run.pk, actor="user:olivia", budgets=services.Budgets(max_sessions=5))
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED


def test_a_paused_or_cancelled_run_is_not_driven(db):
    run = make_run(turns=[finish_turn()])
    services.pause_run(run.pk, actor="user:olivia")
    assert drive(run.pk).result == "not-claimed"
    services.cancel_run(run.pk, actor="user:olivia")
    assert drive(run.pk).result == "not-claimed"
    assert "model.turn" not in kinds(run)


def test_a_run_held_by_another_worker_is_not_driven(db):
    from agents import leases

    run = make_run(turns=[finish_turn()])
    assert leases.claim(run.pk, "worker:elsewhere")
    assert drive(run.pk).result == "not-claimed"


def test_the_conversation_rebuilt_from_the_log_is_what_the_model_was_sent(db):
    seen = []
    original = providers.for_run

    class Recording:
        name, offline = "recording", True

        def __init__(self, inner):
            self.inner = inner

        def next_turn(self, request):
            seen.append(copy.deepcopy(request.messages))
            return self.inner.next_turn(request)

    providers.for_run = lambda r: Recording(original(r))
    try:
        run = make_run(
            turns=[
                {"tool_calls": [call("list_files")]},
                {"text": "no tools"},
                {"tool_calls": [call("write_file", path="x", content="y"), call("list_files")]},
                finish_turn(),
            ]
        )
        # A note arrives between turns: it must appear where the model really saw it.
        drive(run.pk, max_seconds=0.000001)
        services.note_run(run.pk, "prefer small steps", actor="user:olivia")
        run = drive_until_idle(run)
    finally:
        providers.for_run = original
    assert run.status == RunStatus.SUCCEEDED
    session = run.sessions.get()
    rows = list(
        Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "payload")
    )
    rebuilt = Conversation.from_events(rows)
    final_request = seen[-1]
    assert rebuilt.messages[: len(final_request)] == final_request
    assert any("prefer small steps" in str(m) for m in final_request)


def test_a_tool_call_left_open_by_a_dead_worker_is_closed_as_interrupted_not_rerun(
    transactional_db, monkeypatch
):
    from agents import sandbox

    run = make_run(
        turns=[{"tool_calls": [call("bash", command="echo ran >> count.txt")]}, finish_turn()],
        checks=["true"],
    )
    real_execute = sandbox.execute

    def die_after_running(*args, **kwargs):
        real_execute(*args, **kwargs)
        raise SystemExit("worker killed")  # the tool ran; its result was never recorded

    monkeypatch.setattr(sandbox, "execute", die_after_running)
    with pytest.raises(SystemExit):
        drive(run.pk)
    monkeypatch.setattr(sandbox, "execute", real_execute)
    # A killed worker leaves its lease behind (here its `finally` ran, so put one back): nobody
    # else may drive the run until it expires.
    Run.objects.filter(pk=run.pk).update(
        lease_owner="worker:dead", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert drive(run.pk).result == "not-claimed"
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    results = [e.payload for e in events_of(run, "tool.result") if e.payload["name"] == "bash"]
    assert len(results) == 1 and "interrupted" in results[0]["output"]
    assert (run.workspace_path / "count.txt").read_text() == "ran\n"  # ran once, never again
    assert any(e.payload.get("source") == "recovery" for e in events_of(run, "error"))


def _drive_in_thread(run):
    thread = threading.Thread(target=drive, args=(run.pk,), daemon=True)
    thread.start()
    return thread


def _wait_for(run, kind, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Event.objects.filter(run=run, kind=kind).exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"no {kind} event within {timeout}s: {kinds(run)}")


def test_pause_takes_effect_between_steps_and_resume_continues(transactional_db):
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command="sleep 1; echo slept")]},
            {"tool_calls": [call("list_files")]},
            finish_turn(),
        ],
    )
    thread = _drive_in_thread(run)
    _wait_for(run, "tool.call")
    services.pause_run(run.pk, actor="user:olivia")
    thread.join(10)
    assert not thread.is_alive()
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    # The running step finished; no further turn was taken.
    assert kinds(run).count("model.turn") == 1
    assert "slept" in events_of(run, "tool.result")[0].payload["output"]
    assert run.sessions.get().status == "suspended"
    pause = next(e for e in events_of(run, "run.status") if e.payload["to"] == "paused")
    assert pause.actor == "user:olivia"
    services.resume_run(run.pk, actor="user:olivia")
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED


def test_cancel_stops_a_running_tool(transactional_db):
    run = make_run(turns=[{"tool_calls": [call("bash", command="sleep 30")]}, finish_turn()])
    thread = _drive_in_thread(run)
    _wait_for(run, "tool.call")
    started = time.monotonic()
    services.cancel_run(run.pk, actor="user:olivia")
    thread.join(15)
    assert not thread.is_alive()
    assert time.monotonic() - started < 10
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    result = events_of(run, "tool.result")[0].payload
    assert result["data"]["cancelled"] is True
    assert Session.objects.get(run=run).end_reason == "cancelled"


def test_a_note_reaches_the_agent_at_its_next_turn(db):
    run = make_run(
        turns=[
            {"tool_calls": [call("list_files")]},
            {"tool_calls": [call("list_files")]},
            finish_turn(),
        ]
    )
    drive(run.pk, max_seconds=0.000001)  # one step
    services.note_run(run.pk, "use the standard library instead", actor="user:olivia")
    run = drive_until_idle(run)
    note = events_of(run, "human.note")[0]
    assert note.actor == "user:olivia"
    rows = list(
        Event.objects.filter(run=run, session=run.sessions.get())
        .order_by("seq")
        .values_list("seq", "kind", "payload")
    )
    messages = Conversation.from_events(rows).messages
    where = next(i for i, m in enumerate(messages) if "standard library" in str(m))
    assert messages[where]["role"] == "user"
    assert messages[where - 1]["role"] == "assistant"  # after the first turn, before the next


def test_a_full_context_window_ends_the_session_with_a_handoff(db):
    big = {"tool_calls": [call("list_files")], "usage": {"input_tokens": 5000, "output_tokens": 10}}
    run = make_run(turns=[big, big, finish_turn()], max_input_tokens_per_session=4000)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    first = run.sessions.get(index=1)
    assert first.end_reason == "handoff"
    request = Event.objects.get(
        session=first, kind="harness.message", payload__reason="handoff_requested"
    )
    assert "5000 input tokens of 4000" in request.payload["text"]


def test_a_scripted_delay_simulates_model_latency(db):
    run = make_run(turns=[finish_turn()])
    row = RunScript.objects.get(run=run)
    row.script["turn_delay_seconds"] = 0.3
    row.save(update_fields=["script"])
    started = time.monotonic()
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED
    assert time.monotonic() - started >= 0.3


def test_notes_between_sessions_reach_the_next_session_once_and_break_nothing(
    db, slice_per_session
):
    turns = [{"tool_calls": [call("list_files")]}] * 3 + [finish_turn()]
    run = make_run(turns=turns, max_turns_per_session=1)
    for text in ("first gap", "second gap"):
        while run.sessions.filter(status="ended").count() < (1 if text == "first gap" else 2):
            drive(run.pk)
        services.note_run(run.pk, text, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    firsts = [
        Event.objects.get(session=s, kind="session.started").payload["first_message"]
        for s in run.sessions.order_by("index")
    ]
    assert ["first gap" in m for m in firsts] == [False, True, False, False][: len(firsts)]
    assert ["second gap" in m for m in firsts][2] is True
    assert sum("second gap" in m for m in firsts) == 1


def test_cost_budget_warns_at_80_percent_then_pauses_and_raising_it_resumes(fake_api):
    from decimal import Decimal

    for i in range(4):
        # claude-sonnet-4-5 at $3 per million input tokens: $0.003 a turn.
        fake_api.push_message(
            [{"type": "tool_use", "id": f"toolu_{i}", "name": "list_files", "input": {}}],
            stop_reason="tool_use",
            usage={"input_tokens": 1000, "output_tokens": 0},
        )
    run = make_run(provider="anthropic", budgets=services.Budgets(max_cost_usd=Decimal("0.01")))
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED, run.status_reason
    assert run.cost_usd == Decimal("0.012")
    assert len(fake_api.requests) == 4  # no model call once the budget was spent
    assert "budget: max cost ($0.010000) reached" in run.status_reason
    (warning,) = events_of(run, "budget.warning")
    # Warned before the fourth turn, at $0.009 of $0.01; paused before a fifth.
    assert warning.payload == {"budget": "cost", "used": "0.009000", "limit": "0.010000"}
    (exceeded,) = events_of(run, "budget.exceeded")
    assert warning.seq < exceeded.seq and "max cost" in exceeded.payload["reason"]
    with pytest.raises(services.RunError, match=r"still over its budget: \$0.012000 spent"):
        services.resume_run(run.pk, actor="user:olivia")
    services.resume_run(
        run.pk, actor="user:olivia", budgets=services.Budgets(max_cost_usd=Decimal("0.05"))
    )
    fake_api.push_message(
        [{"type": "tool_use", "id": "toolu_9", "name": "finish", "input": {"summary": "ok"}}],
        stop_reason="tool_use",
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert len(events_of(run, "budget.warning")) == 1  # $0.012 is far from 80% of $0.05


def test_wall_time_budget_warns_at_80_percent_then_pauses_and_raising_it_resumes(db):
    nap = {"tool_calls": [call("bash", command="sleep 0.2")]}
    run = make_run(turns=[*[nap] * 25, finish_turn()], budgets=services.Budgets(max_wall_seconds=3))
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED, run.status_reason
    assert "budget: max wall time (3 s) reached" in run.status_reason
    assert 3 <= run.active_seconds < 10
    naps_before_pause = len(events_of(run, "tool.result"))
    assert 5 <= naps_before_pause < 25  # the script did not simply run out
    (warning,) = events_of(run, "budget.warning")
    assert warning.payload["budget"] == "wall time" and warning.payload["limit"] == "3"
    assert 2.4 <= float(warning.payload["used"]) < 3
    (exceeded,) = events_of(run, "budget.exceeded")
    assert "max wall time (3 s)" in exceeded.payload["reason"]
    # The time is spent: resuming needs a higher limit.
    with pytest.raises(services.RunError, match="still over its budget"):
        services.resume_run(run.pk, actor="user:olivia")
    services.resume_run(run.pk, actor="user:olivia", budgets=services.Budgets(max_wall_seconds=120))
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert len(events_of(run, "tool.result")) == 25 + 1  # every nap, then finish


def test_a_provider_that_crashes_fails_the_run_with_what_happened_not_the_worker(monkeypatch):
    from agents import providers

    class Broken:
        name, offline = "broken", True

        def next_turn(self, request):
            return int("not a number")  # what a script with a wrongly typed field once did

    run = make_run(turns=[finish_turn()])
    monkeypatch.setattr(providers, "for_run", lambda run: Broken())
    outcome = drive(run.pk)
    run.refresh_from_db()
    assert str(outcome) == "failed" and run.status == RunStatus.FAILED
    assert "the broken provider failed: ValueError" in run.status_reason
    error = run.events.get(kind="error")
    assert error.payload["source"] == "provider" and error.payload["error"] == "ProviderCrashed"


def test_a_script_with_a_wrongly_typed_field_is_refused_where_it_is_wrong():
    from agents.services import RunError

    bad = [
        ({"turns": [{"text": "hi", "usage": {"input_tokens": "lots"}}]}, "turns[0].usage"),
        ({"turns": [{"tool_calls": [{"name": "bash", "input": "ls"}]}]}, "turns[0].tool_calls"),
        ({"turns": [{"text": "x"}], "judge": [{"criteria": [{"passed": "yes"}]}]}, "judge[0]"),
        ({"turns": [{"text": 5}]}, "turns[0].text"),
        ({"turns": [{}]}, "needs text or at least one tool call"),
        ({"turns": [{"text": "x"}], "turn_delay_seconds": 1e9}, "turn_delay_seconds"),
    ]
    for script, where in bad:
        with pytest.raises(RunError, match=re.escape(where)):
            make_run(script=script)
    assert make_run(script={"turns": [{"text": "ok", "usage": {"input_tokens": 3}}]}).pk
