"""What the chaos soak (bench/chaos.py) found, each held by a test: a queue that cannot be reached
or that lost what it held must not lose a run or a person's rewind, and a worker that dies after a
run's checks passed must not turn its success into a failure."""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from huey import RedisHuey

from agents import jobs, reaper, rewinds, services
from agents.models import Event, Run, RunStatus
from agents.runspec import RunSpec
from tests.helpers import (
    drive_in_a_worker_that_dies,
    drive_until_idle,
    drive_until_the_final_checkpoint_kills_it,
    run_queued,
)

pytestmark = pytest.mark.django_db
SCRIPT = {
    "name": "s",
    "turns": [{"text": "Done.", "tool_calls": [{"name": "finish", "input": {}}]}],
}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain_queue() -> list[tuple[str, dict]]:
    from huey.contrib.djhuey import HUEY

    tasks = []
    while (task := HUEY.dequeue()) is not None:
        tasks.append((task.name, task.kwargs))
    return tasks


@pytest.fixture
def reap(django_capture_on_commit_callbacks):
    """The reaper's pass, with what it queues sent as after a commit."""

    def one_pass(**kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return reaper.reap(**kwargs)

    return one_pass


@pytest.fixture
def fresh_queue():
    """The tests' in-memory queue, emptied, with the reaper's mark in place (a queue that has
    been up all along)."""
    from huey.contrib.djhuey import HUEY

    HUEY.storage.flush_all()
    assert reaper.queue_was_emptied()  # the first look sets the mark
    yield HUEY
    HUEY.storage.flush_all()


def test_a_slice_that_cannot_be_queued_is_logged_and_left_for_the_reapers_next_pass(
    caplog, fresh_queue, reap
):
    run = services.create_run(RunSpec(goal="g", checks=["true"], script=SCRIPT))
    drain_queue()
    # A real Redis client, against a port where no Redis is: what a restarting Redis looks like.
    down = RedisHuey("shiftlog-down", url=f"redis://127.0.0.1:{closed_port()}/0")
    task = down.task(name="run_slice")(lambda run_id: None)
    with caplog.at_level(logging.WARNING, logger="agents.jobs"):
        assert jobs.send("run_slice", task, {"run_id": run.pk}) is False
    assert "could not queue run_slice" in caplog.text
    assert "the reaper will queue the work again" in caplog.text
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.enqueued_at is None
    # The reaper's next pass, seconds later (not REQUEUE_AFTER_SECONDS), queues it.
    assert reap() == [run.pk]
    assert ("run_slice", {"run_id": run.pk}) in drain_queue()
    # A queue that answers: sent, nothing marked.
    assert jobs.send("run_slice", jobs._task("run_slice"), {"run_id": run.pk}) is True
    assert drain_queue() == [("run_slice", {"run_id": run.pk})]


def test_a_queue_that_lost_everything_has_every_unleased_run_queued_again_at_once(
    fresh_queue, reap
):
    run = services.create_run(RunSpec(goal="g", checks=["true"], script=SCRIPT))
    ten_seconds_ago = timezone.now() - timedelta(seconds=10)
    Run.objects.filter(pk=run.pk).update(enqueued_at=ten_seconds_ago)
    drain_queue()
    # The queue kept its mark: a run queued ten seconds ago is trusted to be in it.
    assert reap() == []
    # The queue restarts empty (Redis without persistence): the mark is gone with the tasks.
    fresh_queue.storage.flush_all()
    assert reap() == [run.pk]
    assert drain_queue() == [("run_slice", {"run_id": run.pk})]
    # Once: the mark is back.
    Run.objects.filter(pk=run.pk).update(enqueued_at=ten_seconds_ago)
    assert reap() == []
    # A run queued in the last moments may be in the new queue already: it waits its turn.
    Run.objects.filter(pk=run.pk).update(enqueued_at=timezone.now())
    fresh_queue.storage.flush_all()
    assert reap() == []


def test_a_rewind_whose_task_was_lost_is_asked_again_and_carried_out_once(
    owner, fresh_queue, reap, django_capture_on_commit_callbacks
):
    run = drive_until_idle(services.create_demo_run(created_by=owner))  # waits for a person
    target = run.checkpoints.get(kind="session_end")
    drain_queue()
    with django_capture_on_commit_callbacks(execute=True):
        rewinds.request_rewind(run.pk, target.pk, actor="user:olivia", note="again")
    request = run.events.get(kind="run.rewind_requested")
    lost = drain_queue()  # the task is lost (a worker died with it, or the queue restarted)
    assert [name for name, _ in lost] == ["rewind_run"]
    assert lost[0][1]["request_seq"] == request.seq

    # Within its deadline, the reaper leaves it alone: its task may still be trying.
    reap()
    assert [n for n, _ in drain_queue()] == []
    # Past it, with no outcome in the log, the reaper asks again.
    later = timezone.now() + timedelta(seconds=rewinds.REWIND_WAIT_SECONDS + 11)
    reap(now=later)
    reap(now=later)  # the fresh task is still queued: asked once more, not a loop
    again = [t for t in drain_queue() if t[0] == "rewind_run"]
    assert again and all(kw["request_seq"] == request.seq for _, kw in again)
    with django_capture_on_commit_callbacks(execute=True):
        for _, kw in again:  # a second copy (the old task was only slow) does nothing
            assert jobs.body("rewind_run")(**kw)
    run.refresh_from_db()
    assert run.events.filter(kind="run.rewound").count() == 1
    assert run.status == RunStatus.QUEUED and run.head_checkpoint_id == target.pk
    assert not run.events.filter(kind="error").exists()
    # Answered: the reaper has nothing more to ask.
    reap(now=later + timedelta(seconds=60))
    assert not [t for t in drain_queue() if t[0] == "rewind_run"]


def test_after_the_queue_lost_everything_an_open_rewind_is_asked_again_at_once(
    owner, fresh_queue, reap, django_capture_on_commit_callbacks
):
    run = drive_until_idle(services.create_demo_run(created_by=owner))
    target = run.checkpoints.get(kind="session_end")
    with django_capture_on_commit_callbacks(execute=True):
        rewinds.request_rewind(run.pk, target.pk, actor="user:olivia")
    fresh_queue.storage.flush_all()  # the queue restarts empty, the task with it
    reap()
    assert run_queued("rewind_run")
    assert run.events.filter(kind="run.rewound").count() == 1
    assert Event.objects.filter(run=run, kind="run.rewind_requested").count() == 1


def test_a_task_from_before_this_change_still_rewinds(owner, django_capture_on_commit_callbacks):
    """Tasks queued by an older version carry no request_seq: they behave as they did."""
    run = drive_until_idle(services.create_demo_run(created_by=owner))
    target = run.checkpoints.get(kind="session_end")
    with django_capture_on_commit_callbacks(execute=True):
        assert rewinds.carry_out_rewind(
            run.pk, target.pk, actor="user:olivia", note="", until=time.time() + 60
        )
    assert run.events.filter(kind="run.rewound").count() == 1


def test_a_worker_that_dies_after_the_checks_passed_leaves_a_run_that_succeeds(monkeypatch):
    """Found by bench/chaos.py: the checks passed and the session ended as finished, and the worker
    died before marking the run succeeded. The next worker used to send the agent back to work
    (its script had run out, so the run failed); it now completes the success."""
    from agents.runtime.loop import drive
    from agents.runtime.slice import Slice
    from tests.helpers import finish_turn, make_run

    run = make_run(turns=[finish_turn()])
    drive_in_a_worker_that_dies(
        run.pk,
        monkeypatch,
        Slice,
        "transition",
        lambda self, target, **kwargs: target == RunStatus.SUCCEEDED,
    )
    run.refresh_from_db()
    assert run.status == RunStatus.VERIFYING
    checkpoints_before = run.checkpoints.count()

    outcome = drive(run.pk)
    run.refresh_from_db()
    assert outcome.status == RunStatus.SUCCEEDED == run.status
    assert "marked after its worker stopped" in run.status_reason
    assert run.sessions.count() == 1  # no new session: the agent was done
    assert not run.events.filter(kind="error").exists()
    # The final checkpoint the dead worker had already taken is not taken twice.
    assert run.checkpoints.count() == checkpoints_before


def test_a_worker_that_dies_taking_the_final_checkpoint_leaves_a_run_that_succeeds(monkeypatch):
    from agents.models import CheckpointKind
    from agents.runtime.loop import drive
    from tests.helpers import finish_turn, make_run

    run = make_run(turns=[finish_turn()])
    drive_until_the_final_checkpoint_kills_it(run.pk, monkeypatch)
    assert not run.checkpoints.filter(kind=CheckpointKind.SESSION_END).exists()

    assert drive(run.pk).status == RunStatus.SUCCEEDED
    final = run.checkpoints.get(kind=CheckpointKind.SESSION_END)
    assert final.label == "end of session 1 (finished)"


def test_a_full_disk_during_a_checkpoint_pauses_the_run_with_the_reason_and_loses_nothing(
    monkeypatch, settings, owner
):
    """Found by bench/chaos.py, which fills a small filesystem under the data folder: the slice
    used to die with the error, and the run waited a minute for the reaper to try again, and
    again while the disk stayed full. It now pauses, says why, and resumes once there is room."""
    import errno
    from io import StringIO

    from django.core.management import call_command

    from agents.blobstore import Batch, BlobStore
    from agents.runtime.loop import drive
    from tests.helpers import call, finish_turn, make_run

    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 1}
    run = make_run(
        turns=[
            {"text": "Writing.", "tool_calls": [call("write_file", path="a.txt", content="a")]},
            finish_turn(),
        ]
    )

    def full(real):
        def add(self, *args, **kwargs):
            if not (run.workspace_path / "a.txt").exists():  # the start's checkpoint goes in
                return real(self, *args, **kwargs)  # (the test's blob store may be empty)
            raise OSError(errno.ENOSPC, "No space left on device", str(self.store.root))

        return add

    # A checkpoint writes its blobs in a batch: once the tool has written, every new blob's
    # first write fails.
    monkeypatch.setattr(Batch, "add", full(Batch.add))
    monkeypatch.setattr(Batch, "add_file", full(Batch.add_file))
    outcome = drive(run.pk)
    run.refresh_from_db()
    assert outcome.status == RunStatus.PAUSED == run.status
    assert run.status_reason.startswith("the disk is full (")
    assert "No space left on device; resume the run once there is room" in run.status_reason
    assert (run.workspace_path / "a.txt").read_text() == "a"  # the tool's result stands

    monkeypatch.undo()  # room again
    services.resume_run(run.pk, actor="user:olivia")
    drive_until_idle(run)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    call_command("verify_store", stdout=StringIO())  # every checkpoint's blobs are there
    assert not BlobStore().stray_temp_files()  # nothing half-written left behind


