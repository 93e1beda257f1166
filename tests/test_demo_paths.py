"""The demo reacts to people at its risky step (`rm -rf build __pycache__`): each path ends
with the checks passing, each leaving different files. Driven in-process through the real
runtime, tools, approvals, notes, rewinds and forks."""

from __future__ import annotations

import pytest

from agents import checkpoints, rewinds, services
from agents.approvals import decide
from agents.models import Approval, Event, Run, RunStatus
from tests.helpers import approve_pending, drive_until_idle, kinds

pytestmark = pytest.mark.django_db

# The approved demo's event kinds as the demo played before it could branch (recorded from the
# code before this change): approving must still give exactly these.
BEFORE = [
    "run.created", "run.status", "run.isolation", "session.started", "checkpoint.created",
    "model.turn", "tool.call", "tool.result", "model.turn", "tool.call", "tool.result",
    "model.turn", "tool.call", "tool.result", "model.turn", "tool.call", "run.status",
    "check.result", "artifact.saved", "run.status", "tool.result", "harness.message",
    "model.turn", "tool.call", "artifact.saved", "tool.result", "check.result", "session.ended",
    "checkpoint.created", "session.started", "model.turn", "tool.call", "tool.result",
    "model.turn", "tool.call", "tool.result", "model.turn", "approval.requested",
    "checkpoint.created", "run.status", "approval.decided", "run.status", "run.status",
    "tool.call", "tool.result", "model.turn", "tool.call", "artifact.saved", "tool.result",
    "tool.call", "run.status", "check.result", "artifact.saved", "tool.result", "session.ended",
    "checkpoint.created", "run.status",
]  # fmt: skip


@pytest.fixture
def waiting(decider):
    """The demo at its risky step, waiting for a person."""
    run = drive_until_idle(services.create_demo_run())
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    return run


def deny(run: Run, user, reason: str) -> None:
    for approval in Approval.objects.filter(run=run, status="pending"):
        decide(approval.pk, user=user, approve=False, comment=reason)


def succeeded(run: Run) -> Run:
    """The run, driven on: it passed its checks, within every session's turn limit."""
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    last = run.sessions.order_by("-index").first()
    assert last.end_reason == "finished" and last.turns <= run.max_turns_per_session
    assert not Event.objects.filter(
        session=last, kind="harness.message", payload__reason="handoff_requested"
    ).exists()  # it finished before its limit, never asked to hand off
    return run


def files(run: Run) -> dict[str, str]:
    return {
        p.name: p.read_text()
        for p in run.workspace_path.iterdir()
        if p.is_file() and p.suffix in ("", ".py")  # .gitignore included
    }


def last_choice(run: Run) -> dict:
    metas = [
        e.payload["meta"]
        for e in Event.objects.on_live_branch(run.pk).filter(kind="model.turn").order_by("seq")
    ]
    chosen = [m["chose"] for m in metas if "chose" in m]
    assert chosen, "no turn passed the branch point"
    return chosen[-1][0]


def finish_summary(run: Run) -> str:
    call = (
        Event.objects.filter(run=run, kind="tool.call", payload__name="finish")
        .order_by("-seq")
        .first()
    )
    return call.payload["input"]["summary"]


def ending_as_before(found: dict[str, str]) -> None:
    assert "return len(text.split())" in found["textstats.py"]
    assert "def words(" not in found["textstats.py"] and "sorted(" not in found["textstats.py"]
    assert ".gitignore" not in found


def test_approved_it_ends_as_it_always_did(waiting, decider):
    approve_pending(waiting, decider)
    run = succeeded(waiting)
    assert kinds(run) == BEFORE
    assert last_choice(run) == {"at": "turns[8]", "branch": "else"}
    ending_as_before(files(run))


def test_denied_with_a_reason_about_keeping_things_it_lists_them_in_gitignore(waiting, decider):
    deny(waiting, decider, "Keep the cache, please")
    run = succeeded(waiting)
    found = files(run)
    assert found[".gitignore"].split() == ["build/", "__pycache__/"]
    assert last_choice(run) == {
        "at": "turns[8]",
        "branch": 0,
        "matched": {"denied": "Keep the cache, please"},
    }
    assert ".gitignore" in finish_summary(run)
    # The tests ran after the denial (the denied command never did).
    bash = Event.objects.filter(run=run, kind="tool.result", payload__name="bash").last()
    assert "OK" in bash.payload["output"]


@pytest.mark.parametrize(
    "reason", ["don't delete anything", "Do not remove build/", "never delete"]
)
def test_every_way_of_saying_keep_it_keeps_it(waiting, decider, reason):
    deny(waiting, decider, reason)
    assert ".gitignore" in files(succeeded(waiting))


