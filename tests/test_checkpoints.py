"""Checkpoints, rewind, fork and diffs, through the runtime and the CLI."""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from io import StringIO
from itertools import pairwise

import pytest
from django.core.management import CommandError, call_command

from agents import checkpoints, rewinds, services, workspaces
from agents.blobstore import BlobStore
from agents.branches import abandoned, in_ranges
from agents.models import Artifact, Checkpoint, Event, Run, RunStatus, WebhookDelivery
from agents.runtime.conversation import INTERRUPTED
from tests.helpers import (
    approve_pending,
    call,
    drive_until_idle,
    finish_turn,
    make_run,
)
from tests.procs import dump_events, wait_for

pytestmark = pytest.mark.django_db


def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def cli_failing(*args: str) -> tuple[CommandError, str]:
    """Run a command that must fail: (its error, what it wrote to stderr)."""
    err = StringIO()
    with pytest.raises(CommandError) as info:
        call_command(*args, stdout=StringIO(), stderr=err)
    return info.value, err.getvalue()


def blob_count() -> int:
    return sum(1 for _ in BlobStore().iter_digests())


def workspace_tree(run: Run) -> str:
    return workspaces.store().snapshot(run.workspace_path).tree


def test_the_demo_checkpoints_at_start_session_ends_and_before_approval(decider):
    run = drive_until_idle(services.create_demo_run())
    kinds = list(run.checkpoints.order_by("seq").values_list("kind", flat=True))
    assert kinds == ["run_start", "session_end", "pre_approval"]
    start, session_end, pre_approval = run.checkpoints.order_by("seq")
    # Each checkpoint's parent is the one before it.
    assert start.parent is None
    assert session_end.parent == start and pre_approval.parent == session_end
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
    final = run.checkpoints.order_by("-seq").first()
    assert final.kind == "session_end" and final.parent == pre_approval  # the final one


def test_the_abandoned_ranges_of_rewinds_into_branches_they_left():
    # Rewound at 21 to #10, then at 41 to #25: both branches are off.
    assert abandoned([(10, 20), (25, 40)]) == [(10, 20), (25, 40)]
    # Then at 51 back to #30, a checkpoint of the branch the second rewind left: that branch
    # (21-30) is live again, with what the first rewind left still off.
    assert abandoned([(10, 20), (25, 40), (30, 50)]) == [(10, 20), (30, 50)]
    # Back to #15, on the first branch left: only what followed #15 is off.
    assert abandoned([(10, 20), (25, 40), (15, 50)]) == [(15, 50)]
    # To the last seq a rewind left (its pre-approval checkpoint): that whole branch is back.
    assert abandoned([(10, 20), (20, 30)]) == [(20, 30)]
    # Rewound at 21 to #5 and at 41 to #15 (on the first branch); then at 51 to #30, taken on the
    # branch the first rewind began: what that rewind left (6-20) is off again, as it was then.
    assert abandoned([(5, 20), (15, 40), (30, 50)]) == [(5, 20), (30, 50)]
    # Seen in the soak: to #6 twice, to #16, then to #108 of the branch begun at 57.
    rewinds = [(6, 56), (6, 112), (16, 168), (108, 200)]
    assert abandoned(rewinds) == [(6, 56), (108, 200)]


def test_a_rewind_to_a_checkpoint_of_an_abandoned_branch_resumes_that_branch(decider):
    """Its workspace and its conversation are the checkpoint's: the agent goes on from where
    it was then, not from where the branch it left began (found by bench/chaos.py: the script
    played again turns whose effects the workspace already held)."""
    run = drive_until_idle(services.create_demo_run())
    assert run.status == RunStatus.AWAITING_APPROVAL
    start = run.checkpoints.get(kind="run_start")
    later = run.checkpoints.get(kind="session_end")
    rewinds.rewind(run.pk, start.pk, actor="user:dana")
    assert in_ranges(later.seq, Event.objects.abandoned_ranges(run.pk))
    rewinds.rewind(run.pk, later.pk, actor="user:dana")
    live = Event.objects.on_live_branch(run.pk)
    assert live.filter(seq=later.seq).exists()
    assert workspace_tree(run) == later.tree
    turns = live.filter(kind="model.turn", seq__lte=later.seq).order_by("-seq")
    assert turns.first().payload["meta"] == later.state["provider_meta"]
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    # Session 1's turns were played once on the live branch: none again after the rewinds.
    played = [
        e.payload["meta"].get("script_index")
        for e in Event.objects.on_live_branch(run.pk).filter(kind="model.turn").order_by("seq")
        if not e.payload["meta"].get("synthesized")
    ]
    assert played == sorted(set(played)), played


