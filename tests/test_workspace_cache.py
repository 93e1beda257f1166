"""Workspaces as each host's cache (SHIFTLOG["WORKSPACE_CACHE"]): every tool call that changed
the workspace is in the store before its result commits, a worker restores the run's last
committed workspace where it claims the run, and pages and commands read the store, not a
folder. Here on the folder store, with "another host" played by other workspace and data folders
(the S3 store and real processes in separate mount namespaces: tests/test_hosts.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

from agents import checkpoints, rewinds, workspaces
from agents.models import Approval, Event, Run, RunStatus
from agents.snapshots import Snapshots
from tests.helpers import (
    approve_pending,
    call,
    client_for,
    drive_until_idle,
    drive_until_the_final_checkpoint_kills_it,
    finish_turn,
    make_run,
)

pytestmark = pytest.mark.django_db

CHECK = "test -f a.txt && test -f b.txt && test -f sub/c.txt && test -f d.txt && ! test -e build"


@pytest.fixture(params=["folder", "s3"])
def cache(request, settings, tmp_path):
    """Workspace cache on, and this test's "host": its own workspace and data folders; the blob
    store a shared folder, or a bucket on moto's S3 server."""
    move_to_host(settings, tmp_path / "host-a")
    store = request.getfixturevalue("s3_url") if request.param == "s3" else ""
    settings.SHIFTLOG = {
        **settings.SHIFTLOG,
        "WORKSPACE_CACHE": True,
        "HOST": "host-a",
        "BLOB_STORE": store,
    }
    return settings


def move_to_host(settings, folder: Path, name: str | None = None) -> None:
    (folder / "workspaces").mkdir(parents=True)
    settings.DATA_DIR = folder
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WORKSPACE_ROOT": folder / "workspaces"}
    if name:
        settings.SHIFTLOG = {**settings.SHIFTLOG, "HOST": name}


def writes_then_risky_step():
    return [
        {"text": "a", "tool_calls": [call("write_file", path="a.txt", content="A\n")]},
        {"text": "b", "tool_calls": [call("write_file", path="b.txt", content="B\n")]},
        {
            "text": "c",
            "tool_calls": [call("bash", command="mkdir -p sub build && echo C > sub/c.txt")],
        },
        {
            "text": "read",
            "tool_calls": [call("read_file", path="a.txt"), call("bash", command="true")],
        },
        {"text": "clean", "tool_calls": [call("bash", command="rm -rf build")]},
        {"text": "d", "tool_calls": [call("write_file", path="d.txt", content="D\n")]},
        finish_turn(),
    ]


def results(run):
    return [e.payload for e in Event.objects.filter(run=run, kind="tool.result").order_by("seq")]


def test_each_changing_call_is_stored_before_its_result_and_another_host_carries_on(
    cache, tmp_path, decider
):
    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    done = results(run)
    # write a, write b, bash c: each changed the workspace and names the tree it left; the
    # read and `true` changed nothing and cost no snapshot.
    assert [bool(r.get("workspace")) for r in done] == [True, True, True, False, False]
    trees = [r["workspace"]["tree"] for r in done[:3]]
    assert len(set(trees)) == 3
    assert run.workspace_tree == trees[-1]
    snaps = workspaces.store()
    assert sorted(p for p, e in snaps.files(trees[-1]).items() if e.type == "f") == [
        "a.txt",
        "b.txt",
        "sub/c.txt",
    ]
    assert snaps.read(trees[0], "a.txt") == b"A\n"

    # Host A is gone with its folders; host B has never seen the run.
    shutil.rmtree(tmp_path / "host-a")
    move_to_host(cache, tmp_path / "host-b", "host-b")
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    restored = Event.objects.get(run=run, kind="workspace.restored").payload
    assert restored["host"] == "host-b"
    assert restored["tree"] == trees[-1] and restored["had"] == "nothing"
    assert restored["files"] == 3 and restored["bytes"] == 6 and restored["written"] == 3
    assert restored["milliseconds"] >= 0
    assert (run.workspace_path / "sub" / "c.txt").read_text() == "C\n"
    assert str(run.workspace_path).startswith(str(tmp_path / "host-b"))
    # A second slice on the same host restores nothing.
    assert Event.objects.filter(run=run, kind="workspace.restored").count() == 1


