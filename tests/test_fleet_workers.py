"""Fleets on real worker processes: the demo end to end with two consumers, and kill -9 of a
worker while it spawns, while a child runs and mid-merge; afterwards the fleet is consistent: no
duplicate child, no lost child, no half-applied merge."""

from __future__ import annotations

import json

import pytest

from agents.fleets.demo import create_fleet_demo_run
from agents.models import Approval, Event, FleetChild, Run, RunStatus
from tests.helpers import call, finish_turn, make_run, script
from tests.procs import dump_events, wait_for
from tests.test_workers import SHORT_LEASES, assert_gap_free, lines, status_of, wait_until_over

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.django_db(transaction=True)]


def write(path: str, content: str) -> dict:
    return {
        "text": f"writing {path}",
        "tool_calls": [call("write_file", path=path, content=content)],
    }


def small_fleet(*, slow_child: bool = False) -> Run:
    """A parent that spawns two children (each writes its own file), merges, and finishes with
    checks that need both."""
    first = [write("a.txt", "from a\n")]
    if slow_child:
        first.append(
            {
                "text": "slow",
                "tool_calls": [call("bash", command="echo started >> marker.txt; sleep 3")],
            }
        )
    return make_run(
        turns=[
            write("base.txt", "base\n"),
            {
                "text": "spawning",
                "tool_calls": [
                    call(
                        "spawn_runs",
                        children=[
                            {
                                "goal": "a",
                                "checks": ["test -f a.txt"],
                                "script": script(*first, finish_turn()),
                            },
                            {
                                "goal": "b",
                                "checks": ["test -f b.txt"],
                                "script": script(write("b.txt", "from b\n"), finish_turn()),
                            },
                        ],
                    )
                ],
            },
            {"text": "merging", "tool_calls": [call("merge_children")]},
            finish_turn(),
        ],
        checks=["test -f a.txt && test -f b.txt && test -f base.txt"],
    )


def pending_tasks(procs) -> list[dict]:
    code = (
        "import json\nfrom huey.contrib.djhuey import HUEY\n"
        "print(json.dumps([t.kwargs for t in HUEY.pending()]))"
    )
    return json.loads(procs.manage("shell", "-c", code).strip().splitlines()[-1])


def assert_consistent(parent: Run) -> None:
    """Exactly the children spawned, each once, each ended once; every merge once."""
    kids = list(Run.objects.filter(parent=parent).order_by("pk"))
    assert len(kids) == 2, dump_events(parent.pk)
    assert FleetChild.objects.filter(parent=parent).count() == 2
    (spawned,) = Event.objects.filter(run=parent, kind="fleet.spawned")
    assert [c["run_id"] for c in spawned.payload["children"]] == [k.pk for k in kids]
    ended = [
        e.payload["run_id"] for e in Event.objects.filter(run=parent, kind="fleet.child_ended")
    ]
    assert sorted(ended) == [k.pk for k in kids], dump_events(parent.pk)
    merges = [
        (e.payload["run_id"], e.payload["result"])
        for e in Event.objects.filter(run=parent, kind="fleet.merge").order_by("seq")
    ]
    assert merges == [(k.pk, "applied") for k in kids], dump_events(parent.pk)
    for name, text in (("a.txt", "from a\n"), ("b.txt", "from b\n"), ("base.txt", "base\n")):
        assert (parent.workspace_path / name).read_text() == text
    assert not list(parent.workspace_path.glob(".shiftlog-merge-*"))
    for run in [parent, *kids]:
        assert_gap_free(run)


def test_two_consumers_take_the_fleet_demo_to_success_with_a_person_approving(procs, decider):
    parent = create_fleet_demo_run(turn_delay_seconds=0)
    procs.consumer(name="one")
    procs.consumer(name="two")
    procs.enqueue(parent.pk)
    wait_for(
        lambda: Approval.objects.filter(run__parent=parent, status="pending").exists(),
        timeout=90,
        what="the numstats child's cleanup to wait for a person",
        details=lambda: f"{dump_events(parent.pk)}\n{procs.logs()}",
    )
    parent.refresh_from_db()
    # The parent waits at zero compute: no lease, no slice of it queued, nothing re-queues it.
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN
    assert not parent.lease_owner and parent.lease_expires_at is None
    assert all(t.get("run_id") != parent.pk for t in pending_tasks(procs))
    assert str(parent.pk) not in procs.manage("reap_runs").split(":", 1)[-1].split()

    approval = Approval.objects.get(run__parent=parent, status="pending")
    assert "approved" in procs.manage("approve", str(approval.pk), "--user", decider.username)
    parent = wait_until_over(parent, procs, timeout=120)
    log = dump_events(parent.pk)
    assert parent.status == RunStatus.SUCCEEDED, f"{parent.status_reason}\n{log}"
    kids = list(Run.objects.filter(parent=parent))
    assert [k.status for k in kids] == ["succeeded", "succeeded"]
    assert {e.payload["result"] for e in Event.objects.filter(run=parent, kind="fleet.merge")} == {
        "applied"
    }


