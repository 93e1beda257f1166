"""Memory: run memory as events on the live branch (rewind and fork get it right), project
memory reaching later runs of the project, people's edits as events, the remember and recall
tools through the scripted provider."""

from __future__ import annotations

import pytest

from agents import checkpoints, memory, policy, rewinds
from agents.models import Checkpoint, Event, EventKind, ProjectMemory, Session
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


def remember(key: str, text: str, **more) -> dict:
    return {"text": f"Noting {key}.", "tool_calls": [call("remember", key=key, text=text, **more)]}


def handoff(summary: str = "handing off") -> dict:
    return {"tool_calls": [call("handoff", summary=summary)]}


def recall(query: str) -> dict:
    return {"tool_calls": [call("recall", query=query)]}


ASK_ECHO = [{"tool": "bash", "pattern": "^echo wait", "action": "ask"}]


def memory_of(run) -> dict[str, str]:
    return {e.key: e.text for e in memory.run_entries(run.pk)}


def first_message(run, index: int) -> str:
    session = Session.objects.get(run=run, index=index)
    return Event.objects.get(session=session, kind=EventKind.SESSION_STARTED).payload[
        "first_message"
    ]


def result_of(run, tool: str) -> dict:
    return (
        Event.objects.filter(run=run, kind=EventKind.TOOL_RESULT, payload__name=tool)
        .order_by("-seq")
        .first()
        .payload
    )


def test_remember_crosses_a_session_boundary_and_recall_finds_it(db):
    run = make_run(
        turns=[
            remember("tests", "run `make deps` before the tests"),
            handoff(),
            recall("make deps"),
            finish_turn(),
        ]
    )
    run = drive_until_idle(run)
    assert run.status == "succeeded", run.status_reason
    saved = Event.objects.get(run=run, kind=EventKind.MEMORY_SAVED)
    assert saved.actor == "agent" and saved.payload["key"] == "tests"
    assert "# Memory" not in first_message(run, 1)
    second = first_message(run, 2)
    assert "# Memory" in second
    assert "- [run] tests: run `make deps` before the tests" in second
    found = result_of(run, "recall")
    assert "make deps" in found["output"] and found["data"]["memory_hits"] == ["run:tests"]
    assert memory.run_entries(run.pk)[0].uses == 1


def test_memory_tools_are_allowed_by_the_default_policy():
    for tool, tool_input in (("remember", {"key": "k", "text": "t"}), ("recall", {"query": "k"})):
        assert policy.decide([], tool, tool_input).action == "allow"


def test_a_rewind_forgets_what_was_learned_after_the_checkpoint(db):
    run = make_run(
        turns=[
            remember("a", "learned in session one"),
            handoff(),
            remember("b", "learned in session two"),
            {"tool_calls": [call("bash", command="echo wait")]},
            finish_turn(),
        ],
        tool_policy=ASK_ECHO,
    )
    run = drive_until_idle(run)
    assert run.status == "awaiting_approval", run.status_reason
    assert memory_of(run) == {"a": "learned in session one", "b": "learned in session two"}
    end_of_one = Checkpoint.objects.get(run=run, kind="session_end", session__index=1)
    rewinds.rewind(run.pk, end_of_one.pk, actor="user:dana", note="again")
    assert memory_of(run) == {"a": "learned in session one"}
    # The next session's wake-up knows a, not b; the agent learns b again on the new branch.
    drive_until_idle(run)
    third = Session.objects.get(run=run, index=3)
    assert "a: learned in session one" in third.wake_up["memory"]["text"]
    assert "learned in session two" not in third.wake_up["memory"]["text"]
    assert third.wake_up["rewind_note"]["text"].endswith("again")


def test_a_fork_keeps_what_its_origin_knew_at_the_checkpoint(db):
    run = make_run(
        turns=[
            remember("a", "from the origin"),
            handoff(),
            remember("b", "after the checkpoint"),
            finish_turn(),
        ]
    )
    run = drive_until_idle(run)
    assert run.status == "succeeded", run.status_reason
    end_of_one = Checkpoint.objects.get(run=run, kind="session_end", session__index=1)
    fork = checkpoints.fork(run.pk, end_of_one.pk, actor="user:dana")
    assert memory_of(fork) == {"a": "from the origin"}
    memory.set_entry(fork.pk, "a", text="changed in the fork", actor="user:dana")
    assert memory_of(fork) == {"a": "changed in the fork"}
    assert memory_of(run)["a"] == "from the origin"  # the origin is untouched
    fork = drive_until_idle(fork)
    woke = Session.objects.get(run=fork, index=1).wake_up
    assert "a: changed in the fork" in woke["memory"]["text"]