@pytest.fixture
def paused_as_the_checks_run(monkeypatch):
    """Each slice's checks run, then a person pauses the run before the worker records them."""
    from agents.runtime.slice import Slice

    real = Slice.run_checks

    def paused_meanwhile(self, commands, **kwargs):
        results = real(self, commands, **kwargs)
        services.pause_run(self.run_id, actor="user:olivia")
        return results

    monkeypatch.setattr(Slice, "run_checks", paused_meanwhile)
    return lambda: monkeypatch.setattr(Slice, "run_checks", real)


def test_a_run_paused_while_its_passing_checks_ran_succeeds_when_resumed(
    paused_as_the_checks_run,
):
    """Found by bench/chaos.py: the checks passed and the session ended as finished, but the
    person's pause won over the success; the resumed run started a new session and sent the agent
    back to work it had finished (its script had run out, so the run failed)."""
    from agents.runtime.loop import drive
    from tests.helpers import finish_turn, make_run

    run = make_run(turns=[finish_turn()])
    assert drive(run.pk).status == RunStatus.PAUSED
    paused_as_the_checks_run()  # undo: the person does not pause again
    services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert "when the run was resumed" in run.status_reason
    assert run.sessions.count() == 1  # no new session: the agent was done
    assert run.events.filter(kind="tool.call", payload__name="finish").count() == 1
    assert run.checkpoints.filter(kind="session_end").count() == 1