def test_a_host_holding_an_older_state_is_brought_up_to_date(cache, tmp_path, decider):
    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    old = workspaces.held_tree(run)
    assert old == run.workspace_tree
    # Another host ran the risky step meanwhile (its state is committed; this host's is not).
    host_a = Path(cache.DATA_DIR)
    move_to_host(cache, tmp_path / "host-b", "host-b")
    approve_pending(run, decider)
    from agents.runtime.loop import drive

    drive(run.pk)  # B restores, runs rm, writes d, finishes
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    # Back on host A, which still holds the older copy (with build/ and no d.txt).
    cache.DATA_DIR = host_a
    cache.SHIFTLOG = {**cache.SHIFTLOG, "WORKSPACE_ROOT": host_a / "workspaces", "HOST": "host-a"}
    assert workspaces.held_tree(run) == old != run.workspace_tree
    done = workspaces.ensure_local(run)
    assert done["had"] == "an older state" and done["host"] == "host-a"
    assert (run.workspace_path / "d.txt").exists() and not (run.workspace_path / "build").exists()
    assert workspaces.held_tree(run) == run.workspace_tree


def test_pages_and_commands_read_the_store_where_no_workspace_is(cache, tmp_path, owner, capsys):
    run = make_run(
        turns=[
            {"text": "a", "tool_calls": [call("write_file", path="a.txt", content="one\n")]},
            {"text": "b", "tool_calls": [call("write_file", path="a.txt", content="two\n")]},
            {"text": "wait", "tool_calls": [call("bash", command="rm -rf a.txt")]},
        ],
        created_by=owner,
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL
    first = run.checkpoints.order_by("number").first()
    # This "host" (web and CLI) has no workspace folder at all.
    shutil.rmtree(tmp_path / "host-a")
    move_to_host(cache, tmp_path / "web", "web")
    assert not run.workspace_path.exists()
    changes = workspaces.diff_live(run, first.tree)
    assert [(c.path, c.status) for c in changes] == [("a.txt", "added")]
    assert "+two" in changes[0].diff
    client = client_for(owner)
    page = client.get(f"/runs/{run.pk}/diff/?a={first.number}&b=live")
    assert page.status_code == 200 and b"two" in page.content
    patch = client.get(f"/runs/{run.pk}/diff.patch?a={first.number}&b=live")
    assert patch.status_code == 200 and b"+two" in b"".join(patch.streaming_content)
    # The approval card shows the file as it is now (from the store).
    approval = Approval.objects.get(run=run)
    assert client.get("/approvals/").status_code == 200
    assert approval.tool_name == "bash"
    assert workspaces.read_live(run, "a.txt", 100) == b"two\n"
    assert workspaces.read_live(run, "../etc/passwd", 100) is None
    # A person's checkpoint from here is the committed state, not an empty folder.
    made = checkpoints.create(run.pk, kind="manual", actor="user:olivia")
    assert made.tree == run.workspace_tree and made.files == 1
    call_command("diff_checkpoints", str(run.pk), str(first.number), "live")
    assert "+two" in capsys.readouterr().out
    assert not run.workspace_path.exists()


def test_a_rewind_needs_no_folder_and_the_next_worker_restores_the_checkpoint(
    cache, tmp_path, decider
):
    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    target = run.checkpoints.order_by("number").first()  # the run's start: empty
    move_to_host(cache, tmp_path / "web", "web")
    rewinds.rewind(run.pk, target.pk, actor="user:dana")
    run.refresh_from_db()
    assert run.workspace_tree == target.tree
    assert not run.workspace_path.exists()  # the rewind wrote no folder here
    move_to_host(cache, tmp_path / "host-b", "host-b")
    from agents.runtime.loop import drive

    drive(run.pk)
    restored = Event.objects.filter(run=run, kind="workspace.restored").last().payload
    assert restored["tree"] == target.tree and restored["files"] == 0
    assert restored["checkpoint"] == target.number


def test_a_fork_and_a_copied_folder_start_in_the_store(cache, tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "m.py").write_text("x = 1\n")
    run = make_run(turns=[finish_turn()], workspace_from=source)
    assert run.workspace_tree
    assert workspaces.store().read(run.workspace_tree, "pkg/m.py") == b"x = 1\n"
    cp = checkpoints.create(run.pk, kind="manual", actor="user:olivia")
    fork = checkpoints.fork(run.pk, cp.pk, actor="user:olivia")
    assert fork.workspace_tree == cp.tree


def test_the_cache_is_bounded_least_recently_used_first_never_a_leased_run(cache, tmp_path):
    cache.SHIFTLOG = {**cache.SHIFTLOG, "WORKSPACE_CACHE_MB": 1}
    runs = []
    for i in range(3):
        run = make_run(turns=[finish_turn()])
        big = run.workspace_path / "big.bin"
        big.write_bytes(bytes([i]) * 600_000)
        state = workspaces.snapshot(run)  # as a worker here commits a call's effects
        Run.objects.filter(pk=run.pk).update(workspace_tree=state.tree)
        workspaces.hold(run, state.tree, state.bytes_total)
        runs.append(Run.objects.get(pk=run.pk))
    # The second is leased by this host: never evicted, though older than the third.
    Run.objects.filter(pk=runs[1].pk).update(lease_owner="worker:host-a:1:1")
    removed = workspaces.evict(keep=runs[2].pk)
    assert removed == [runs[0].pk]
    assert not runs[0].workspace_path.exists()
    assert runs[1].workspace_path.exists() and runs[2].workspace_path.exists()
    # Its next worker restores it from the store.
    assert workspaces.ensure_local(runs[0])["files"] == 1
    assert (runs[0].workspace_path / "big.bin").stat().st_size == 600_000


def test_off_by_default_with_the_folder_store_nothing_changes(db):
    run = drive_until_idle(
        make_run(
            turns=[
                {"text": "a", "tool_calls": [call("write_file", path="a.txt", content="A")]},
                finish_turn(),
            ]
        )
    )
    assert run.status == RunStatus.SUCCEEDED
    assert not any("workspace" in r for r in results(run))
    assert not Event.objects.filter(run=run, kind="workspace.restored").exists()
    assert isinstance(workspaces.store(), Snapshots)
    assert workspaces.store().blobs.root


@pytest.mark.parametrize("cache", ["s3"], indirect=True)
def test_a_store_that_cannot_be_reached_pauses_the_run_and_the_reaper_resumes_it(
    cache, monkeypatch, decider
):
    from agents import reaper
    from tests.s3 import free_port

    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    assert run.status == RunStatus.AWAITING_APPROVAL
    stored = run.workspace_tree
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody there
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED
    assert run.status_reason.startswith("blob store unreachable: http://127.0.0.1:")
    # The call ran, but no event claims its effect: its result was never committed.
    rm = Event.objects.get(run=run, kind="tool.call", payload__input__command="rm -rf build")
    assert not Event.objects.filter(run=run, kind="tool.result", seq__gt=rm.seq).exists()
    assert run.workspace_tree == stored
    assert reaper.resume_when_store_is_back() == []  # still down: it stays paused
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    assert reaper.resume_when_store_is_back() == [run.pk]
    run = drive_until_idle(Run.objects.get(pk=run.pk))
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    store = workspaces.store()
    assert sorted(p for p, e in store.files(run.workspace_tree).items() if e.type == "f") == [
        "a.txt",
        "b.txt",
        "d.txt",
        "sub/c.txt",
    ]


def test_a_host_that_lost_its_copy_restores_it_before_anything_recreates_the_folder(cache, decider):
    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    shutil.rmtree(run.workspace_path)  # an operator cleaned up, a disk was replaced...
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    restored = Event.objects.get(run=run, kind="workspace.restored").payload
    assert restored["host"] == "host-a" and restored["had"] == "nothing"
    assert restored["files"] == 3


def test_a_persons_checkpoint_never_sets_the_committed_workspace_back(cache, monkeypatch):
    """A person checkpoints a run a worker is driving: if the worker commits a call between the
    checkpoint's reading of the committed tree and its recording, the checkpoint describes the
    newer tree, never the one it read first (which would set the run's workspace back, and the
    next worker would restore it without the committed write: found by bench/chaos.py)."""
    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    trees = [r["workspace"]["tree"] for r in results(run) if r.get("workspace")]
    older, newer = trees[-2], trees[-1]
    Run.objects.filter(pk=run.pk).update(workspace_tree=older)
    described = workspaces.stored_state

    def a_worker_commits_meanwhile(tree):
        state = described(tree)
        Run.objects.filter(pk=run.pk).update(workspace_tree=newer)
        return state

    monkeypatch.setattr(workspaces, "stored_state", a_worker_commits_meanwhile)
    checkpoint = checkpoints.create(run.pk, kind="manual", actor="user:eve")
    assert checkpoint.tree == newer
    assert Run.objects.get(pk=run.pk).workspace_tree == newer


def test_a_success_another_host_completes_checkpoints_the_committed_workspace(
    cache, tmp_path, decider, monkeypatch
):
    """Found by bench/chaos.py: the checks passed and the worker died before the final
    checkpoint; a worker on another host completed the success, but checkpointed its own stale
    copy, so the run's last checkpoint lacked the last session's committed write."""
    from agents.models import CheckpointKind
    from agents.runtime.loop import drive

    run = drive_until_idle(make_run(turns=writes_then_risky_step(), checks=[CHECK]))
    approve_pending(run, decider)
    # On host A: d.txt written, the checks pass, then it dies.
    drive_until_the_final_checkpoint_kills_it(run.pk, monkeypatch)
    run.refresh_from_db()
    assert run.status == RunStatus.VERIFYING
    committed = run.workspace_tree

    # Host B holds an older copy of the run's workspace (from before host A's last session).
    move_to_host(cache, tmp_path / "host-b", "host-b")
    stale = run.workspace_path
    stale.mkdir(parents=True)
    (stale / "a.txt").write_text("A\n")
    assert drive(run.pk).status == RunStatus.SUCCEEDED
    final = run.checkpoints.get(kind=CheckpointKind.SESSION_END)
    assert final.label == "end of session 1 (finished)"
    assert final.tree == committed
    assert sorted(p for p, e in workspaces.store().files(final.tree).items() if e.type == "f") == [
        "a.txt",
        "b.txt",
        "d.txt",
        "sub/c.txt",
    ]
    restored = Event.objects.filter(run=run, kind="workspace.restored").last().payload
    assert restored["host"] == "host-b" and restored["tree"] == committed


def test_a_call_whose_result_never_committed_leaves_nothing_a_rewind_keeps(cache, monkeypatch):
    """Found by bench/chaos.py (a log line no committed call made): a worker died after its
    `bash` appended to a file and before the result committed. A person rewound the run to the
    checkpoint of the very tree this host last held, so the next worker here trusted its copy,
    and the dead call's line stayed in the workspace of a branch that never made it."""
    from agents.runtime.loop import drive
    from agents.runtime.slice import Slice
    from tests.helpers import drive_in_a_worker_that_dies

    one_line = "test $(wc -l < log.txt) -eq 1"
    turns = [
        {"text": "log", "tool_calls": [call("bash", command="echo turn >> log.txt")]},
        finish_turn(),
    ]
    run = make_run(turns=turns, checks=[one_line])
    drive_in_a_worker_that_dies(
        run.pk, monkeypatch, Slice, "record_result", lambda self, block, *a, **k: True
    )
    run.refresh_from_db()
    assert (run.workspace_path / "log.txt").read_text() == "turn\n"  # done, never recorded
    start = run.checkpoints.get(number=1)
    assert run.workspace_tree == start.tree  # nothing committed since the run's start
    Run.objects.filter(pk=run.pk).update(lease_owner="", lease_expires_at=None)  # it expired

    rewinds.rewind(run.pk, start.pk, actor="user:dana")
    assert drive(run.pk).status == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert (run.workspace_path / "log.txt").read_text() == "turn\n"  # once: the new branch's
    assert workspaces.store().read(run.workspace_tree, "log.txt") == b"turn\n"
    restored = Event.objects.filter(run=run, kind="workspace.restored").get().payload
    assert restored["had"] == "a call's unrecorded changes, and the run was rewound since"
    assert restored["tree"] == start.tree


def test_a_merge_its_worker_died_in_leaves_nothing_a_rewind_to_before_it_keeps(cache, monkeypatch):
    """The same as a call's, for a fleet parent's merge: it writes the children's files after
    its "before merge" checkpoint (which holds that tree here). A worker that died mid-merge and
    a rewind to that checkpoint left the next worker here trusting a half-merged copy."""
    from agents import faults
    from agents.runtime.loop import drive
    from tests.helpers import drive_in_a_worker_that_dies
    from tests.test_fleet import MERGE, child, children_of, spawn, write

    done = [finish_turn()]

    run = drive_until_idle(
        make_run(
            turns=[spawn(child("piece", write("new.txt", "N\n"), finish_turn())), MERGE, *done]
        )
    )
    (kid,) = children_of(run)
    assert drive_until_idle(kid).status == RunStatus.SUCCEEDED
    drive_in_a_worker_that_dies(
        run.pk, monkeypatch, faults, "point", lambda name: name == "fleet.merge"
    )
    assert (run.workspace_path / "new.txt").exists()  # applied, its result never recorded
    before = run.checkpoints.get(label__startswith="before merge_children")
    run.refresh_from_db()
    assert run.workspace_tree == before.tree
    Run.objects.filter(pk=run.pk).update(lease_owner="", lease_expires_at=None)  # it expired

    rewinds.rewind(run.pk, before.pk, actor="user:dana")
    run.refresh_from_db()
    restored = workspaces.ensure_local(run)
    assert restored is not None and restored["tree"] == before.tree
    assert restored["had"] == "a call's unrecorded changes, and the run was rewound since"
    assert not (run.workspace_path / "new.txt").exists()
    assert drive(run.pk).status == RunStatus.SUCCEEDED
    assert not (run.workspace_path / "new.txt").exists()  # this branch never merged