def test_rewinding_the_demo_to_a_mid_run_checkpoint_and_it_continues_to_success(decider):
    run = drive_until_idle(services.create_demo_run())
    assert run.status == RunStatus.AWAITING_APPROVAL
    target = run.checkpoints.get(kind="session_end")
    before = run.last_seq
    spent = [
        e.payload["usage"]
        for e in Event.objects.filter(run=run, kind="model.turn", seq__gt=target.seq)
    ]
    assert spent  # session 2 took turns: they are what the rewind discards
    discarded = rewinds.rewind(run.pk, target.pk, actor="user:dana", note="go carefully")
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
    assert rewound.payload["tokens"] == sum(u["input_tokens"] + u["output_tokens"] for u in spent)
    assert Decimal(rewound.payload["cost_usd"]) == 0  # offline
    assert rewound.payload["artifacts"] == []  # session 2 saved none before its approval wait
    assert any(f["path"] == "textstats.py" for f in discarded.files)
    assert run.sessions.get(index=2).end_reason == "rewound"
    assert Event.objects.abandoned_ranges(run.pk) == [(target.seq, rewound.payload["from_seq"])]
    # The next session starts from the checkpoint's handoff and the note; the script, rewound
    # with it, plays session 2's steps again, risky one included.
    run = drive_until_idle(run)
    # The branch after the rewind grows from the checkpoint rewound to, not from the head
    # left behind (the pre-approval checkpoint of the abandoned session 2).
    after = run.checkpoints.filter(seq__gt=rewound.seq).order_by("seq")
    assert after and after[0].parent == target
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
    out = json.loads(
        cli("rewind_run", str(run.pk), "--to", str(start.number), "--dry-run", "--json")
    )
    assert out["dry_run"] is True
    assert {f["path"] for f in out["files"]} == {"a.txt", "b.txt"}
    assert [c["command"] for c in out["irreversible"]] == [
        "curl -s https://example.com -o c.txt || true"
    ]
    assert "reaches the network" in out["irreversible"][0]["risks"]
    run.refresh_from_db()
    assert run.last_seq == seq and (run.workspace_path / "a.txt").exists()
    text = cli("rewind_run", str(run.pk), "--to", str(start.number), "--dry-run")
    assert "would discard" in text and "cannot be undone" in text