def test_a_worker_killed_while_spawning_leaves_no_child_and_the_retry_makes_each_once(procs):
    parent = small_fleet()
    doomed = procs.consumer(name="doomed", SHIFTLOG_FAULTS="fleet.spawn", **SHORT_LEASES)
    procs.enqueue(parent.pk)
    doomed.wait(60)  # it kills itself (SIGKILL) inside the spawn's transaction
    assert not Run.objects.filter(parent=parent).exists(), dump_events(parent.pk)
    assert Event.objects.filter(run=parent, kind="tool.call", payload__name="spawn_runs").exists()
    assert not Event.objects.filter(run=parent, kind="tool.result", payload__name="spawn_runs")
    assert status_of(parent) == RunStatus.RUNNING

    procs.consumer(name="rescuer", **SHORT_LEASES)
    procs.reap_until_requeued(parent.pk, timeout=20, **SHORT_LEASES)
    parent = wait_until_over(parent, procs, timeout=90)
    assert parent.status == RunStatus.SUCCEEDED, f"{parent.status_reason}\n{dump_events(parent.pk)}"
    assert_consistent(parent)
    # The spawn was done again, not closed as interrupted.
    results = Event.objects.filter(run=parent, kind="tool.result", payload__name="spawn_runs")
    assert [r.payload["is_error"] for r in results] == [False]


def test_a_worker_killed_while_a_child_runs_loses_no_child(procs):
    parent = small_fleet(slow_child=True)
    doomed = procs.consumer(name="doomed", workers=1, **SHORT_LEASES)
    procs.enqueue(parent.pk)
    wait_for(
        lambda: any(
            "started" in lines(k.workspace_path / "marker.txt")
            for k in Run.objects.filter(parent=parent)
        ),
        timeout=60,
        what="the slow child's command to start",
        details=lambda: f"{dump_events(parent.pk)}\n{procs.logs()}",
    )
    procs.kill_hard(doomed)
    slow = Run.objects.filter(parent=parent).order_by("pk").first()
    assert slow.status == RunStatus.RUNNING
    assert status_of(parent) == RunStatus.WAITING_FOR_CHILDREN

    procs.consumer(name="rescuer", **SHORT_LEASES)
    procs.reap_until_requeued(slow.pk, timeout=20, **SHORT_LEASES)
    parent = wait_until_over(parent, procs, timeout=90)
    assert parent.status == RunStatus.SUCCEEDED, f"{parent.status_reason}\n{dump_events(parent.pk)}"
    assert_consistent(parent)
    assert Event.objects.filter(run=slow, kind="error", payload__source="recovery").count() == 1


def test_a_worker_killed_mid_merge_leaves_no_half_applied_merge(procs):
    parent = small_fleet()
    doomed = procs.consumer(name="doomed", SHIFTLOG_FAULTS="fleet.merge", **SHORT_LEASES)
    procs.enqueue(parent.pk)
    doomed.wait(90)  # it kills itself right after the first child's files went in
    log = dump_events(parent.pk)
    assert not Event.objects.filter(run=parent, kind="fleet.merge").exists(), log
    # What the dead worker left: the first child's file in, the second's not (half a merge).
    assert (parent.workspace_path / "a.txt").exists() and not (
        parent.workspace_path / "b.txt"
    ).exists()

    procs.consumer(name="rescuer", **SHORT_LEASES)
    procs.reap_until_requeued(parent.pk, timeout=20, **SHORT_LEASES)
    parent = wait_until_over(parent, procs, timeout=90)
    assert parent.status == RunStatus.SUCCEEDED, f"{parent.status_reason}\n{dump_events(parent.pk)}"
    assert_consistent(parent)
    befores = Event.objects.filter(
        run=parent, kind="checkpoint.created", payload__label__startswith="before merge_children"
    )
    assert befores.count() == 1  # the retry went back to it rather than taking another
