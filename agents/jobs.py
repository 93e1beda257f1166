"""Work for a worker to do later, queued by name once the current transaction commits.

The huey tasks (agents/tasks.py) register themselves here when huey loads them (djhuey imports
every app's tasks module at start-up, in the web, the CLI and the worker alike); everything else
queues them by name. So nothing imports the tasks module and the tasks import their work at the
top like any other module: imports run one way, the tasks on the top floor.

huey gives no acknowledgements (a task whose worker dies is lost), so the database is the truth:
`enqueue` records when it queued a run, and the reaper queues again what was lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.models import Run

_tasks: dict[str, Any] = {}  # name -> huey task


def register(**tasks: Any) -> None:
    _tasks.update(tasks)


def _task(name: str):
    try:
        return _tasks[name]
    except KeyError:
        raise LookupError(
            f"no task {name!r} is registered: agents.tasks registers them when huey starts "
            "(is huey.contrib.djhuey in INSTALLED_APPS?)"
        ) from None


def later(name: str, **kwargs: Any) -> None:
    """Queue task `name` once the current transaction commits (at once outside of one)."""
    task = _task(name)
    transaction.on_commit(lambda: task(**kwargs))


def schedule(name: str, *, delay: float, **kwargs: Any) -> None:
    """Queue task `name` to run in `delay` seconds (a retry: never slept for on a worker)."""
    _task(name).schedule(kwargs=kwargs, delay=delay)


def enqueue(run_id: int) -> None:
    """Queue a slice of the run once the current transaction commits."""
    Run.objects.filter(pk=run_id).update(enqueued_at=timezone.now())
    later("run_slice", run_id=run_id)


def body(name: str) -> Callable[..., Any]:
    """The plain function of task `name`, for running one in-process (tests, tools)."""
    return _task(name).func.__wrapped__
