"""huey tasks: thin wrappers around the runtime and the reaper."""

from __future__ import annotations

from django.conf import settings
from huey import crontab
from huey.contrib.djhuey import db_periodic_task, db_task

from agents import notifications, reaper
from agents.runtime.loop import drive


@db_task()
def run_slice(*, run_id: int) -> str:
    return str(drive(run_id))


@db_task()
def deliver_webhook(*, run_id: int, url: str, payload: dict, attempt: int = 1) -> bool:
    # One attempt per execution: a retry is scheduled, never slept for on a worker thread.
    return notifications.deliver(run_id, url, payload, attempt=attempt)


@db_periodic_task(crontab(minute="*"))
def reap_runs() -> list[int]:
    # The embedded `serve` also reaps every few seconds; this covers plain `run_huey` workers.
    return reaper.reap() if settings.SHIFTLOG["REAPER_INTERVAL_SECONDS"] else []