def test_a_run_paused_while_its_failing_checks_ran_tells_the_agent_when_resumed(
    paused_as_the_checks_run,
):
    from agents.runtime.loop import drive
    from tests.helpers import call, finish_turn, make_run

    run = make_run(
        turns=[
            finish_turn(),
            {"text": "Writing.", "tool_calls": [call("write_file", path="a.txt", content="a")]},
            finish_turn(),
        ],
        checks=["test -f a.txt"],
    )
    assert drive(run.pk).status == RunStatus.PAUSED
    paused_as_the_checks_run()
    services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    finishes = run.events.filter(kind="tool.result", payload__name="finish").order_by("seq")
    assert [r.payload["is_error"] for r in finishes] == [True, False]
    assert "FAILED `test -f a.txt`" in finishes[0].payload["output"]


def test_a_run_paused_while_its_checks_ran_and_then_rewound_goes_on_from_the_checkpoint(
    paused_as_the_checks_run, django_capture_on_commit_callbacks
):
    """The finished session is on the abandoned branch: the run is not completed from it."""
    from agents.runtime.loop import drive
    from tests.helpers import finish_turn, make_run

    run = make_run(turns=[finish_turn()])
    assert drive(run.pk).status == RunStatus.PAUSED
    paused_as_the_checks_run()
    start = run.checkpoints.get(kind="run_start")
    with django_capture_on_commit_callbacks(execute=True):
        assert rewinds.carry_out_rewind(
            run.pk, start.pk, actor="user:olivia", note="again", until=time.time() + 60
        )
    run.refresh_from_db()
    if run.status == RunStatus.PAUSED:  # a run a person paused stays paused through a rewind
        services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert "when the run was resumed" not in run.status_reason
    assert run.events.filter(kind="run.rewound").count() == 1
    assert run.sessions.count() == 2  # the agent finished again after the rewind
    assert run.events.filter(kind="tool.call", payload__name="finish").count() == 2


