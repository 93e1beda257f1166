"""Work for a worker to do later, queued by name once the current transaction commits.

The huey tasks (agents/tasks.py) register themselves here when huey loads them (djhuey imports
every app's tasks module at start-up, in the web, the CLI and the worker alike); everything else
queues them by name. So nothing imports the tasks module and the tasks import their work at the
top like any other module: imports run one way, the tasks on the top floor.

huey gives no acknowledgements (a task whose worker dies is lost), so the database is the truth:
`enqueue` records when it queued a run, and the reaper queues again what was lost. A queue that
cannot be reached (Redis restarting) loses nothing either: the commit stands, the failure is
logged, and a run slice that could not be queued is marked for the reaper's next pass.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from agents.models import Run

_tasks: dict[str, Any] = {}  # name -> huey task
log = logging.getLogger(__name__)


def _queue_errors() -> tuple[type[BaseException], ...]:
    """What a queue that cannot be reached raises: Redis's connection errors, SQLite's."""
    errors: list[type[BaseException]] = [sqlite3.OperationalError, ConnectionError, TimeoutError]
    try:
        import redis.exceptions  # noqa: PLC0415 (only with a Redis queue)

        errors += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:
        pass
    return tuple(errors)


QUEUE_ERRORS = _queue_errors()


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
    transaction.on_commit(lambda: send(name, task, kwargs))


def send(name: str, task: Any, kwargs: dict[str, Any]) -> bool:
    """Put the task on the queue; False (logged) when the queue cannot be reached."""
    if getattr(task.huey, "immediate", False):
        task(**kwargs)  # runs here: its own errors are not the queue's
        return True
    try:
        task(**kwargs)
    except QUEUE_ERRORS as e:
        log.warning(
            "could not queue %s %s: %s; the reaper will queue the work again", name, kwargs, e
        )
        if name == "run_slice":
            # No longer "queued a moment ago": the reaper's next pass takes it. With the
            # database down too, the reaper finds it after REQUEUE_AFTER_SECONDS.
            with contextlib.suppress(DatabaseError):
                Run.objects.filter(pk=kwargs["run_id"]).update(enqueued_at=None)
        return False
    return True


def queue_now(name: str, **kwargs: Any) -> bool:
    """Put task `name` on the queue at once (not after the transaction); False (logged) when
    the queue cannot be reached."""
    return send(name, _task(name), kwargs)


def schedule(name: str, *, delay: float, **kwargs: Any) -> None:
    """Queue task `name` to run in `delay` seconds (a retry: never slept for on a worker)."""
    try:
        _task(name).schedule(kwargs=kwargs, delay=delay)
    except QUEUE_ERRORS as e:
        log.warning("could not schedule %s %s: %s; the reaper will find it", name, kwargs, e)


def enqueue(run_id: int) -> None:
    """Queue a slice of the run once the current transaction commits."""
    Run.objects.filter(pk=run_id).update(enqueued_at=timezone.now())
    later("run_slice", run_id=run_id)


def body(name: str) -> Callable[..., Any]:
    """The plain function of task `name`, for running one in-process (tests, tools)."""
    return _task(name).func.__wrapped__