def test_denied_for_any_other_reason_it_skips_the_cleanup(waiting, decider):
    deny(waiting, decider, "not during office hours")
    run = succeeded(waiting)
    assert last_choice(run)["branch"] == 1
    assert "denied" in finish_summary(run) and "skipped" in finish_summary(run)
    ending_as_before(files(run))


def test_a_note_about_ties_sent_while_it_waits_makes_top_words_break_them_alphabetically(
    waiting, decider
):
    services.note_run(waiting.pk, "Please break ties alphabetically.", actor="user:dana")
    approve_pending(waiting, decider)
    run = succeeded(waiting)
    assert last_choice(run) == {
        "at": "turns[8]",
        "branch": 2,
        "matched": {"note": "Please break ties alphabetically."},
    }
    found = files(run)
    assert "key=lambda item: (-item[1], item[0])" in found["textstats.py"]
    assert "def test_ties_are_broken_alphabetically" in found["test_textstats.py"]
    assert ".gitignore" not in found


def assert_dash_ending(run: Run) -> None:
    found = files(run)
    assert "def words(" in found["textstats.py"]
    assert "return len(words(text))" in found["textstats.py"]
    assert "Counter(words(text))" in found["textstats.py"]
    assert "def test_a_lone_dash_is_not_a_word" in found["test_textstats.py"]
    assert last_choice(run)["branch"] == 3


def test_rewound_to_the_end_of_session_1_with_a_note_about_dashes(waiting, decider):
    target = waiting.checkpoints.get(kind="session_end")
    rewinds.rewind(waiting.pk, target.pk, actor="user:dana", note="A lone dash is not a word.")
    run = drive_until_idle(waiting)
    assert run.status == RunStatus.AWAITING_APPROVAL  # session 2's steps again, risky one too
    approve_pending(run, decider)
    run = succeeded(run)
    assert_dash_ending(run)
    assert last_choice(run)["matched"] == {"rewind_note": "A lone dash is not a word."}


def test_rewound_to_the_checkpoint_before_the_approval_with_a_note_about_hyphens(waiting, decider):
    target = waiting.checkpoints.get(kind="pre_approval")
    rewinds.rewind(waiting.pk, target.pk, actor="user:dana", note="Mind the hyphens")
    run = succeeded(waiting)  # nothing waits: the discarded approval is not asked again
    assert_dash_ending(run)
    assert run.sessions.order_by("-index").first().turns == 1


def test_a_rewind_note_about_something_else_changes_nothing(waiting, decider):
    target = waiting.checkpoints.get(kind="pre_approval")
    rewinds.rewind(waiting.pk, target.pk, actor="user:dana", note="go carefully")
    run = succeeded(waiting)
    assert last_choice(run) == {"at": "turns[8]", "branch": "else"}
    ending_as_before(files(run))


def test_a_fork_with_a_note_about_punctuation(waiting, decider):
    target = waiting.checkpoints.get(kind="session_end")
    fork = checkpoints.fork(
        waiting.pk, target.pk, actor="user:dana", note="punctuation is not a word"
    )
    fork = drive_until_idle(fork)
    assert fork.status == RunStatus.AWAITING_APPROVAL
    approve_pending(fork, decider)
    fork = succeeded(fork)
    assert_dash_ending(fork)
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.AWAITING_APPROVAL  # the original is untouched


def test_session_2s_first_turn_and_the_risky_turn_take_three_times_the_demo_delay(
    settings, decider
):
    delay = 0.1
    settings.SHIFTLOG = {**settings.SHIFTLOG, "DEMO_TURN_DELAY_SECONDS": delay}
    run = drive_until_idle(services.create_demo_run())
    approve_pending(run, decider)
    run = succeeded(run)
    turns = list(Event.objects.filter(run=run, kind="model.turn").order_by("seq"))
    slow = [
        (t.payload["meta"]["script_index"], t.payload["meta"].get("delay_factor", 1)) for t in turns
    ]
    assert [(i, f) for i, f in slow if f != 1] == [(5, 3), (7, 3)]
    second = run.sessions.get(index=2)
    assert next(t for t in turns if t.session_id == second.pk).payload["meta"]["script_index"] == 5
    # Figures, not asserted (timing on a shared machine): the time before each turn.
    for turn in turns:
        before = Event.objects.filter(run=run, seq__lt=turn.seq).order_by("-seq").first()
        meta = turn.payload["meta"]
        print(
            f"turn {meta['script_index']}: delay {delay} s x {meta.get('delay_factor', 1)}, "
            f"{(turn.created_at - before.created_at).total_seconds():.3f} s after the event before it"
        )