def test_project_memory_reaches_a_second_run_of_the_project(db):
    first = make_run(
        project="textstats",
        turns=[remember("tests", "tests need `make deps` first", project=True), finish_turn()],
    )
    first = drive_until_idle(first)
    assert first.status == "succeeded", first.status_reason
    row = ProjectMemory.objects.get(project="textstats", key="tests")
    assert row.source_run_id == first.pk and row.text == "tests need `make deps` first"
    assert "project 'textstats'" in result_of(first, "remember")["output"]

    second = make_run(project="textstats", turns=[recall("deps"), finish_turn()])
    other = make_run(project="elsewhere", turns=[finish_turn()])
    second, other = drive_until_idle(second), drive_until_idle(other)
    woke = Session.objects.get(run=second, index=1).wake_up
    assert "- [project] tests: tests need `make deps` first" in woke["memory"]["text"]
    assert result_of(second, "recall")["data"]["memory_hits"] == ["project:tests"]
    assert "memory" not in Session.objects.get(run=other, index=1).wake_up


def test_remember_for_the_project_without_a_project_stays_in_run_memory(db):
    run = drive_until_idle(make_run(turns=[remember("k", "v", project=True), finish_turn()]))
    assert "belongs to no project" in result_of(run, "remember")["output"]
    assert memory_of(run) == {"k": "v"} and not ProjectMemory.objects.exists()