def test_a_worker_that_dies_as_the_finished_session_ends_leaves_the_finish_to_do_again(monkeypatch):
    """The passed finish's result and the session's end are one write: a worker that died between
    them used to leave the finish answered in a session still open, and the next worker sent the
    agent back to work it had finished (its script had run out, so the run failed)."""
    from agents import eventlog
    from tests.helpers import finish_turn, make_run

    run = make_run(turns=[finish_turn()])
    drive_in_a_worker_that_dies(
        run.pk,
        monkeypatch,
        eventlog,
        "append_many",
        lambda run_id, events, **kwargs: any(e.kind == "session.ended" for e in events),
    )
    assert not run.events.filter(kind="tool.result", payload__name="finish").exists()

    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert run.events.filter(kind="check.result", payload__at="finish").count() == 2
    assert run.events.filter(kind="tool.result", payload__name="finish").count() == 1


def test_a_check_stopped_because_the_disk_is_full_pauses_the_run_instead_of_failing_it(settings):
    """Found by bench/chaos.py: while the disk was full, the disk watch stopped a finish's check
    (`true`) for the free space kept for the database; it was recorded as failing, and the agent
    was sent back to finished work (its script ran out, so the run failed). A check stopped for
    the host's disk is no verdict on the work: the run pauses for space, says why, records no
    check result, and the checks run again when it is resumed."""
    from agents.runtime.loop import drive
    from tests.helpers import finish_turn, make_run

    free_mb = settings.SHIFTLOG["MIN_FREE_MB"]
    settings.SHIFTLOG = {**settings.SHIFTLOG, "MIN_FREE_MB": 1 << 40}  # no disk has that free
    run = make_run(turns=[finish_turn()])
    outcome = drive(run.pk)
    run.refresh_from_db()
    assert outcome.status == RunStatus.PAUSED == run.status, run.status_reason
    assert run.status_reason.startswith("the disk is full (")
    assert "while the check `true` ran; resume the run once there is room" in run.status_reason
    assert run.pause_cause == "disk_full"
    assert not run.events.filter(kind="check.result").exists()

    settings.SHIFTLOG = {**settings.SHIFTLOG, "MIN_FREE_MB": free_mb}  # room again
    services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert run.sessions.count() == 1  # the agent was not asked again
    assert run.events.filter(kind="tool.call", payload__name="finish").count() == 1
    passed = run.events.filter(kind="check.result").values_list("payload__passed", flat=True)
    assert list(passed) == [True]


@pytest.fixture
def external_done(db):
    """An external run and its agent's API client, its workspace meeting the check."""
    from tests.helpers import user_with
    from tests.test_api_external import bearer, make_external, tarball

    api = bearer(user_with("agent", "decide_approval"), "read", "write")
    run_id = make_external(api)
    api.put(
        f"/api/v1/runs/{run_id}/workspace",
        tarball({"done.txt": "yes"}),
        content_type="application/gzip",
    )
    return api, run_id


