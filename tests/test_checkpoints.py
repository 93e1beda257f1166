"""Checkpoints, rewind, fork and diffs, through the runtime and the CLI."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents import checkpoints, services
from agents.blobstore import BlobStore
from agents.models import Artifact, Checkpoint, Event, Run, RunStatus
from tests.conftest import approve_pending, call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def blob_count() -> int:
    return sum(1 for _ in BlobStore().iter_digests())


def workspace_tree(run: Run) -> str:
    return checkpoints.snapshots().snapshot(run.workspace_path).tree


def test_the_demo_checkpoints_at_start_session_ends_and_before_approval(decider):
    run = drive_until_idle(services.create_demo_run())
    kinds = list(run.checkpoints.order_by("seq").values_list("kind", flat=True))
    assert kinds == ["run_start", "session_end", "pre_approval"]
    created = Event.objects.filter(run=run, kind="checkpoint.created").order_by("seq")
    assert [e.seq for e in created] == list(
        run.checkpoints.order_by("seq").values_list("seq", flat=True)
    )
    session_end = run.checkpoints.get(kind="session_end")
    assert session_end.handoff["summary"].startswith("textstats.py and test_textstats.py exist")
    assert session_end.files == 2 and session_end.usage["turns"] == 5
    run.refresh_from_db()
    assert run.head_checkpoint.kind == "pre_approval"
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.checkpoints.order_by("-seq").first().kind == "session_end"  # the final one


def test_rewinding_the_demo_to_a_mid_run_checkpoint_and_it_continues_to_success(decider):
    run = drive_until_idle(services.create_demo_run())
    assert run.status == RunStatus.AWAITING_APPROVAL
    target = run.checkpoints.get(kind="session_end")
    before = run.last_seq
    discarded = checkpoints.rewind(run.pk, target.pk, actor="user:dana", note="go carefully")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    # The workspace is exactly the checkpoint's tree again.
    assert workspace_tree(run) == target.tree
    assert 'text.split(" ")' in (run.workspace_path / "textstats.py").read_text()
    # Nothing in the log was removed; the rewind says what it left behind.
    assert Event.objects.filter(run=run, seq__lte=before).count() == before
    rewound = Event.objects.get(run=run, kind="run.rewound")
    assert rewound.actor == "user:dana"
    assert rewound.payload["to_seq"] == target.seq and rewound.payload["from_seq"] >= before
    assert discarded.sessions == [2] and discarded.events > 0
    assert any(f["path"] == "textstats.py" for f in discarded.files)
    assert run.sessions.get(index=2).end_reason == "rewound"
    assert checkpoints.abandoned_ranges(run.pk) == [(target.seq, rewound.payload["from_seq"])]
    # The next session starts from the checkpoint's handoff and the note; the script, rewound
    # with it, plays session 2's steps again, risky one included.
    run = drive_until_idle(run)
    third = run.sessions.get(index=3)
    first = Event.objects.get(session=third, kind="session.started").payload["first_message"]
    assert target.handoff["summary"] in first and "go carefully" in first
    assert run.status == RunStatus.AWAITING_APPROVAL
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert "text.split()" in (run.workspace_path / "textstats.py").read_text()


def test_a_dry_run_shows_what_would_be_discarded_and_changes_nothing(db):
    turns = [
        {"tool_calls": [call("write_file", path="a.txt", content="one")]},
        {"tool_calls": [call("bash", command="echo two > b.txt")]},
        {"tool_calls": [call("bash", command="curl -s https://example.com -o c.txt || true")]},
        finish_turn(),
    ]
    run = drive_until_idle(
        make_run(turns=turns, tool_policy=[{"tool": "bash", "action": "allow"}], checks=["false"])
    )
    start = run.checkpoints.get(kind="run_start")
    seq = run.last_seq
    out = json.loads(cli("rewind_run", str(run.pk), "--to", str(start.pk), "--dry-run", "--json"))
    assert out["dry_run"] is True
    assert {f["path"] for f in out["files"]} == {"a.txt", "b.txt"}
    assert [c["command"] for c in out["irreversible"]] == [
        "curl -s https://example.com -o c.txt || true"
    ]
    assert "reaches the network" in out["irreversible"][0]["risks"]
    run.refresh_from_db()
    assert run.last_seq == seq and (run.workspace_path / "a.txt").exists()
    text = cli("rewind_run", str(run.pk), "--to", str(start.pk), "--dry-run")
    assert "would discard" in text and "cannot be undone" in text


def test_rewind_refuses_bad_targets_clearly(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    other = drive_until_idle(make_run(turns=[{"text": "x"}, {"text": "y"}], checks=["true"]))
    with pytest.raises(CommandError, match="fork it from the checkpoint instead") as info:
        cli("rewind_run", str(run.pk), "--to", str(run.checkpoints.first().pk))
    assert info.value.returncode == 2
    live = make_run(turns=[finish_turn()])
    with pytest.raises(CommandError, match=f"run {live.pk} has no checkpoint"):
        cli("rewind_run", str(live.pk), "--to", str(other.checkpoints.first().pk))


def test_fork_makes_an_independent_run_and_the_store_grows_only_by_new_blobs(decider):
    run = drive_until_idle(services.create_demo_run())
    target = run.checkpoints.get(kind="session_end")
    blobs = blob_count()
    fork_id = int(
        cli(
            "fork_run",
            str(run.pk),
            "--from",
            str(target.pk),
            "--note",
            "try it again",
            "--user",
            "dana",
        )
    )
    fork = Run.objects.get(pk=fork_id)
    assert fork.forked_from == target and fork.checks == run.checks and fork.goal == run.goal
    assert blob_count() == blobs  # the restored workspace added nothing to the store
    assert workspace_tree(fork) == target.tree
    assert Event.objects.get(run=run, kind="run.forked").payload["fork_run_id"] == fork.pk
    original_seq = Run.objects.get(pk=run.pk).last_seq
    fork = drive_until_idle(fork)
    assert fork.status == RunStatus.AWAITING_APPROVAL
    assert fork.checkpoints.order_by("seq").first().kind == "fork"
    approve_pending(fork, decider)
    approve_pending(run, decider)
    assert drive_until_idle(fork).status == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.pk).last_seq > original_seq  # approved: the original moves on
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED
    first = Event.objects.filter(run=fork, kind="session.started").first().payload["first_message"]
    assert "try it again" in first and target.handoff["summary"] in first
    with pytest.raises(CommandError, match="has no checkpoint 99999"):
        cli("fork_run", str(run.pk), "--from", "99999")


def test_diff_between_checkpoints_and_against_the_live_workspace(db):
    turns = [
        {
            "tool_calls": [
                call("write_file", path="a.txt", content="one\ntwo\n"),
                call("write_file", path="bin.dat", content="x"),
            ]
        },
        {
            "tool_calls": [
                call("edit_file", path="a.txt", old_string="two", new_string="TWO"),
                call("bash", command="rm bin.dat; echo new > c.txt"),
            ]
        },
        finish_turn(),
    ]
    run = drive_until_idle(make_run(turns=turns, checks=["true"]))
    start, end = run.checkpoints.order_by("seq")[0], run.checkpoints.order_by("-seq")[0]
    out = cli("diff_checkpoints", str(start.pk), str(end.pk))
    assert "added        a.txt" in out and "added        c.txt" in out
    assert "+one" in out
    rows = json.loads(cli("diff_checkpoints", str(start.pk), "live", "--json"))
    assert {r["path"]: r["status"] for r in rows} == {"a.txt": "added", "c.txt": "added"}
    (run.workspace_path / "a.txt").write_text("changed live\n")
    live = cli("diff_checkpoints", str(end.pk), "live")
    assert "changed      a.txt" in live and "-TWO" in live and "+changed live" in live
    assert cli("diff_checkpoints", str(end.pk), str(end.pk)).strip() == "no changes"
    with pytest.raises(CommandError, match="no checkpoint 'nope'"):
        cli("diff_checkpoints", "nope", "live")


def test_periodic_checkpoints_after_n_file_changing_calls(db, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 2}
    writes = [
        {"tool_calls": [call("write_file", path=f"f{i}.txt", content=str(i))]} for i in range(5)
    ]
    run = drive_until_idle(
        make_run(turns=[*writes, {"tool_calls": [call("list_files")]}, finish_turn()])
    )
    periodic = run.checkpoints.filter(kind="periodic").order_by("seq")
    assert periodic.count() == 2
    assert periodic[0].files == 2 and periodic[1].files == 4


def test_checkpoint_run_on_demand_and_artifacts_cli(tmp_path, decider):
    run = drive_until_idle(services.create_demo_run())
    out = cli("checkpoint_run", str(run.pk), "--label", "before lunch", "--user", "dana")
    cp = run.checkpoints.get(kind="manual")
    assert f"checkpoint {cp.pk}" in out and cp.label == "before lunch"
    assert (
        Event.objects.get(run=run, kind="checkpoint.created", payload__kind="manual").actor
        == "user:dana"
    )
    approve_pending(run, decider)
    run = drive_until_idle(run)
    listing = json.loads(cli("artifacts", str(run.pk), "--json"))
    kinds = {a["kind"] for a in listing}
    assert kinds == {"handoff", "report", "file"}
    module = next(a for a in listing if a["name"] == "textstats.py")
    cli("get_artifact", str(module["id"]), "--out", str(tmp_path))
    assert (tmp_path / "textstats.py").read_text() == (
        run.workspace_path / "textstats.py"
    ).read_text()
    report = Artifact.objects.filter(run=run, kind="report").order_by("seq").first()
    assert "FAILED" in BlobStore().get(report.blob_hash).decode()
    with pytest.raises(CommandError, match="no artifact with id 4242"):
        cli("get_artifact", "4242")


def test_verify_store_finds_a_corrupt_blob_and_prune_keeps_what_is_referenced(db):
    run = drive_until_idle(
        make_run(
            turns=[
                {"tool_calls": [call("write_file", path="a.txt", content="keep me")]},
                finish_turn(),
            ]
        )
    )
    assert "store OK" in cli("verify_store")
    orphan = BlobStore().put(b"nobody references me")
    # (The store is shared by every test here; blobs of runs rolled back go too.)
    assert "deleted" in cli("prune_store", "--grace-seconds", "0")
    assert not BlobStore().exists(orphan)
    assert "store OK" in cli("verify_store")  # everything referenced survived
    digest = run.checkpoints.order_by("-seq").first()
    blob = next(
        e.hash for e in checkpoints.snapshots().files(digest.tree).values() if e.path == "a.txt"
    )
    BlobStore().path(blob).chmod(0o644)
    BlobStore().path(blob).write_bytes(b"tampered")
    with pytest.raises(CommandError, match="problem"):
        cli("verify_store")


def test_checkpoints_show_in_show_run(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    data = json.loads(cli("show_run", str(run.pk), "--json"))
    assert [c["kind"] for c in data["checkpoints"]] == ["run_start", "session_end"]
    assert Checkpoint.objects.filter(run=run).count() == 2
