"""huey tasks: thin wrappers around the work, on the top floor of the house.

Nothing imports this module: huey loads it (djhuey imports every app's `tasks` module when it
starts), and the tasks register themselves with agents.jobs, through which everything else queues
them by name. So the tasks import their work at the top like any other module, and imports run one
way.
"""

from __future__ import annotations

from django.conf import settings
from huey import crontab
from huey.contrib.djhuey import db_periodic_task, db_task

from agents import jobs, mail, notifications, reaper, rewinds, slack, telemetry
from agents.runtime.external_finish import run_finish
from agents.runtime.loop import drive
from agents.schedules import cron as schedules


@db_task()
def run_slice(*, run_id: int) -> str:
    return str(drive(run_id))


@db_task()
def rewind_run(
    *,
    run_id: int,
    checkpoint_id: int,
    actor: str,
    note: str,
    until: float,
    request_seq: int | None = None,
) -> bool:
    return rewinds.run_task(
        run_id=run_id,
        checkpoint_id=checkpoint_id,
        actor=actor,
        note=note,
        until=until,
        request_seq=request_seq,
    )


@db_task()
def external_finish(*, run_id: int, call_id: str, actor: str, agent: str) -> bool:
    # An external agent's finish: the checks run here, not in the web request (a long one).
    return run_finish(run_id=run_id, call_id=call_id, actor=actor, agent=agent)


@db_task()
def deliver_webhook(
    *,
    delivery_id: int | None = None,
    run_id: int | None = None,
    url: str = "",
    payload: dict | None = None,
    attempt: int = 1,
) -> bool:
    # One attempt per execution: a retry is scheduled, never slept for on a worker thread.
    if delivery_id is None:  # queued before the delivery rows: its kwargs carry the POST
        return notifications.deliver_legacy(run_id, url, payload or {}, attempt)
    return notifications.deliver(delivery_id)


@db_task()
def slack_post(*, message_id: int) -> str:
    # One attempt per execution: a retry is scheduled with backoff (agents/slack.py).
    return slack.deliver(message_id)


@db_task()
def slack_tell(*, channel: str, user: str, text: str) -> bool:
    return slack.tell(channel=channel, user=user, text=text)


@db_task()
def mail_approvals(*, approval_ids: list[int]) -> int:
    return mail.mail_approvals(approval_ids)


@db_task()
def mail_digest(*, user_id: int) -> int:
    return mail.mail_digest(user_id)


@db_task()
def mail_run_ended(*, run_id: int) -> int:
    return mail.mail_run_ended(run_id)


@db_task()
def export_trace(*, run_id: int) -> int | None:
    # The parts of the run's trace that are due (ended sessions; the run's own once it ended).
    # One attempt: a collector that is down costs a warning in the log, not a retry loop here
    # (the exporter retries briefly itself); the parts it did not take go with the next export.
    return telemetry.export_due(run_id)


@db_periodic_task(crontab(minute="*"))
def reap_runs() -> list[int]:
    # The embedded `serve` also reaps every few seconds; this covers plain `run_huey` workers.
    return reaper.reap() if settings.SHIFTLOG["REAPER_INTERVAL_SECONDS"] else []


@db_periodic_task(crontab(minute="*"))
def fire_schedules() -> dict:
    # Due schedule ticks and wake-ups; the embedded `serve` also runs this every few seconds.
    # Each tick is claimed by a conditional UPDATE, so any number of processes may call it.
    return schedules.tick()


jobs.register(
    run_slice=run_slice,
    rewind_run=rewind_run,
    external_finish=external_finish,
    deliver_webhook=deliver_webhook,
    export_trace=export_trace,
    slack_post=slack_post,
    slack_tell=slack_tell,
    mail_approvals=mail_approvals,
    mail_digest=mail_digest,
    mail_run_ended=mail_run_ended,
)