def test_an_external_agent_s_finish_stopped_by_a_full_disk_pauses_the_run_and_says_why(
    settings, external_done
):
    """The same for an external agent: its finish is answered "the checks did not run" with the
    reason, the run pauses for space, and a finish after the resume passes."""
    from tests.test_api_external import finish

    api, run_id = external_done
    free_mb = settings.SHIFTLOG["MIN_FREE_MB"]
    settings.SHIFTLOG = {**settings.SHIFTLOG, "MIN_FREE_MB": 1 << 40}
    verdict = finish(api, run_id)
    assert verdict["passed"] is False, verdict
    assert verdict["summary"].startswith("The checks did not run"), verdict
    assert "the disk is full" in verdict["summary"] and verdict["checks"] == []
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.PAUSED and run.pause_cause == "disk_full", run.status_reason
    assert not run.events.filter(kind="check.result").exists()

    settings.SHIFTLOG = {**settings.SHIFTLOG, "MIN_FREE_MB": free_mb}
    services.resume_run(run_id, actor="user:olivia")
    assert api.get(f"/api/v1/runs/{run_id}/context").status_code == 200
    verdict = finish(api, run_id)
    assert verdict["passed"] is True and verdict["run_status"] == "succeeded", verdict


def test_an_external_run_paused_while_its_passing_checks_ran_succeeds_when_resumed(
    paused_as_the_checks_run, external_done
):
    """As for the harness's own runs: an external agent's checks passed and its session ended
    as finished, but a person paused the run meanwhile. The finish keeps its one answer (it used
    to get a second, "the checks did not run"), and the resumed run is marked succeeded at the
    agent's next call instead of opening a new session and sending the agent back to work."""
    from tests.test_api_external import finish

    api, run_id = external_done
    verdict = finish(api, run_id)
    assert verdict["run_status"] == "paused" and verdict["passed"] is False, verdict
    assert [c["passed"] for c in verdict["checks"]] == [True]
    assert "1 of 1 passed" in verdict["summary"], verdict
    run = Run.objects.get(pk=run_id)
    results = run.events.filter(kind="tool.result", payload__name="finish")
    assert results.count() == 1  # one answer

    paused_as_the_checks_run()  # undo: the person does not pause again
    services.resume_run(run_id, actor="user:olivia")
    r = api.get(f"/api/v1/runs/{run_id}/context")
    assert r.status_code == 409 and "succeeded" in r.json()["detail"], r.content
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert "when the run was resumed" in run.status_reason
    assert run.sessions.count() == 1  # no new session: the agent was done
    assert run.checkpoints.filter(kind="session_end").count() == 1


def test_a_worker_frozen_past_its_lease_cannot_write_over_a_rewind(monkeypatch):
    """Found by bench/chaos.py (a run's rewound workspace held the abandoned branch's files
    again): a worker stopped (SIGSTOP) in a model call past its lease; a person rewound the run
    meanwhile. The worker woke and went on with its old conversation: its next call and result
    went onto the new branch, and its stale copy of the workspace became the run's. A rewind now
    takes the lease away, so the woken worker's next write is refused and it stops."""
    from agents.models import Run
    from agents.providers.scripted import ScriptedProvider
    from agents.runtime.loop import drive
    from tests.helpers import call, finish_turn, make_run

    turns = [
        {"text": "a", "tool_calls": [call("write_file", path="a.txt", content="A\n")]},
        {"text": "b", "tool_calls": [call("write_file", path="b.txt", content="B\n")]},
        finish_turn(),
    ]
    run = make_run(turns=turns)
    real, frozen = ScriptedProvider.next_turn, []

    def frozen_in_the_second_call(self, request):
        turn = real(self, request)
        if turn.meta.get("script_index") == 1 and not frozen:
            frozen.append(True)
            # Meanwhile, its lease runs out and a person rewinds to the run's start.
            Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now())
            start = run.checkpoints.get(number=1)
            rewinds.rewind(run.pk, start.pk, actor="user:olivia", wait_seconds=5)
        return turn

    monkeypatch.setattr(ScriptedProvider, "next_turn", frozen_in_the_second_call)
    drive(run.pk)  # wakes: its turn is refused (the lease is gone) and the slice ends
    rewound = run.events.get(kind="run.rewound")
    after = list(run.events.filter(seq__gt=rewound.seq).values_list("kind", "actor"))
    assert not [kind for kind, actor in after if actor == "agent" or kind.startswith("tool.")]
    assert not (run.workspace_path / "b.txt").exists()  # its call never ran
    assert not (run.workspace_path / "a.txt").exists()  # the rewound workspace: the start

    monkeypatch.setattr(ScriptedProvider, "next_turn", real)
    from tests.helpers import drive_until_idle

    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert (run.workspace_path / "a.txt").read_text() == "A\n"
    assert (run.workspace_path / "b.txt").read_text() == "B\n"
