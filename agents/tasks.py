"""huey tasks: the leaves of the house.

Everything else imports the tasks at module level (`from agents.tasks import enqueue`) and
triggers them after its transaction commits; a task imports the module that does its work
inside its body. Those bodies are the one place in agents/ where imports are deferred, on
purpose: it is what keeps every other import one-way (the runtime imports the services that
queue its next slice; the tasks import the runtime only when they run).

huey gives no acknowledgements (a task whose worker dies is lost), so the database is the truth:
`enqueue` records when it queued a run, and the reaper queues again what was lost.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from huey import crontab
from huey.contrib.djhuey import db_periodic_task, db_task

from agents.models import Run


def enqueue(run_id: int) -> None:
    """Queue a slice of the run once the current transaction commits."""
    Run.objects.filter(pk=run_id).update(enqueued_at=timezone.now())
    transaction.on_commit(lambda: run_slice(run_id=run_id))


@db_task()
def run_slice(*, run_id: int) -> str:
    from agents.runtime.loop import drive

    return str(drive(run_id))


@db_task()
def deliver_webhook(*, run_id: int, url: str, payload: dict, attempt: int = 1) -> bool:
    # One attempt per execution: a retry is scheduled, never slept for on a worker thread.
    from agents import notifications

    return notifications.deliver(run_id, url, payload, attempt=attempt)


@db_periodic_task(crontab(minute="*"))
def reap_runs() -> list[int]:
    # The embedded `serve` also reaps every few seconds; this covers plain `run_huey` workers.
    from agents import reaper

    return reaper.reap() if settings.SHIFTLOG["REAPER_INTERVAL_SECONDS"] else []