def test_people_edit_pin_delete_and_promote_as_events_and_the_agent_is_told(db, slice_per_session):
    run = make_run(
        project="p",
        turns=[remember("a", "first"), remember("b", "second"), handoff(), finish_turn()],
        max_turns_per_session=10,
    )
    # Session 1 runs to its handoff; people change the memory before session 2 starts.
    from agents.runtime.loop import drive

    drive(run.pk)
    while not Session.objects.filter(run=run, index=1, status="ended").exists():
        drive(run.pk)
    memory.set_entry(run.pk, "a", text="first, corrected", actor="user:dana")
    memory.set_entry(run.pk, "b", pinned=True, actor="user:dana")
    memory.set_entry(run.pk, "c", text="from a person", actor="cli:ops")
    memory.promote(run.pk, "a", actor="user:dana")
    memory.delete_entry(run.pk, "c", actor="user:dana")
    kinds = list(
        Event.objects.filter(run=run, actor__in=["user:dana", "cli:ops"])
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == [
        "memory.changed",
        "memory.changed",
        "memory.saved",
        "memory.changed",
        "memory.deleted",
    ]
    entries = {e.key: e for e in memory.run_entries(run.pk)}
    assert entries["a"].text == "first, corrected" and entries["b"].pinned
    assert "c" not in entries
    assert ProjectMemory.objects.get(project="p", key="a").text == "first, corrected"
    run = drive_until_idle(run)
    woke = Session.objects.get(run=run, index=2).wake_up
    told = woke["changed_by_people"]["text"]
    assert "user:dana changed `a` in run memory (text: first, corrected)" in told
    assert "user:dana changed `b` in run memory (pinned)" in told
    assert "cli:ops saved `c`" in told and "user:dana deleted `c` from run memory" in told
    assert "promoted it to project memory" in told
    # Pinned first; the project's copy of a is not listed twice.
    lines = woke["memory"]["text"].splitlines()[1:]
    assert lines == ["- [run, pinned] b: second", "- [run] a: first, corrected"]


def test_people_edits_are_checked():
    from agents import inputs

    run = make_run(turns=[finish_turn()])
    with pytest.raises(inputs.InputError, match="no run memory entry"):
        memory.set_entry(run.pk, "nope", pinned=True, actor="user:x")
    with pytest.raises(inputs.InputError, match="no project"):
        memory.set_entry(run.pk, "k", text="t", scope="project", actor="user:x")
    with pytest.raises(inputs.InputError, match="no run memory entry"):
        memory.delete_entry(run.pk, "nope", actor="user:x")
    with pytest.raises(inputs.InputError, match="empty"):
        memory.set_entry(run.pk, " ", text="t", actor="user:x")


def test_the_wake_up_keeps_memory_within_its_budget_and_lists_what_it_left_out(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "MEMORY_WAKE_TOKENS": 30}
    run = make_run(turns=[finish_turn()])
    for i in range(5):
        memory.set_entry(run.pk, f"k{i}", text="x" * 40, actor="user:x")
    memory.set_entry(run.pk, "k0", pinned=True, actor="user:x")
    text, left_out = memory.wake_up_section(run)
    assert "- [run, pinned] k0:" in text
    # Newest first after the pinned one: k4 fits, the rest do not.
    assert "- [run] k4:" in text
    assert left_out == ["k3", "k2", "k1"]
    assert "Left out to keep within 30 tokens (`recall` reads them): k3, k2, k1" in text


def test_the_most_recalled_entries_come_first(db):
    run = make_run(
        turns=[
            remember("old", "alpha"),
            remember("new", "beta"),
            recall("alpha"),
            recall("alpha"),
            finish_turn(),
        ]
    )
    run = drive_until_idle(run)
    assert [e.key for e in memory.ranked(memory.run_entries(run.pk))] == ["old", "new"]
    assert memory.recall(run, "nothing-like-it").output.startswith("Nothing in memory")
    assert memory.recall(run, "*").data["memory_hits"] == ["run:old", "run:new"]


def cli(*args: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_the_cli_reads_edits_pins_and_forgets_memory_and_the_audit_log_shows_it(db):
    import json

    from django.contrib.auth import get_user_model
    from django.core.management import CommandError

    get_user_model().objects.create_user("dana")
    out = cli("create_run", "--goal", "g", "--check", "true", "--project", "shop", "--json")
    run_id = str(json.loads(out)["id"])
    assert "saved" in cli("remember", run_id, "deps", "make deps first", "--user", "dana")
    cli("remember", run_id, "deps", "--pin", "--user", "dana")
    cli("remember", run_id, "deps", "--promote", "--user", "dana")
    cli("remember", run_id, "style", "tabs", "--project", "--user", "dana")
    listing = cli("memory", run_id)
    assert "Memory of run" in listing and "(project shop)" in listing
    assert "[run, pinned] deps: make deps first" in listing
    assert "[project] style: tabs" in listing
    data = json.loads(cli("memory", run_id, "--json"))
    assert [(e["scope"], e["key"]) for e in data["entries"]] == [
        ("run", "deps"),
        ("project", "style"),
    ]
    assert "deleted" in cli("forget", run_id, "style", "--project", "--user", "dana")
    assert not ProjectMemory.objects.filter(key="style").exists()
    with pytest.raises(CommandError, match="no run memory entry 'nope'"):
        cli("forget", run_id, "nope")
    audit = cli("audit_log", "--run", run_id)
    assert "user:dana memory.saved: run memory saved deps: make deps first" in audit
    assert "memory.changed: run memory changed deps (pinned)" in audit
    assert "memory.changed: project 'shop' memory changed deps: make deps first" in audit
    assert "memory.deleted: project 'shop' memory deleted style" in audit


def test_the_memory_script_carries_memory_across_a_session_and_into_a_second_run(db):
    from agents.providers.scripted import builtin_script

    def memory_run():
        return drive_until_idle(
            make_run(script=builtin_script("memory"), checks=["test -f notes.txt"], project="demo")
        )

    first = memory_run()
    assert first.status == "succeeded", first.status_reason
    hits = [
        p["data"]["memory_hits"]
        for p in Event.objects.filter(run=first, kind=EventKind.TOOL_RESULT, payload__name="recall")
        .order_by("seq")
        .values_list("payload", flat=True)
    ]
    assert hits == [[], ["run:checks"]]  # nothing known at first; after the handoff, it is
    assert "checks" in Session.objects.get(run=first, index=2).wake_up["memory"]["text"]

    second = memory_run()
    assert second.status == "succeeded", second.status_reason
    woke = Session.objects.get(run=second, index=1).wake_up["memory"]["text"]
    assert "- [project] checks: The done-condition is `test -f notes.txt`" in woke
    first_recall = (
        Event.objects.filter(run=second, kind=EventKind.TOOL_RESULT, payload__name="recall")
        .order_by("seq")
        .first()
    )
    assert first_recall.payload["data"]["memory_hits"] == ["project:checks"]


def test_saving_again_under_a_key_replaces_its_text_and_keeps_its_pin(db):
    run = make_run(turns=[finish_turn()])
    memory.set_entry(run.pk, "k", text="one", actor="user:x")
    memory.set_entry(run.pk, "k", pinned=True, actor="user:x")
    _, events = memory.remember(run, {"key": "k", "text": "two"}, actor="agent")
    from agents import eventlog

    eventlog.append(run.pk, events[0].kind, events[0].payload, actor="agent")
    (entry,) = memory.run_entries(run.pk)
    assert (entry.text, entry.pinned, entry.by) == ("two", True, "agent")