def test_rewind_refuses_bad_targets_clearly(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    other = drive_until_idle(make_run(turns=[{"text": "x"}, {"text": "y"}], checks=["true"]))
    with pytest.raises(CommandError, match="fork it from the checkpoint instead") as info:
        cli("rewind_run", str(run.pk), "--to", str(run.checkpoints.first().number))
    assert info.value.returncode == 2
    live = make_run(turns=[finish_turn()])
    with pytest.raises(CommandError, match=f"run {live.pk} has no checkpoint"):
        cli("rewind_run", str(live.pk), "--to", str(other.checkpoints.first().number))


def test_fork_makes_an_independent_run_and_the_store_grows_only_by_new_blobs(decider):
    run = drive_until_idle(services.create_demo_run())
    target = run.checkpoints.get(kind="session_end")
    blobs = blob_count()
    fork_id = int(
        cli(
            "fork_run",
            str(run.pk),
            "--from",
            str(target.number),
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


# What a run is, as against what it did: a fork starts with every one of these as its origin's.
# A fork keeps every setting of its origin: tests/test_runspec.py.


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
    # Checkpoints are named by their number in the run, 1, 2, 3 ... in the order taken.
    assert list(run.checkpoints.order_by("seq").values_list("number", flat=True)) == list(
        range(1, run.checkpoints.count() + 1)
    )
    r, a, b = str(run.pk), str(start.number), str(end.number)
    out = cli("diff_checkpoints", r, a, b)
    assert "added        a.txt" in out and "added        c.txt" in out
    assert "+one" in out
    rows = json.loads(cli("diff_checkpoints", r, a, "live", "--json"))
    assert {r["path"]: r["status"] for r in rows} == {"a.txt": "added", "c.txt": "added"}
    (run.workspace_path / "a.txt").write_text("changed live\n")
    live = cli("diff_checkpoints", r, b, "live")
    assert "changed      a.txt" in live and "-TWO" in live and "+changed live" in live
    assert cli("diff_checkpoints", r, b, b).strip() == "no changes"
    # Another run's checkpoint as RUN:N (a fork against its origin, say).
    other = drive_until_idle(make_run(turns=[finish_turn()], checks=["true"]))
    across = cli("diff_checkpoints", r, b, f"{other.pk}:1", "--stat")
    assert "removed      a.txt" in across
    for bad, message in [
        ("nope", "must be a whole number"),
        ("0", "at least 1"),
        ("999", f"run {run.pk} has no checkpoint 999"),
        ("x:1", "expected N or RUN:N"),
        ("99999:1", "run 99999 has no checkpoint 1"),
    ]:
        with pytest.raises(CommandError, match=message) as info:
            cli("diff_checkpoints", r, bad, "live")
        assert info.value.returncode == 2


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
    assert f"checkpoint {cp.number}" in out and cp.label == "before lunch"
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
    blob = next(e.hash for e in workspaces.store().files(digest.tree).values() if e.path == "a.txt")
    BlobStore().path(blob).chmod(0o644)
    BlobStore().path(blob).write_bytes(b"tampered")
    with pytest.raises(CommandError, match="problem"):
        cli("verify_store")


def test_checkpoints_show_in_show_run(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    data = json.loads(cli("show_run", str(run.pk), "--json"))
    assert [c["kind"] for c in data["checkpoints"]] == ["run_start", "session_end"]
    assert Checkpoint.objects.filter(run=run).count() == 2


# --- the store keeps what protected files need -----------------------------------------------
def age(digest: str, seconds: float) -> None:
    """Make a stored blob look `seconds` old, as a prune's grace period sees it."""
    then = time.time() - seconds
    os.utime(BlobStore().path(digest), (then, then))


def protected_run(tmp_path) -> tuple[Run, bytes]:
    """A queued run (never started: no checkpoint yet) with one protected file of its own."""
    seed = tmp_path / "seed"
    seed.mkdir()
    # Content of this test's own, so no other run's checkpoint holds the same blob.
    original = f"# {tmp_path}\nimport unittest\n".encode()
    (seed / "test_it.py").write_bytes(original)
    run = make_run(turns=[finish_turn()], workspace_from=seed, protected_paths=["test_it.py"])
    assert run.status == RunStatus.QUEUED and not run.checkpoints.exists()
    return run, original


def test_prune_keeps_a_protected_files_original_that_only_the_run_references(tmp_path):
    run, original = protected_run(tmp_path)
    blob = run.protected["test_it.py"]["hash"]
    orphan = BlobStore().put(f"nobody references me {tmp_path}".encode())
    # The run stayed queued for longer than the grace period.
    age(blob, 2 * 3600)
    age(orphan, 2 * 3600)
    assert "deleted" in cli("prune_store", "--grace-seconds", "3600")
    assert not BlobStore().exists(orphan)  # the prune did delete what nothing references
    assert BlobStore().exists(blob)
    # The original the checks are run against can still be put back.
    assert BlobStore().get(blob) == original
    assert "1 protected file(s)" in cli("verify_store")


def test_verify_store_reports_a_corrupt_or_missing_protected_files_original(tmp_path):
    run, _ = protected_run(tmp_path)
    blob = run.protected["test_it.py"]["hash"]
    path = BlobStore().path(blob)
    path.chmod(0o644)
    path.write_bytes(b"tampered")
    error, stderr = cli_failing("verify_store")
    assert error.returncode == 2 and "1 problem(s)" in str(error)
    assert f"protected file test_it.py of run {run.pk}: blob {blob} is corrupt" in stderr
    path.unlink()
    _, stderr = cli_failing("verify_store")
    assert f"protected file test_it.py of run {run.pk}: blob {blob} is missing" in stderr


def test_verify_store_reports_a_corrupt_artifact(decider):
    run = drive_until_idle(services.create_demo_run())
    artifact = Artifact.objects.filter(run=run).first()
    assert "store OK" in cli("verify_store")
    path = BlobStore().path(artifact.blob_hash)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"!")
    _, stderr = cli_failing("verify_store")
    assert f"artifact {artifact.pk}: blob {artifact.blob_hash} is corrupt" in stderr


def test_storing_content_already_in_the_store_renews_its_grace_period(db, tmp_path):
    store = BlobStore()
    data = f"an artifact or fingerprint whose row is not written yet {tmp_path}".encode()
    digest = store.put(data)
    age(digest, 2 * 3600)
    # Stored again for a new row that a prune cannot see before it is committed.
    assert store.put(data) == digest
    cli("prune_store", "--grace-seconds", "3600")
    assert store.exists(digest)


# --- what a rewind discards, in tokens, dollars and artifacts ---------------------------------


def tool_use(id_: str, tool: str, /, **tool_input) -> dict:
    return {"type": "tool_use", "id": id_, "name": tool, "input": tool_input}


def test_a_rewind_records_the_tokens_dollars_and_artifacts_it_discards(fake_api, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 1}
    fake_api.push_message(
        [tool_use("t1", "write_file", path="a.txt", content="first\n")],
        stop_reason="tool_use",
        usage={"input_tokens": 1000, "output_tokens": 100},
    )
    fake_api.push_message(
        [
            tool_use("t2", "write_file", path="a.txt", content="second\n"),
            tool_use("t3", "save_artifact", path="a.txt", name="a-second"),
        ],
        stop_reason="tool_use",
        usage={"input_tokens": 2000, "output_tokens": 200},
    )
    fake_api.push_message(
        [tool_use("t4", "bash", command="curl -s https://example.com/ping")],
        stop_reason="tool_use",
        usage={"input_tokens": 500, "output_tokens": 50},
    )
    run = drive_until_idle(make_run(provider="anthropic", checks=["grep -q first a.txt"]))
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    start, after_first, after_second, pre_approval = run.checkpoints.order_by("seq")
    assert [c.kind for c in (start, after_first, after_second, pre_approval)] == [
        "run_start",
        "periodic",
        "periodic",
        "pre_approval",
    ]
    # Each checkpoint's parent is the one before it.
    assert start.parent is None
    assert after_first.parent == start
    assert after_second.parent == after_first
    assert pre_approval.parent == after_second

    rewinds.rewind(run.pk, after_first.pk, actor="user:dana")
    rewound = Event.objects.get(run=run, kind="run.rewound").payload
    # The second and third turns: sonnet-4-5 at $3/M input and $15/M output.
    assert rewound["tokens"] == 2000 + 200 + 500 + 50
    assert Decimal(rewound["cost_usd"]) == Decimal(2500 * 3 + 250 * 15) / 1_000_000
    assert rewound["artifacts"] == ["a-second"]
    run.refresh_from_db()
    assert run.cost_usd > Decimal(rewound["cost_usd"])  # spent is spent: nothing is refunded

    fake_api.push_message(
        [tool_use("t5", "finish", summary="a.txt says first")], stop_reason="tool_use"
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    (final,) = run.checkpoints.filter(seq__gt=run.branch_seq)
    assert final.kind == "session_end" and final.parent == after_first


# --- rewinding a run a real worker is driving --------------------------------------------------


SLOW_STEP = "echo start >> slow.log; sleep 3; echo end >> slow.log"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_rewinding_a_running_run_pauses_it_lets_its_step_finish_and_it_continues(procs, owner):
    run = make_run(
        turns=[
            {"tool_calls": [call("write_file", path="a.txt", content="kept\n")]},
            {"tool_calls": [call("bash", command=SLOW_STEP)]},
            {"tool_calls": [call("write_file", path="b.txt", content="after\n")]},
            finish_turn(),
        ],
        checks=["test -f a.txt && test -f b.txt"],
    )
    procs.consumer(name="consumer", SHIFTLOG_CHECKPOINT_EVERY=1)
    procs.enqueue(run.pk)
    details = lambda: f"{dump_events(run.pk)}\n{procs.logs()}"  # noqa: E731
    slow_log = run.workspace_path / "slow.log"
    wait_for(
        lambda: slow_log.exists() and "start" in slow_log.read_text(),
        timeout=30,
        what="the slow step to start",
        details=details,
    )
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
    target = run.checkpoints.get(kind="periodic")  # after a.txt, before the slow step
    assert target.files == 1

    out = cli("rewind_run", str(run.pk), "--to", str(target.number), "--user", "olivia")
    assert f"run {run.pk} → checkpoint {target.number}: rewound" in out
    run.refresh_from_db()
    log = details()
    assert run.status == RunStatus.QUEUED, log
    # Paused first, naming the person; the worker finished its step; then the rewind.
    paused = Event.objects.get(run=run, kind="run.status", payload__to="paused")
    assert paused.actor == "user:olivia" and "to rewind" in paused.payload["reason"], log
    slow = Event.objects.get(run=run, kind="tool.result", payload__tool_use_id="toolu_scripted_1_0")
    assert not slow.payload["is_error"] and slow.payload["output"] != INTERRUPTED, log
    rewound = Event.objects.get(run=run, kind="run.rewound")
    assert paused.seq < slow.seq < rewound.seq, log
    assert rewound.actor == "user:olivia", log
    assert rewound.payload["to_seq"] == target.seq, log
    assert {"path": "slow.log", "status": "removed by rewind"} in rewound.payload["files"], log
    # The worker took no further turn after the pause and let go of the run.
    assert not Event.objects.filter(
        run=run, kind="model.turn", seq__gt=paused.seq, seq__lt=rewound.seq
    ).exists(), log
    assert run.lease_owner == "", log
    # The workspace is exactly the checkpoint again: the slow step's file is gone.
    assert workspace_tree(run) == target.tree, log
    assert not slow_log.exists() and (run.workspace_path / "a.txt").read_text() == "kept\n"

    # Queued again, the run plays on from the checkpoint (the slow step once more) to success.
    procs.enqueue(run.pk)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "cancelled"},
        timeout=60,
        what="the rewound run to end",
        details=details,
    )
    run.refresh_from_db()
    log = details()
    assert run.status == RunStatus.SUCCEEDED, log
    assert slow_log.read_text() == "start\nend\n", log
    assert (run.workspace_path / "b.txt").read_text() == "after\n", log
    assert [s.end_reason for s in run.sessions.order_by("index")] == ["rewound", "finished"], log
    # The new branch's checkpoints grow from the one rewound to.
    branch = list(run.checkpoints.filter(seq__gt=rewound.seq).order_by("seq"))
    assert branch and branch[0].parent == target, log
    assert all(c.parent == p for p, c in pairwise(branch)), log


def queued_task_names() -> list[str]:
    from huey.contrib.djhuey import HUEY

    names = []
    while (task := HUEY.dequeue()) is not None:
        delivery = WebhookDelivery.objects.filter(pk=task.kwargs.get("delivery_id")).first()
        names.append((task.name, delivery.payload.get("event") if delivery else None))
    return names


def test_a_requested_rewind_waits_for_the_runs_worker_and_pauses_it_without_a_webhook(
    owner, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    run = drive_until_idle(
        services.create_demo_run(created_by=owner)
    )  # waiting for a person at its risky step
    Run.objects.filter(pk=run.pk).update(webhook_urls=["http://127.0.0.1:9/hook"])
    target = run.checkpoints.get(kind="session_end")
    queued_task_names()  # start from an empty queue
    with django_capture_on_commit_callbacks(execute=True):
        rewinds.request_rewind(run.pk, target.pk, actor="user:olivia", note="slowly")
    # The request changed nothing but the log, and queued the work.
    run.refresh_from_db()
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert ("rewind_run", None) in queued_task_names()
    # A worker still holds the run (say it is on a step): the rewind pauses the run and waits.
    Run.objects.filter(pk=run.pk).update(
        lease_owner="worker:elsewhere", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    later = time.time() + 60
    with django_capture_on_commit_callbacks(execute=True):
        assert not rewinds.carry_out_rewind(
            run.pk, target.pk, actor="user:olivia", note="slowly", until=later
        )
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED and not run.events.filter(kind="run.rewound").exists()
    assert ("deliver_webhook", "run.paused") not in queued_task_names()  # nobody asked for it
    assert not WebhookDelivery.objects.filter(run=run, payload__event="run.paused").exists()
    # Once the worker lets go, the next attempt rewinds and queues the run again.
    Run.objects.filter(pk=run.pk).update(lease_owner="", lease_expires_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        assert rewinds.carry_out_rewind(
            run.pk, target.pk, actor="user:olivia", note="slowly", until=later
        )
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.head_checkpoint_id == target.pk
    assert run.events.get(kind="run.rewound").payload["note"] == "slowly"
    assert run.events.filter(kind="run.status", payload__to="paused").count() == 1


def test_a_requested_rewind_gives_up_with_a_reason_when_it_cannot_be_done(owner):
    from datetime import timedelta

    from django.utils import timezone

    run = drive_until_idle(services.create_demo_run(created_by=owner))
    target = run.checkpoints.get(kind="session_end")
    Run.objects.filter(pk=run.pk).update(
        lease_owner="worker:stuck", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert rewinds.carry_out_rewind(
        run.pk, target.pk, actor="user:olivia", note="", until=time.time() - 1
    )
    error = run.events.get(kind="error")
    assert error.payload["source"] == "rewind"
    assert "was not done: its worker did not let go of it" in error.payload["message"]
    assert not run.events.filter(kind="run.rewound").exists()
    # A run that ended meanwhile is not rewound either, and the log says why.
    services.cancel_run(run.pk, actor="user:olivia")
    assert rewinds.carry_out_rewind(
        run.pk, target.pk, actor="user:olivia", note="", until=time.time() + 60
    )
    assert "the run is cancelled" in run.events.filter(kind="error").last().payload["message"]
    with pytest.raises(checkpoints.CheckpointError, match="fork it from the checkpoint"):
        rewinds.request_rewind(run.pk, target.pk, actor="user:olivia")


@pytest.mark.django_db(transaction=True)
def test_checkpoints_taken_at_once_each_get_their_own_number():
    """Found by bench/chaos.py: with the session count and the last number read in the same
    statement as the run's lock, PostgreSQL read them as of before the wait for the lock, and a
    person's checkpoint beside the worker's got a number already taken (an IntegrityError)."""
    import threading

    from django.db import connection

    run = make_run()
    run.workspace_path.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []

    def several() -> None:
        try:
            for _ in range(5):
                try:
                    checkpoints.create(run.pk, kind="manual", actor="user:eve")
                except Exception as e:
                    errors.append(repr(e))
        finally:
            connection.close()

    threads = [threading.Thread(target=several) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    numbers = sorted(run.checkpoints.values_list("number", flat=True))
    assert numbers == list(range(1, 21))
