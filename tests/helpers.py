"""Helpers the tests share: people, scripts, runs made and driven as workers would. Fixtures
live in conftest.py; import these from here."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model

from agents import services
from agents.models import Run
from agents.runspec import RunSpec
from agents.runtime.loop import drive
from tests.procs import BASE_DIR, Procs

if TYPE_CHECKING:
    from tests.fake_anthropic import FakeAnthropic


def user_with(name: str, *perms: str):
    """A user with these agents permissions (fresh from the database: permissions are cached)."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(name, password=f"pw-{name}-123")
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return get_user_model().objects.get(pk=user.pk)


def client_for(user):
    from django.test import Client

    c = Client()
    c.force_login(user)
    return c


def script(*turns: dict) -> dict:
    """A scripted-provider script from turns: {"text": ..., "tool_calls": [...]}."""
    return {"name": "test", "turns": list(turns)}


def call(name: str, **tool_input) -> dict:
    return {"name": name, "input": tool_input}


def finish_turn(summary: str = "done") -> dict:
    return {"text": "Finishing.", "tool_calls": [call("finish", summary=summary)]}


LINEAGE = (
    "created_by",
    "actor",
    "forked_from",
    "resume_state",
    "origin",
    "parent",
    "workspace_tree",
)


def make_run(*, turns: list[dict] | None = None, checks: list[str] | None = None, **kwargs) -> Run:
    """A run made through services.create_run: RunSpec's fields and create_run's keywords."""
    kwargs.setdefault("goal", "test goal")
    if turns is not None:
        kwargs["script"] = script(*turns)
    budgets = kwargs.pop("budgets", None)
    if budgets is not None:  # services.Budgets, as create_run once took them
        kwargs.update({k: v for k, v in vars(budgets).items() if v is not None})
    lineage = {k: kwargs.pop(k) for k in LINEAGE if k in kwargs}
    return services.create_run(RunSpec(checks=checks or ["true"], **kwargs), **lineage)


def drive_until_idle(run: Run, *, max_slices: int = 50) -> Run:
    """Drive a run slice after slice, as workers would, until it waits or is over."""
    for _ in range(max_slices):
        outcome = drive(run.pk)
        if outcome.status != "running" and outcome.status != "queued":
            break
        if outcome.result == "not-claimed":
            raise AssertionError(f"run {run.pk} could not be claimed")
    run.refresh_from_db()
    return run


def run_queued(name: str) -> list:
    """Run the queued huey tasks named `name`, as a worker would, and return them (the tests'
    huey keeps its queue in memory and no consumer reads it); other queued tasks are dropped."""
    from huey.contrib.djhuey import HUEY

    from agents import jobs

    # The task's own function, without djhuey's close_db around it: that would close the
    # test's connection, inside the test's transaction.
    body = jobs.body(name)
    done = []
    while (task := HUEY.dequeue()) is not None:
        if task.name == name:
            body(*task.args, **task.kwargs)
            done.append(task)
    return done


NOTIFY_TASKS = ("slack_post", "slack_tell", "mail_approvals", "mail_run_ended", "mail_digest")


def drain() -> list[str]:
    """Run the queued notification tasks as a worker would (the tests' huey keeps its queue in
    memory and no consumer reads it), retries scheduled for later taken as due, until none is
    left; the names run, in order."""
    from datetime import datetime

    from huey.contrib.djhuey import HUEY

    from agents import jobs

    done = []
    # Bounded (a task that queues itself forever fails the test), but well above what the tests
    # queue: on the PostgreSQL + Redis pass the queue is Redis's and may hold earlier tests' tasks.
    for _ in range(5000):
        tasks = [task] if (task := HUEY.dequeue()) is not None else []
        tasks = tasks or HUEY.read_schedule(datetime(9999, 1, 1))
        if not tasks:
            return done
        for task in tasks:
            if task.name in NOTIFY_TASKS:
                jobs.body(task.name)(*task.args, **task.kwargs)
                done.append(task.name)
    raise AssertionError("the tasks did not settle")


def kinds(run: Run) -> list[str]:
    return list(run.events.order_by("seq").values_list("kind", flat=True))


FAKE_API_KEY = "sk-ant-test-key-0123456789"


def approve_pending(run: Run, user, **kwargs) -> list:
    from agents.approvals import decide
    from agents.models import Approval

    pending = list(Approval.objects.filter(run=run, status="pending").order_by("pk"))
    return [decide(a.pk, user=user, approve=True, **kwargs) for a in pending]


def demo_to_success(user) -> Run:
    """The demo, with its risky step approved, driven to the end."""
    run = drive_until_idle(services.create_demo_run())
    assert run.status == "awaiting_approval", run.status_reason
    approve_pending(run, user)
    return drive_until_idle(run)


# --- the worked examples and the framework adapters, against a real server ---------------
CLIENT_SRC = BASE_DIR / "clients" / "python" / "src"
EXAMPLES = BASE_DIR / "examples"
CHECKS = ["test -f done.txt", "grep -qx yes done.txt"]


def issue_token(tmp_path, user: str, scopes: str) -> str:
    out = Procs(tmp_path).manage("create_token", "--user", user, "--scopes", scopes)
    return out.strip().splitlines()[-1]


def agent_env(fake: FakeAnthropic, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
    env.update(
        {
            "PYTHONPATH": str(CLIENT_SRC),
            "PYTHONUNBUFFERED": "1",
            "ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
            **extra,
        }
    )
    return env


def tool_use(call_id: str, name: str, **input: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


def text(words: str) -> dict:
    return {"type": "text", "text": words}


class WorkerDied(BaseException):
    """Stands for SIGKILL at one point of a slice: nothing after it runs in that worker."""


def drive_in_a_worker_that_dies(run_id: int, monkeypatch, owner, name: str, when) -> None:
    """Drive the run in a worker that dies (WorkerDied) at the first call of `owner.name` for
    which `when(*args, **kwargs)` holds; `owner.name` is itself again afterwards."""
    import pytest

    from agents.runtime.loop import drive

    real = getattr(owner, name)

    def dies(*args, **kwargs):
        if when(*args, **kwargs):
            raise WorkerDied
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, dies)
    with pytest.raises(WorkerDied):
        drive(run_id)
    monkeypatch.setattr(owner, name, real)


def drive_until_the_final_checkpoint_kills_it(run_id: int, monkeypatch) -> None:
    """Drive the run in a worker that dies as it takes the session-end checkpoint (after the
    checks passed and the session ended as finished)."""
    from agents.models import CheckpointKind
    from agents.runtime.slice import Slice

    drive_in_a_worker_that_dies(
        run_id,
        monkeypatch,
        Slice,
        "checkpoint",
        lambda self, kind, label="": kind == CheckpointKind.SESSION_END,
    )
