"""Branch points in scripts (agents/providers/script_branches.py), through real runs: the real
runtime writes the denials, notes and first messages the scripted agent reads, so a change of the
runtime's wording fails here."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import checkpoints, reaper, rewinds, sandbox, services
from agents.approvals import decide
from agents.models import Approval, Event, Run, RunScript, RunStatus
from agents.providers.scripted import ScriptError, validate_script
from agents.runtime.loop import drive
from tests.helpers import approve_pending, call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db

RISKY = "rm -rf build"  # the risk classifier asks a person


def mark(name: str) -> dict:
    """A turn that leaves `name` in the workspace, so the branch played shows in the files."""
    return {"text": f"Taking {name}.", "tool_calls": [call("write_file", path=name, content="x")]}


def ending(name: str) -> list[dict]:
    return [mark(name), finish_turn(name)]


def point(*branches: tuple[dict, list[dict]], otherwise: list[dict] | None = None) -> dict:
    out: dict = {"branches": [{"when": when, "turns": turns} for when, turns in branches]}
    if otherwise is not None:
        out["else"] = otherwise
    return out


def marks(run: Run) -> set[str]:
    return {p.name for p in run.workspace_path.iterdir() if p.suffix == ".txt"}


def choices(run: Run) -> list[dict]:
    return [
        c
        for meta in Event.objects.on_live_branch(run.pk)
        .filter(kind="model.turn")
        .order_by("seq")
        .values_list("payload__meta", flat=True)
        for c in meta.get("chose", [])
    ]


def asking(*rest: dict, **kwargs) -> Run:
    """A run whose first turn asks a person, then `rest`; driven until it waits."""
    turns = [{"text": "Cleaning up.", "tool_calls": [call("bash", command=RISKY)]}, *rest]
    run = drive_until_idle(make_run(turns=turns, **kwargs))
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    return run


def deny(run: Run, user, reason: str) -> Run:
    for approval in Approval.objects.filter(run=run, status="pending"):
        decide(approval.pk, user=user, approve=False, comment=reason)
    return drive_until_idle(run)


# --- denied ---------------------------------------------------------------------------------
KEEP_OR_NOT = point(({"denied": "keep"}, ending("kept.txt")), otherwise=ending("else.txt"))


def test_a_denial_whose_reason_matches_plays_its_branch(decider):
    run = deny(asking(KEEP_OR_NOT), decider, "KEEP the build folder")
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert marks(run) == {"kept.txt"}
    assert choices(run) == [
        {"at": "turns[1]", "branch": 0, "matched": {"denied": "KEEP the build folder"}}
    ]


def test_a_denial_for_another_reason_plays_else(decider):
    run = deny(asking(KEEP_OR_NOT), decider, "not today")
    assert marks(run) == {"else.txt"}
    assert choices(run) == [{"at": "turns[1]", "branch": "else"}]


def test_an_approval_is_no_denial(decider):
    run = asking(point(({"denied": ""}, ending("denied.txt")), otherwise=ending("else.txt")))
    approve_pending(run, decider)
    assert marks(drive_until_idle(run)) == {"else.txt"}


def test_a_denial_counts_only_until_the_agents_next_turn(decider):
    later = point(({"denied": ""}, ending("denied.txt")), otherwise=ending("else.txt"))
    run = deny(asking({"tool_calls": [call("list_files")]}, later), decider, "no")
    assert marks(run) == {"else.txt"}


def test_the_tool_policys_denial_is_not_a_persons(db):
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=RISKY)]},
            point(({"denied": ""}, ending("denied.txt")), otherwise=ending("else.txt")),
        ],
        tool_policy=[{"tool": "bash", "pattern": "rm", "action": "deny"}],
    )
    assert marks(drive_until_idle(run)) == {"else.txt"}


def test_an_expired_approval_counts_as_denied(db):
    branch = point(({"denied": "expired"}, ending("expired.txt")), otherwise=ending("else.txt"))
    run = asking(branch, approval_timeout_seconds=60)
    reaper.reap(now=timezone.now() + timedelta(seconds=61))
    services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert marks(run) == {"expired.txt"}
    assert choices(run)[0]["matched"] == {"denied": "nobody decided in time (expired)"}


# --- note -----------------------------------------------------------------------------------
NOTE_OR_NOT = point(({"note": r"\btabs?\b"}, ending("tabs.txt")), otherwise=ending("else.txt"))


def test_a_note_that_arrived_during_the_session_plays_its_branch(db):
    run = make_run(turns=[{"tool_calls": [call("list_files")]}, NOTE_OR_NOT])
    drive(run.pk, max_seconds=0.000001)  # one step
    services.note_run(run.pk, "Indent with tabs, please", actor="user:olivia")
    run = drive_until_idle(run)
    assert marks(run) == {"tabs.txt"}
    assert choices(run)[0]["matched"] == {"note": "Indent with tabs, please"}


def test_a_note_carried_in_the_sessions_first_message_counts(db, slice_per_session):
    # (The agent's own handoff: a synthesized one would carry the choice made as it was asked
    # for, before the note came.)
    handoff = call("handoff", summary="s", done=[], next_steps=[], open_questions=[])
    turns = [{"tool_calls": [call("list_files")]}, {"tool_calls": [handoff]}, NOTE_OR_NOT]
    run = make_run(turns=turns, max_turns_per_session=1)
    while not run.sessions.filter(status="ended").exists():
        drive(run.pk)
    services.note_run(run.pk, "tabs, not spaces", actor="user:olivia")
    run = drive_until_idle(run)
    second = run.sessions.get(index=2)
    first = Event.objects.get(session=second, kind="session.started").payload["first_message"]
    assert "# Notes from people\n- user:olivia: tabs, not spaces" in first
    assert marks(run) == {"tabs.txt"}


def test_a_note_that_does_not_match_plays_else(db):
    run = make_run(turns=[{"tool_calls": [call("list_files")]}, NOTE_OR_NOT])
    drive(run.pk, max_seconds=0.000001)
    services.note_run(run.pk, "establish a table", actor="user:olivia")
    assert marks(drive_until_idle(run)) == {"else.txt"}


# --- rewind_note ----------------------------------------------------------------------------
def rewound(with_note: str, **when) -> Run:
    """Turn 0 waits for a person; rewound to before it `with_note`, then driven on."""
    run = asking(point((when, ending("matched.txt")), otherwise=ending("else.txt")))
    target = run.checkpoints.get(kind="pre_approval")
    rewinds.rewind(run.pk, target.pk, actor="user:dana", note=with_note)
    return drive_until_idle(run)


def test_a_rewind_whose_note_matches_plays_its_branch(db):
    run = rewound("mind the dashes", rewind_note="dash")
    assert run.status == RunStatus.SUCCEEDED and marks(run) == {"matched.txt"}
    assert choices(run)[0]["matched"] == {"rewind_note": "mind the dashes"}


def test_a_rewind_note_is_not_a_note_and_a_note_not_a_rewind_note(db):
    assert marks(rewound("mind the dashes", note="dash")) == {"else.txt"}
    run = make_run(
        turns=[
            {"tool_calls": [call("list_files")]},
            point(({"rewind_note": ""}, ending("matched.txt")), otherwise=ending("else.txt")),
        ]
    )
    drive(run.pk, max_seconds=0.000001)
    services.note_run(run.pk, "(with the rewind to checkpoint 1) dash", actor="user:olivia")
    assert marks(drive_until_idle(run)) == {"else.txt"}


def test_a_rewind_without_a_note_matches_no_rewind_note(db):
    assert marks(rewound("", rewind_note="")) == {"else.txt"}


def test_a_fork_with_a_note_plays_the_branch(decider):
    run = asking(point(({"rewind_note": "dash"}, ending("matched.txt")), otherwise=ending("e.txt")))
    target = run.checkpoints.get(kind="pre_approval")
    fork = checkpoints.fork(run.pk, target.pk, actor="user:dana", note="Dashes are not words")
    assert marks(drive_until_idle(fork)) == {"matched.txt"}


# --- all of a when; else; nothing; nesting ---------------------------------------------------
def test_every_condition_of_a_when_must_hold(decider):
    both = point(
        ({"denied": "keep", "note": "tabs"}, ending("both.txt")),
        ({"denied": "keep"}, ending("denied.txt")),
        otherwise=ending("else.txt"),
    )
    run = asking(both)
    services.note_run(run.pk, "tabs please", actor="user:dana")
    run = deny(run, decider, "keep it")
    assert marks(run) == {"both.txt"}
    assert choices(run)[0]["matched"] == {"denied": "keep it", "note": "tabs please"}

    run = deny(asking(both), decider, "keep it")
    assert marks(run) == {"denied.txt"}


def test_without_else_nothing_plays_and_the_script_carries_on(decider):
    run = asking(point(({"denied": ""}, [mark("denied.txt")])), *ending("after.txt"))
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert marks(run) == {"after.txt"}
    assert choices(run) == [{"at": "turns[1]", "branch": "nothing"}]


def test_after_a_branch_the_script_carries_on_after_the_branch_point(decider):
    run = asking(
        point(({"denied": ""}, [mark("denied.txt")]), otherwise=[mark("else.txt")]),
        *ending("after.txt"),
    )
    run = deny(run, decider, "no")
    assert marks(run) == {"denied.txt", "after.txt"}
    indexes = [
        m["script_index"]
        for m in Event.objects.filter(run=run, kind="model.turn")
        .order_by("seq")
        .values_list("payload__meta", flat=True)
    ]
    assert indexes == [0, 1, 3, 4]  # in document order: the else turn is 2


def test_branch_points_nest(decider):
    inner = point(({"note": "tabs"}, [mark("tabs.txt")]), otherwise=[mark("spaces.txt")])
    outer = point(
        ({"denied": "keep"}, [mark("kept.txt"), inner, mark("kept-end.txt")]),
        otherwise=ending("else.txt"),
    )
    run = asking(outer, *ending("after.txt"))
    services.note_run(run.pk, "use tabs", actor="user:dana")
    run = deny(run, decider, "keep them")
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert marks(run) == {"kept.txt", "tabs.txt", "kept-end.txt", "after.txt"}
    assert [c["at"] for c in choices(run)] == ["turns[1]", "turns[1].branches[0].turns[1]"]
    # Two branch points passed in a row are both recorded by the turn that passes them.
    twice = asking(
        point(({"denied": ""}, [inner])),
        *ending("after.txt"),
    )
    twice = deny(twice, decider, "no")
    assert marks(twice) == {"spaces.txt", "after.txt"}
    first_played = Event.objects.filter(run=twice, kind="model.turn").order_by("seq")[1]
    assert [c["branch"] for c in first_played.payload["meta"]["chose"]] == [0, "else"]


# --- handoff, a killed worker, delay_factor --------------------------------------------------
def test_a_choice_made_as_the_harness_asks_for_a_handoff_survives_it(decider):
    # Two turns a session: the denial arrives with the request to hand off; the new session
    # (whose conversation holds no denial) still plays the denial's branch.
    run = asking(
        point(({"denied": "keep"}, ending("kept.txt")), otherwise=ending("else.txt")),
        max_turns_per_session=1,
    )
    run = deny(run, decider, "keep it")
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert marks(run) == {"kept.txt"}
    handoff = (
        Event.objects.filter(run=run, kind="model.turn", payload__meta__synthesized="handoff")
        .order_by("seq")
        .first()
    )
    assert handoff.payload["meta"]["pending"][0]["branch"] == 0
    second = run.sessions.get(index=2)
    first = Event.objects.get(session=second, kind="session.started").payload["first_message"]
    assert "A person denied" not in first


def test_a_worker_killed_in_the_middle_of_a_branch_plays_the_same_branch_again(
    transactional_db, decider, monkeypatch
):
    branch = point(
        (
            {"denied": "keep"},
            [
                {"tool_calls": [call("bash", command="echo A >> a.txt")]},
                mark("b.txt"),
                finish_turn(),
            ],
        ),
        otherwise=ending("else.txt"),
    )
    run = asking(branch)
    for approval in Approval.objects.filter(run=run, status="pending"):
        decide(approval.pk, user=decider, approve=False, comment="keep it")
    real_execute = sandbox.execute

    def die_after_running(*args, **kwargs):
        real_execute(*args, **kwargs)
        raise SystemExit("worker killed")

    monkeypatch.setattr(sandbox, "execute", die_after_running)
    with pytest.raises(SystemExit):
        drive(run.pk)
    monkeypatch.setattr(sandbox, "execute", real_execute)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run = drive_until_idle(run)
    # The slice ran again: the denial is no longer the latest thing it read, yet the branch goes
    # on where it was.
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert {p.name for p in run.workspace_path.iterdir()} >= {"a.txt", "b.txt"}
    assert "else.txt" not in marks(run)
    assert (run.workspace_path / "a.txt").read_text() == "A\n"  # run once
    assert len(choices(run)) == 1


def test_delay_factor_stretches_the_turns_delay(db):
    run = make_run(
        turns=[
            {"text": "slow", "delay_factor": 4, "tool_calls": [call("list_files")]},
            {"text": "instant", "delay_factor": 0, "tool_calls": [call("list_files")]},
            finish_turn(),
        ]
    )
    row = RunScript.objects.get(run=run)
    row.script["turn_delay_seconds"] = 0.05
    row.save(update_fields=["script"])
    started = time.monotonic()
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    metas = list(
        Event.objects.filter(run=run, kind="model.turn")
        .order_by("seq")
        .values_list("payload__meta", flat=True)
    )
    assert [m.get("delay_factor") for m in metas] == [4, 0, None]
    assert metas[2] == {"script_index": 2}  # a turn without one records what it always did
    print(f"three turns, expected sleeps 0.2 + 0 + 0.05 s: {time.monotonic() - started:.3f} s")


# --- bad shapes -----------------------------------------------------------------------------
BAD = [
    ({"else": []}, "turns[1]: missing required field 'branches'"),
    (
        {"branches": [{"when": {"denial": "x"}}]},
        "turns[1].branches[0].when: unexpected field 'denial' (allowed: denied, note, rewind_note)",
    ),
    (
        {"branches": [{"when": {"denied": "(keep"}}]},
        "turns[1].branches[0].when.denied: not a valid regular expression (missing ): (keep",
    ),
    (
        {"branches": [{"when": {"note": "x" * 301}}]},
        "turns[1].branches[0].when.note is too long (at most 300)",
    ),
    ({"branches": [{"when": {}}]}, "turns[1].branches[0].when must not be empty"),
    ({"branches": []}, "turns[1].branches must not be empty"),
    ({"branches": [{"turns": []}]}, "turns[1].branches[0]: missing required field 'when'"),
    (
        {"branches": [{"when": {"note": "x"}, "turn": []}]},
        "turns[1].branches[0]: unexpected field 'turn' (allowed: turns, when)",
    ),
    (
        {"branches": [{"when": {"note": "x"}}], "text": "hi"},
        "turns[1]: unexpected field 'text' (allowed: branches, else)",
    ),
    (
        {"branches": [{"when": {"note": 3}}]},
        "turns[1].branches[0].when.note must be text, not a whole number",
    ),
    (
        {"branches": [{"when": {"note": "x"}, "turns": [{}]}]},
        "turns[1].branches[0].turns[0] needs text or at least one tool call",
    ),
    (
        {"branches": [{"when": {"note": "x"}}], "else": [{"branches": [{"when": {"note": "["}}]}]},
        "turns[1].else[0].branches[0].when.note: not a valid regular expression",
    ),
    ({"text": "x", "delay_factor": 11}, "turns[1].delay_factor must be at most 10"),
    ({"text": "x", "delay_factor": -1}, "turns[1].delay_factor must be at least 0"),
]


@pytest.mark.parametrize(("item", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_branch_point_is_refused_saying_where_and_why(item, message):
    script = {"turns": [{"text": "first"}, item]}
    with pytest.raises(ScriptError) as refused:
        validate_script(script)
    assert str(refused.value).startswith(message), str(refused.value)


def test_branch_points_nest_at_most_20_deep():
    item: dict = {"text": "deep"}
    for _ in range(21):
        item = {"branches": [{"when": {"note": "x"}, "turns": [item]}]}
    with pytest.raises(ScriptError, match=re.escape("branch points nest at most 20 deep")):
        validate_script({"turns": [item]})


def test_a_bad_script_is_refused_when_a_run_is_created(db):
    with pytest.raises(services.RunError, match=re.escape("script: turns[1]: missing required")):
        make_run(script={"turns": [{"text": "x"}, {"else": []}]})
