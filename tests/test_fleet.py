"""Fleets in one process: spawning, waiting at zero compute, waking, merging (clean and
conflicting, both conflict modes), budgets carved and rolled up, cascades, limits, the CLI's and
the API's view of a fleet. Real runs, real workspaces, real snapshots; the runs are driven slice
by slice as workers would (tests/test_fleet_workers.py does it with real worker processes)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.core.management import call_command

from agents import approvals, reaper, rewinds, services
from agents.fleets import spawn as fleet_spawn
from agents.fleets import tree as fleets
from agents.fleets.demo import create_fleet_demo_run
from agents.management.commands.rewind_run import describe_discarded
from agents.models import Approval, Checkpoint, Event, FleetChild, Run, RunStatus
from agents.runtime.loop import drive
from tests.helpers import (
    approve_pending,
    call,
    client_for,
    drive_until_idle,
    finish_turn,
    make_run,
    script,
)

pytestmark = pytest.mark.django_db


def write(path: str, content: str) -> dict:
    return {
        "text": f"writing {path}",
        "tool_calls": [call("write_file", path=path, content=content)],
    }


def child(goal: str, *turns: dict, checks: list[str] | None = None, **extra) -> dict:
    return {"goal": goal, "checks": checks or ["true"], "script": script(*turns), **extra}


def spawn(*children: dict, wait: str = "all") -> dict:
    return {
        "text": "spawning",
        "tool_calls": [call("spawn_runs", children=list(children), wait=wait)],
    }


MERGE = {"text": "merging", "tool_calls": [call("merge_children")]}


def events(run: Run, kind: str) -> list[dict]:
    return [e.payload for e in Event.objects.filter(run=run, kind=kind).order_by("seq")]


def last_result(run: Run, name: str) -> dict:
    return (
        events(run, "tool.result")
        and [p for p in events(run, "tool.result") if p["name"] == name][-1]
    )


def children_of(run: Run) -> list[Run]:
    return list(Run.objects.filter(parent=run).order_by("pk"))


def drive_children(run: Run) -> list[Run]:
    return [drive_until_idle(c) for c in children_of(run)]


# --- spawn, wait, wake, merge ------------------------------------------------------------------
def test_the_fleet_demo_spawns_waits_at_zero_compute_wakes_merges_and_succeeds(decider):
    parent = drive_until_idle(create_fleet_demo_run(turn_delay_seconds=0))
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN, parent.status_reason
    # Zero compute: no lease, no worker can claim it, the reaper leaves it alone.
    assert not parent.lease_owner and parent.lease_expires_at is None
    queued_at = parent.enqueued_at
    assert drive(parent.pk).result == "not-claimed"
    assert parent.pk not in reaper.reap()
    parent.refresh_from_db()
    assert parent.enqueued_at == queued_at

    kids = children_of(parent)
    assert len(kids) == 2 and all(k.depth == 1 and k.status == "queued" for k in kids)
    (spawned,) = events(parent, "fleet.spawned")
    assert [c["run_id"] for c in spawned["children"]] == [k.pk for k in kids]
    assert spawned["children"][0]["from"] == "."
    # Each child's workspace starts as the parent's at the checkpoint taken before the spawn.
    assert (kids[0].workspace_path / "report.py").exists()

    text_child, num_child = drive_children(parent)
    assert text_child.status == "succeeded", text_child.status_reason
    assert num_child.status == "awaiting_approval"  # its rm -rf waits for a person
    parent.refresh_from_db()
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN  # one child still live
    assert events(parent, "fleet.child_ended") == [{"run_id": text_child.pk, "status": "succeeded"}]

    approve_pending(num_child, decider)
    assert drive_until_idle(num_child).status == "succeeded"
    parent.refresh_from_db()
    assert parent.status == "queued"
    (woke,) = events(parent, "fleet.woke")
    assert woke["reason"] == "all 2 child runs ended"

    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    told = [p for p in events(parent, "harness.message") if p["reason"] == "fleet_outcomes"]
    assert len(told) == 1 and "textstats.py" in told[0]["text"] and "passed" in told[0]["text"]
    merges = events(parent, "fleet.merge")
    assert [(m["run_id"], m["result"]) for m in merges] == [
        (text_child.pk, "applied"),
        (num_child.pk, "applied"),
    ]
    labels = list(
        Checkpoint.objects.filter(run=parent, kind="merge").values_list("label", flat=True)
    )
    assert [lbl.split()[0] for lbl in labels] == ["before", "after"]
    for name in ("textstats.py", "numstats.py", "test_numstats.py"):
        assert (parent.workspace_path / name).exists(), name
    assert fleets.rollup(parent).tokens == sum(
        r.total_tokens for r in [parent, *children_of(parent)]
    )


def test_wait_any_wakes_at_the_first_child_to_end():
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(
                    child("quick", finish_turn()),
                    child("slow", write("a.txt", "a"), finish_turn()),
                    wait="any",
                ),
                finish_turn(),
            ]
        )
    )
    quick, slow = children_of(parent)
    assert drive_until_idle(quick).status == "succeeded"
    parent.refresh_from_db()
    assert parent.status == "queued"
    assert events(parent, "fleet.woke")[0]["reason"] == f"child run {quick.pk} ended (succeeded)"
    slow.refresh_from_db()
    assert slow.status == "queued"  # the other one carries on


def test_a_subfolder_child_sees_only_that_folder_and_merges_back_under_it():
    parent = drive_until_idle(
        make_run(
            turns=[
                write("pkg/mod.py", "x = 1\n"),
                write("top.txt", "top\n"),
                spawn(
                    child("pkg work", write("new.py", "y = 2\n"), finish_turn(), **{"from": "pkg"})
                ),
                MERGE,
                finish_turn(),
            ],
            checks=["test -f pkg/new.py"],
        )
    )
    (kid,) = children_of(parent)
    assert sorted(p.name for p in kid.workspace_path.iterdir()) == ["mod.py"]
    drive_until_idle(kid)
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert events(parent, "fleet.merge")[0]["files"] == ["pkg/new.py"]


def test_a_bad_folder_and_a_scripted_child_without_a_script_are_tool_errors():
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(child("x", finish_turn(), **{"from": "nope"})),
                spawn({"goal": "no script", "checks": ["true"]}),
                spawn(child("x", finish_turn(), **{"from": "../up"})),
                finish_turn(),
            ]
        )
    )
    assert parent.status == "succeeded"
    errors = [p["output"] for p in events(parent, "tool.result") if p["name"] == "spawn_runs"]
    assert "no folder 'nope'" in errors[0]
    assert "a scripted child needs a script" in errors[1]
    assert "leaves the workspace" in errors[2]
    assert not children_of(parent) and not FleetChild.objects.exists()


def test_spawning_is_idempotent_per_call():
    parent = drive_until_idle(make_run(turns=[spawn(child("a", finish_turn())), finish_turn()]))
    row = FleetChild.objects.get(parent=parent)
    checkpoint = Checkpoint.objects.filter(run=parent).order_by("-seq").first()
    from django.db import transaction

    with transaction.atomic():
        again = fleet_spawn.spawn(
            parent,
            row.tool_use_id,
            {"children": [child("a", finish_turn())]},
            checkpoint,
            actor="test",
            lease_owner=None,
        )
    assert [f.pk for f in again] == [row.pk]
    assert Run.objects.filter(parent=parent).count() == 1
    assert len(events(parent, "fleet.spawned")) == 1


# --- merging with conflicts --------------------------------------------------------------------
BASE = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n"


def conflicting_fleet(**run_kwargs) -> Run:
    """Two children change the same line of shared.txt differently (the second also adds a
    file of its own): the first merges, the second conflicts with it."""
    return make_run(
        turns=[
            write("shared.txt", BASE),
            spawn(
                child(
                    "first", write("shared.txt", BASE.replace("two", "TWO (first)")), finish_turn()
                ),
                child(
                    "second",
                    write("shared.txt", BASE.replace("two", "2 (second)").replace("six", "SIX")),
                    write("extra.txt", "only the second\n"),
                    finish_turn(),
                ),
            ),
            MERGE,
            finish_turn(),
        ],
        checks=["true"],
        **run_kwargs,
    )


def test_a_conflict_applies_nothing_of_that_child_and_is_handed_to_the_agent():
    parent = drive_until_idle(conflicting_fleet())
    first, second = drive_children(parent)
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    merges = events(parent, "fleet.merge")
    assert [(m["run_id"], m["result"]) for m in merges] == [
        (first.pk, "applied"),
        (second.pk, "conflict"),
    ]
    assert merges[1]["conflicts"] == ["shared.txt"]
    shared = (parent.workspace_path / "shared.txt").read_text()
    assert "TWO (first)" in shared and "SIX" not in shared  # nothing of the second half-applied
    assert not (parent.workspace_path / "extra.txt").exists()
    result = last_result(parent, "merge_children")["output"]
    assert (
        "<<<<<<< ours (parent)" in result and "2 (second)" in result and ">>>>>>> theirs" in result
    )
    assert FleetChild.objects.get(child=second).merge_state == "conflict"


@pytest.mark.parametrize(
    ("decision", "expect"),
    [
        ("approve", "2 (second)"),  # theirs
        ("ours", "TWO (first)"),
        ("edit", "two, settled by a person"),
        ("deny", "TWO (first)"),
    ],
)
def test_a_conflict_asked_of_a_person_is_applied_as_they_decide(decider, decision, expect):
    parent = drive_until_idle(conflicting_fleet(fleet_conflicts="person"))
    _first, second = drive_children(parent)
    parent = drive_until_idle(parent)
    assert parent.status == "awaiting_approval", parent.status_reason
    approval = Approval.objects.get(run=parent, status="pending")
    assert approval.tool_name == "merge_conflict"
    assert approval.tool_input["run_id"] == second.pk
    assert approval.tool_input["conflicts"][0]["path"] == "shared.txt"
    assert not (parent.workspace_path / "extra.txt").exists()
    if decision == "deny":
        approvals.decide(approval.pk, user=decider, approve=False, comment="keep ours")
    else:
        edited = {
            "ours": {"choose": "ours"},
            "edit": {"files": {"shared.txt": "two, settled by a person\n"}},
        }.get(decision)
        approvals.decide(approval.pk, user=decider, approve=True, edited_input=edited)
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert expect in (parent.workspace_path / "shared.txt").read_text()
    # The non-conflicting part of the child comes in with the decision.
    assert (parent.workspace_path / "extra.txt").read_text() == "only the second\n"
    last = events(parent, "fleet.merge")[-1]
    assert last["run_id"] == second.pk and last["result"] == "applied"
    assert last["approval_id"] == approval.pk
    assert FleetChild.objects.get(child=second).merge_state == "resolved"


def test_merge_children_refuses_runs_that_are_not_its_succeeded_children():
    other = make_run(turns=[finish_turn()])
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(child("a", finish_turn())),
                {"text": "m", "tool_calls": [call("merge_children", runs=[other.pk])]},
                MERGE,
                MERGE,
                finish_turn(),
            ]
        )
    )
    drive_children(parent)
    parent = drive_until_idle(parent)
    outs = [p for p in events(parent, "tool.result") if p["name"] == "merge_children"]
    assert f"run {other.pk} is not a child of this run" in outs[0]["output"] and outs[0]["is_error"]
    assert "merged (0 file(s) changed)" in outs[1]["output"]
    assert "no succeeded child is left to merge" in outs[2]["output"]


# --- budgets -----------------------------------------------------------------------------------
def test_budget_shares_are_carved_from_what_remains_and_refused_beyond_it():
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(
                    child("a", finish_turn(), budget_tokens=600_000),
                    child("b", finish_turn(), budget_tokens=600_000),
                ),
                spawn(
                    child("a", finish_turn(), budget_tokens=100_000),
                    child("b", finish_turn()),
                    child("c", finish_turn()),
                ),
                finish_turn(),
            ],
            budgets=services.Budgets(max_tokens=1_000_000),
        )
    )
    refused = next(p for p in events(parent, "tool.result") if p["name"] == "spawn_runs")
    assert refused["is_error"] and "add up to 1200000" in refused["output"], refused
    kids = children_of(parent)
    remaining = 1_000_000 - parent.total_tokens
    assert [k.max_tokens for k in kids] == [
        100_000,
        (remaining - 100_000) // 2,
        (remaining - 100_000) // 2,
    ]
    spawned = events(parent, "fleet.spawned")[0]["children"]
    assert [c["budget_tokens"] for c in spawned] == [k.max_tokens for k in kids]
    committed_tokens, _ = fleet_spawn.committed(Run.objects.get(pk=parent.pk))
    assert committed_tokens == parent.total_tokens + sum(k.max_tokens for k in kids)


def test_the_parents_budget_counts_its_childrens_spend():
    parent = drive_until_idle(
        make_run(
            turns=[spawn(child("a", finish_turn())), finish_turn()],
            budgets=services.Budgets(max_cost_usd="1.00"),
        )
    )
    (kid,) = children_of(parent)
    assert kid.max_cost_usd == Decimal("1.00") - parent.cost_usd
    drive_until_idle(kid)
    # The child's spend (a scripted run costs nothing: put some on it) is the parent's too.
    Run.objects.filter(pk=kid.pk).update(cost_usd=Decimal("1.50"))
    parent = drive_until_idle(parent)
    assert parent.status == "paused", parent.status_reason
    assert "max cost ($1.000000) reached" in parent.status_reason


# --- cascades ----------------------------------------------------------------------------------
def test_pause_resume_and_cancel_cascade_to_live_children_naming_the_cause():
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(child("a", write("a", "a"), finish_turn()), child("b", finish_turn())),
                finish_turn(),
            ]
        )
    )
    a, b = children_of(parent)
    services.pause_run(parent.pk, actor="user:pat")
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.status == b.status == "paused"
    assert events(a, "fleet.cascade") == [
        {"action": "pause", "cause": f"run {parent.pk} was paused by user:pat"}
    ]
    # A child paused for its own reasons is not resumed with the parent.
    services.resume_run(parent.pk, actor="user:pat")
    a.refresh_from_db()
    assert a.status == "queued"
    assert [e["action"] for e in events(a, "fleet.cascade")] == ["pause", "resume"]
    # Resumed while its children still run, the parent goes back to waiting, holding nothing.
    parent = drive_until_idle(parent)
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN and not parent.lease_owner

    services.cancel_run(parent.pk, actor="user:pat")
    for kid in (a, b):
        kid.refresh_from_db()
        assert kid.status == "cancelled"
        assert events(kid, "fleet.cascade")[-1]["action"] == "cancel"
    ended = events(parent, "fleet.child_ended")
    assert {e["run_id"] for e in ended} == {a.pk, b.pk}


def test_a_child_paused_while_its_parent_was_paused_is_woken_once_the_wait_is_over():
    parent = drive_until_idle(make_run(turns=[spawn(child("a", finish_turn())), finish_turn()]))
    (kid,) = children_of(parent)
    services.pause_run(parent.pk, actor="user:pat")
    services.resume_run(kid.pk, actor="user:pat")  # a person lets the child go on
    assert drive_until_idle(kid).status == "succeeded"
    parent.refresh_from_db()
    assert parent.status == "paused"  # its wait is over, but a person paused it
    services.resume_run(parent.pk, actor="user:pat")
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert len(events(parent, "fleet.woke")) == 1


# --- limits ------------------------------------------------------------------------------------
def test_depth_and_children_limits_are_errors_not_silent_caps(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "FLEET_MAX_DEPTH": 1, "FLEET_MAX_CHILDREN": 2}
    grandchild = child("too deep", finish_turn())
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(*[child(f"c{i}", finish_turn()) for i in range(3)]),
                spawn(child("middle", spawn(grandchild), finish_turn())),
                finish_turn(),
            ]
        )
    )
    too_many = next(p for p in events(parent, "tool.result") if p["name"] == "spawn_runs")
    assert too_many["is_error"] and "3 children asked for" in too_many["output"]
    assert "SHIFTLOG_FLEET_MAX_CHILDREN" in too_many["output"]
    (middle,) = children_of(parent)
    middle = drive_until_idle(middle)
    assert middle.status == "succeeded"
    deep = last_result(middle, "spawn_runs")
    assert deep["is_error"] and "SHIFTLOG_FLEET_MAX_DEPTH" in deep["output"]
    assert not children_of(middle)


# --- what the CLI and the API show -------------------------------------------------------------
def test_show_run_and_the_api_show_parent_children_and_rollup(capsys, owner):
    parent = drive_until_idle(make_run(turns=[spawn(child("a", finish_turn())), finish_turn()]))
    (kid,) = children_of(parent)
    drive_until_idle(kid)
    call_command("show_run", str(parent.pk), "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["parent"] is None and data["children"] == [kid.pk]
    assert data["rollup"] == fleets.rollup(parent).as_json()
    assert data["rollup"]["tokens"] == parent.total_tokens + kid.total_tokens
    call_command("show_run", str(kid.pk), "--json")
    assert json.loads(capsys.readouterr().out)["parent"] == parent.pk
    call_command("show_run", str(parent.pk))
    text = capsys.readouterr().out
    assert f"└ run {kid.pk}: succeeded" in text and "with its children" in text

    from tests.test_api_external import bearer

    api = bearer(owner, "read")
    Run.objects.filter(pk__in=[parent.pk, kid.pk]).update(created_by=owner)
    one = api.get(f"/api/v1/runs/{parent.pk}").json()
    assert one["children"] == [kid.pk] and one["rollup"] == data["rollup"]
    listed = {r["id"]: r for r in api.get("/api/v1/runs").json()["items"]}
    assert listed[kid.pk]["parent"] == parent.pk and listed[parent.pk]["children"] == [kid.pk]


def test_manage_py_demo_makes_the_demo_and_demo_fleet_the_planner_printing_its_id_last(capsys):
    call_command("demo")
    single = Run.objects.get(pk=int(capsys.readouterr().out.strip().splitlines()[-1]))
    assert services.is_demo_goal(single.goal) and single.parent is None
    call_command("demo", "fleet")
    planner = Run.objects.get(pk=int(capsys.readouterr().out.strip().splitlines()[-1]))
    assert planner.script_name == "fleet demo (built in)" and "child runs" in planner.goal
    with pytest.raises(Exception, match="invalid choice"):
        call_command("demo", "navy")


def test_create_run_takes_the_conflict_setting_and_refuses_a_bad_one():
    assert make_run(turns=[finish_turn()], fleet_conflicts="person").fleet_conflicts == "person"
    with pytest.raises(services.RunError, match="fleet-conflicts must be agent or person"):
        make_run(turns=[finish_turn()], fleet_conflicts="robot")


def test_fleet_events_read_as_one_line_each():
    from agents.eventlog import describe

    assert describe("fleet.spawned", {"children": [{"run_id": 4}, {"run_id": 5}]}) == (
        "spawned child runs 4, 5 (wait all)"
    )
    assert describe("fleet.child_ended", {"run_id": 4, "status": "failed"}) == "child run 4 failed"
    assert describe(
        "fleet.merge", {"run_id": 4, "result": "conflict", "files": ["a"], "conflicts": ["a"]}
    ) == ("merge of child run 4: conflict in a")
    assert describe("fleet.merge", {"run_id": 4, "result": "applied", "files": ["a", "b"]}) == (
        "merge of child run 4: applied, 2 file(s)"
    )
    assert describe("fleet.cascade", {"action": "pause", "cause": "run 3 was paused by x"}) == (
        "pause with its parent: run 3 was paused by x"
    )


def test_a_parent_that_ends_cancels_its_children_still_running(django_capture_on_commit_callbacks):
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(child("quick", finish_turn()), child("slow", finish_turn()), wait="any"),
                finish_turn(),
            ]
        )
    )
    quick, slow = children_of(parent)
    drive_until_idle(quick)
    with django_capture_on_commit_callbacks(execute=True):
        parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    slow.refresh_from_db()
    assert slow.status == "cancelled"
    assert events(slow, "fleet.cascade") == [
        {"action": "cancel", "cause": f"run {parent.pk} ended (succeeded)"}
    ]


# --- a rewound parent ----------------------------------------------------------------------------
def test_a_parent_rewound_to_before_its_spawn_cancels_those_children_and_spawns_anew(
    django_capture_on_commit_callbacks, owner
):
    parent = drive_until_idle(
        make_run(
            created_by=owner,
            turns=[
                write("plan.txt", "plan"),
                spawn(child("a", write("a.txt", "a"), finish_turn())),
                MERGE,
                finish_turn(),
            ],
        )
    )
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN
    (old,) = children_of(parent)
    before = Checkpoint.objects.get(run=parent, kind="run_start")
    plan = rewinds.rewind(parent.pk, before.pk, actor="user:pat", dry_run=True)
    assert plan.children == [old.pk]
    assert f"run {old.pk}" in "\n".join(describe_discarded(plan))
    page = client_for(owner).get(f"/runs/{parent.pk}/checkpoints/{before.number}/rewind")
    assert "Child runs spawned since, still running, are cancelled" in page.content.decode()
    assert f'href="/runs/{old.pk}/"' in page.content.decode()

    with django_capture_on_commit_callbacks(execute=True):
        rewinds.rewind(parent.pk, before.pk, actor="user:pat")
    old.refresh_from_db()
    assert old.status == "cancelled"
    assert events(old, "fleet.cascade") == [
        {
            "action": "cancel",
            "cause": f"run {parent.pk} was rewound to checkpoint {before.number}, "
            "before this child was spawned",
        }
    ]
    (rewound,) = events(parent, "run.rewound")
    assert rewound["children"] == [old.pk]
    # The parent plays its spawn again: a new child, which it waits for and merges.
    parent = drive_until_idle(parent)
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN
    _, new = children_of(parent)
    assert drive_until_idle(new).status == "succeeded"
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert [m["run_id"] for m in events(parent, "fleet.merge")] == [new.pk]
    assert (parent.workspace_path / "a.txt").read_text() == "a"


def test_a_parent_rewound_to_before_a_merge_merges_that_child_again(decider):
    tidy = {"text": "tidy", "tool_calls": [call("bash", command="rm -rf build")]}
    parent = drive_until_idle(
        make_run(
            turns=[
                spawn(child("a", write("a.txt", "a"), finish_turn())),
                MERGE,
                tidy,
                MERGE,  # a second look: nothing left to merge, unless a rewind took one out
                finish_turn(),
            ]
        )
    )
    (kid,) = children_of(parent)
    assert drive_until_idle(kid).status == "succeeded"
    parent = drive_until_idle(parent)
    assert parent.status == RunStatus.AWAITING_APPROVAL, parent.status_reason
    assert FleetChild.objects.get(child=kid).merge_state == "applied"
    before = Checkpoint.objects.get(run=parent, label__startswith="before merge_children")
    rewinds.rewind(parent.pk, before.pk, actor="user:pat")
    assert not (parent.workspace_path / "a.txt").exists()
    # The merge the rewind took out is to be made again: the next merge_children makes it.
    assert FleetChild.objects.get(child=kid).merge_state == ""
    parent = drive_until_idle(parent)
    assert parent.status == RunStatus.AWAITING_APPROVAL, parent.status_reason
    approve_pending(parent, decider)
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert (parent.workspace_path / "a.txt").read_text() == "a"
    assert FleetChild.objects.get(child=kid).merge_state == "applied"
    assert [m["result"] for m in events(parent, "fleet.merge")] == ["applied", "applied"]


def test_a_child_that_ended_on_a_branch_a_rewind_abandoned_is_never_merged():
    parent = drive_until_idle(
        make_run(
            turns=[spawn(child("a", write("a.txt", "a"), finish_turn())), MERGE, finish_turn()]
        )
    )
    (old,) = children_of(parent)
    assert drive_until_idle(old).status == "succeeded"  # the parent is queued, to merge it
    start = Checkpoint.objects.get(run=parent, kind="run_start")
    assert rewinds.rewind(parent.pk, start.pk, actor="user:pat").children == []
    parent = drive_until_idle(parent)  # the spawn again: a new child
    _, new = children_of(parent)
    assert drive_until_idle(new).status == "succeeded"
    parent = drive_until_idle(parent)
    assert parent.status == "succeeded", parent.status_reason
    assert [m["run_id"] for m in events(parent, "fleet.merge")] == [new.pk]
    assert FleetChild.objects.get(child=old).merge_state == ""
