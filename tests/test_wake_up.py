"""The wake-up record: what each session's first message was built from, part by part, with
each part's size in (estimated) tokens; on the session, in `show_run --json`."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from agents import services
from agents.models import Event, EventKind, Session
from agents.runtime import prompts
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


def started(session: Session) -> str:
    return Event.objects.get(session=session, kind=EventKind.SESSION_STARTED).payload[
        "first_message"
    ]


def test_each_session_records_its_parts_and_they_make_its_first_message(db):
    run = make_run(
        goal="Write hello.txt",
        checks=["test -f hello.txt"],
        rubric="Be brief.",
        acceptance=["exists=test -f hello.txt"],
        script={
            "turns": [
                {"tool_calls": [call("write_file", path="notes.md", content="x")]},
                {"tool_calls": [call("handoff", summary="wrote notes", next_steps=["hello"])]},
                {"tool_calls": [call("write_file", path="hello.txt", content="hi")]},
                finish_turn(),
            ],
            "judge": [{"criteria": [{"criterion": "Be brief.", "passed": True}]}],
        },
    )
    run = drive_until_idle(run)
    assert run.status == "succeeded", run.status_reason
    one, two = Session.objects.filter(run=run).order_by("index")
    assert prompts.in_order(one.wake_up) == [
        "goal",
        "done_conditions",
        "review_criteria",
        "acceptance",
        "session",
        "handoff",
        "workspace",
    ]
    assert prompts.in_order(two.wake_up) == [
        "goal",
        "done_conditions",
        "review_criteria",
        "acceptance",
        "session",
        "handoff",
        "checks",
        "workspace",
    ]
    for session in (one, two):
        parts = {name: part["text"] for name, part in session.wake_up.items()}
        assert prompts.assemble(parts) == started(session)
        for part in session.wake_up.values():
            assert part["estimated"] is True
            assert part["tokens"] == -(-len(part["text"]) // 4)
    assert one.wake_up["goal"]["text"] == "# Goal\nWrite hello.txt"
    assert one.wake_up["goal"]["tokens"] == 6  # 23 characters
    assert "first session" in one.wake_up["handoff"]["text"]
    assert "wrote notes" in two.wake_up["handoff"]["text"]
    assert "`test -f hello.txt`: FAILED" in two.wake_up["checks"]["text"]
    assert "notes.md" in two.wake_up["workspace"]["text"]
    assert "[ ] exists" in two.wake_up["acceptance"]["text"]
    assert "Be brief." in one.wake_up["review_criteria"]["text"]


def test_notes_and_a_rewind_note_are_parts_and_keep_the_message_as_it_was():
    parts = prompts.wake_up_parts(
        goal="g",
        checks=["true"],
        rubric="",
        session_index=2,
        max_sessions=None,
        max_turns=5,
        handoff={"summary": "s"},
        check_results=[],
        listing="a.txt",
        notes=["user:olivia: tabs"],
        rewind_note="(with the rewind to checkpoint 3) go slow",
        memory="# Memory (…)\n- [run] k: v",
        changed_by_people=["user:olivia deleted `x` from run memory"],
    )
    assert list(parts) == [
        "goal",
        "done_conditions",
        "session",
        "handoff",
        "memory",
        "changed_by_people",
        "rewind_note",
        "notes",
        "workspace",
    ]
    message = prompts.assemble(parts)
    assert (
        "# Notes from people\n- (with the rewind to checkpoint 3) go slow\n- user:olivia: tabs"
        "\n\n# Workspace\na.txt" in message
    )
    assert parts["notes"] == "- user:olivia: tabs"
    alone = prompts.wake_up_parts(**{**_BASE, "notes": ["user:olivia: tabs"]})
    assert alone["notes"] == "# Notes from people\n- user:olivia: tabs"


_BASE = dict(
    goal="g",
    checks=[],
    rubric="",
    session_index=1,
    max_sessions=3,
    max_turns=5,
    handoff=None,
    check_results=[],
    listing="",
)


def test_notes_from_people_reach_the_next_sessions_wake_up(db, slice_per_session):
    run = make_run(
        turns=[
            {"tool_calls": [call("handoff", summary="one")]},
            finish_turn(),
        ]
    )
    from agents.runtime.loop import drive

    while not Session.objects.filter(run=run, index=1, status="ended").exists():
        drive(run.pk)
    services.note_run(run.pk, "use tabs", actor="user:olivia")
    drive_until_idle(run)
    two = Session.objects.get(run=run, index=2)
    assert two.wake_up["notes"]["text"] == "# Notes from people\n- user:olivia: use tabs"


def test_show_run_json_has_each_sessions_wake_up(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    out = StringIO()
    call_command("show_run", str(run.pk), "--json", stdout=out)
    data = json.loads(out.getvalue())
    wake_up = data["sessions"][0]["wake_up"]
    assert set(wake_up) >= {"goal", "done_conditions", "session", "handoff", "workspace"}
    assert wake_up["goal"] == {"text": "# Goal\ntest goal", "tokens": 4, "estimated": True}
    text = StringIO()
    call_command("show_run", str(run.pk), stdout=text)
    assert "wake-up: ≈" in text.getvalue() and "(estimate)" in text.getvalue()
