"""Schedules: a new run from a template run at each tick of a cron expression, and the pass that
fires due ticks and wakes paused runs whose wake-up time has come.

Cron expressions are read by cronsim (five fields, minute resolution, Debian cron's day rules and
DST handling) in the schedule's IANA time zone (zoneinfo); times are stored in UTC.

Firing (`tick`, called by the embedded `serve` every few seconds and by workers once a minute):
each due schedule is claimed with a conditional UPDATE of its `next_at` (the value read must
still be there), so two processes never fire one tick twice. Rules, stated once:

- misfire: after downtime, the schedule fires ONCE, for the latest tick missed, and the tick's
  event records how many earlier ticks were skipped (`missed`); `next_at` moves to the first tick
  after now.
- overlap: `skip` (default) records a skipped tick while the schedule's previous run is still
  live; `queue` makes the run anyway (it waits for a worker like any other).
- paused: a paused schedule fires nothing; resuming it sets `next_at` to the first tick after
  now (ticks missed while paused are not made up).
"""

from __future__ import annotations

import logging
import zoneinfo
from datetime import datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from django.db import transaction
from django.utils import timezone

from agents import eventlog, inputs, services
from agents.models import (
    LIVE_STATUSES,
    EventKind,
    Overlap,
    Run,
    RunStatus,
    Schedule,
    ScheduleEvent,
    ScheduleEventKind,
)
from agents.runspec import RunSpec

log = logging.getLogger(__name__)

# Ticks counted one by one when a schedule missed many (a minute's cron down for a week): past
# this, the count says "at least".
MAX_COUNTED = 10_000
ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


class ScheduleError(inputs.InputError):
    """Bad input for a schedule or trigger: the message says what to change."""


# --- cron ------------------------------------------------------------------------------------
def zone(name: str) -> zoneinfo.ZoneInfo:
    name = str(name or "").strip()
    try:
        if not name or len(name) > 64:
            raise ValueError
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name such as UTC or Europe/Paris", "timezone"
        ) from None


def clean_cron(expr: str) -> str:
    """The expression as stored: five fields (or an @alias), checked by cronsim."""
    expr = " ".join(str(expr or "").split())
    if not expr:
        raise ScheduleError("a schedule needs a cron expression, e.g. '0 9 * * MON-FRI'", "cron")
    if len(expr) > 200:
        raise ScheduleError("the cron expression is too long", "cron")
    fields = ALIASES.get(expr.lower(), expr)
    if len(fields.split()) != 5:
        raise ScheduleError(
            f"cron {expr!r}: expected five fields (minute hour day month weekday) "
            "or @hourly/@daily/@weekly/@monthly/@yearly",
            "cron",
        )
    try:
        next(CronSim(fields, datetime(2000, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC"))))
    except CronSimError as e:
        raise ScheduleError(f"cron {expr!r}: {str(e).lower()}", "cron") from None
    except StopIteration:
        raise ScheduleError(f"cron {expr!r} never fires", "cron") from None
    return expr


def next_tick(expr: str, tz: str, after: datetime) -> datetime | None:
    """The first tick strictly after `after`, in UTC (None: it never fires again)."""
    fields = ALIASES.get(expr.lower(), expr)
    try:
        found = next(CronSim(fields, after.astimezone(zone(tz))))
    except (CronSimError, StopIteration):
        return None
    return found.astimezone(zoneinfo.ZoneInfo("UTC"))


def due_ticks(schedule: Schedule, now: datetime) -> tuple[datetime, int, datetime | None]:
    """(the latest due tick, how many earlier ones were missed, the next tick after now)."""
    latest, missed = schedule.next_at, 0
    following = next_tick(schedule.cron, schedule.timezone, latest)
    while following is not None and following <= now:
        latest, missed = following, missed + 1
        if missed >= MAX_COUNTED:  # jump: the latest tick at or before now
            latest = _latest_at_or_before(schedule, now) or latest
            following = next_tick(schedule.cron, schedule.timezone, latest)
            break
        following = next_tick(schedule.cron, schedule.timezone, latest)
    return latest, missed, following


def _latest_at_or_before(schedule: Schedule, now: datetime) -> datetime | None:
    fields = ALIASES.get(schedule.cron.lower(), schedule.cron)
    try:
        # Reversed, cronsim steps back before it matches: start a second later to include now.
        start = now.replace(microsecond=0) + timedelta(seconds=1)
        at = next(CronSim(fields, start.astimezone(zone(schedule.timezone)), reverse=True))
    except (CronSimError, StopIteration):
        return None
    return at.astimezone(zoneinfo.ZoneInfo("UTC"))


# --- people's actions ------------------------------------------------------------------------
def record(schedule_id: int, kind: str, payload: dict[str, Any], *, actor: str) -> ScheduleEvent:
    return ScheduleEvent.objects.create(
        schedule_id=schedule_id, kind=kind, payload=payload, actor=actor
    )


def create(
    template: Run,
    cron: str,
    *,
    tz: str = "UTC",
    overlap: str = Overlap.SKIP,
    created_by=None,
    actor: str,
    now: datetime | None = None,
) -> Schedule:
    cron = clean_cron(cron)
    zone(tz)
    if overlap not in Overlap.values:
        raise ScheduleError(f"overlap must be skip or queue, not {overlap!r}", "overlap")
    now = now or timezone.now()
    with transaction.atomic():
        schedule = Schedule.objects.create(
            template=template,
            cron=cron,
            timezone=tz.strip(),
            overlap=overlap,
            created_by=created_by,
            next_at=next_tick(cron, tz, now),
        )
        record(
            schedule.pk,
            ScheduleEventKind.CREATED,
            {"template": template.pk, "cron": cron, "timezone": tz, "overlap": overlap},
            actor=actor,
        )
    return schedule


def get(schedule_id: Any) -> Schedule:
    try:
        return Schedule.objects.select_related("template").get(
            pk=inputs.object_id(schedule_id, what="a schedule id")
        )
    except (Schedule.DoesNotExist, inputs.InputError):
        raise ScheduleError(f"no schedule with id {schedule_id}") from None


def pause(schedule_id: int, *, actor: str) -> Schedule:
    with transaction.atomic():
        if not Schedule.objects.filter(pk=schedule_id, paused=False).update(paused=True):
            get(schedule_id)
            raise ScheduleError(f"schedule {schedule_id} is already paused")
        record(schedule_id, ScheduleEventKind.PAUSED, {}, actor=actor)
    return get(schedule_id)


def resume(schedule_id: int, *, actor: str, now: datetime | None = None) -> Schedule:
    schedule = get(schedule_id)
    now = now or timezone.now()
    upcoming = next_tick(schedule.cron, schedule.timezone, now)
    with transaction.atomic():
        if not Schedule.objects.filter(pk=schedule_id, paused=True).update(
            paused=False, next_at=upcoming
        ):
            raise ScheduleError(f"schedule {schedule_id} is not paused")
        record(
            schedule_id,
            ScheduleEventKind.RESUMED,
            {"next_at": upcoming.isoformat() if upcoming else None},
            actor=actor,
        )
    return get(schedule_id)


def delete(schedule_id: int) -> None:
    """The schedule and its history go; the runs it made stay (their `schedule` becomes empty,
    their run.created event still names it)."""
    get(schedule_id).delete()


# --- a run from a template -------------------------------------------------------------------
def workspace_source(template: Run) -> str | None:
    """The folder the template run's workspace was copied from, as its run.created names it."""
    created = template.events.filter(kind=EventKind.RUN_CREATED).order_by("seq").first()
    return (created.payload or {}).get("workspace_from") if created else None


def run_from_template(
    template: Run, *, goal: str | None = None, actor: str, created_by=None, **origin: Any
) -> Run:
    """A new run with the template's goal (or `goal`), checks, policy, budgets, limits, script
    and workspace source, the way a fork copies a run's fields; `origin` (schedule=…, or
    trigger=…) is set on the run and named in its run.created event."""
    spec = RunSpec.of(template, workspace_from=workspace_source(template))
    run = services.create_run(
        spec if goal is None else spec.replace(goal=goal),
        created_by=created_by,
        actor=actor,
        origin={"template": template.pk, **{k: v.pk for k, v in origin.items()}},
    )
    Run.objects.filter(pk=run.pk).update(**origin)
    for name, value in origin.items():
        setattr(run, name, value)
    return run


# --- the pass: due ticks and wake-ups --------------------------------------------------------
def tick(now: datetime | None = None) -> dict[str, list[int]]:
    """Fire every due schedule once and wake every paused run whose time has come."""
    now = now or timezone.now()
    fired = []
    due = Schedule.objects.filter(paused=False, next_at__lte=now).values_list("pk", flat=True)
    for schedule_id in list(due):
        if fire(schedule_id, now) is not None:
            fired.append(schedule_id)
    return {"fired": fired, "woken": wake_due(now)}


def fire(schedule_id: int, now: datetime) -> ScheduleEvent | None:
    """Claim this schedule's due tick and act on it; None when another process claimed it (or
    it is not due, or paused)."""
    schedule = (
        Schedule.objects.select_related("template", "created_by").filter(pk=schedule_id).first()
    )
    if schedule is None or schedule.paused or schedule.next_at is None or schedule.next_at > now:
        return None
    at, missed, following = due_ticks(schedule, now)
    with transaction.atomic():
        claimed = Schedule.objects.filter(
            pk=schedule.pk, paused=False, next_at=schedule.next_at
        ).update(next_at=following, last_tick_at=at)
        if not claimed:
            return None
        payload: dict[str, Any] = {"tick": at.isoformat(), "missed": missed}
        if missed >= MAX_COUNTED:
            payload["missed_at_least"] = True
        live = Run.objects.filter(schedule=schedule, status__in=LIVE_STATUSES)
        previous = live.order_by("-pk").values_list("pk", flat=True).first()
        if schedule.overlap == Overlap.SKIP and previous is not None:
            payload.update(reason=f"run {previous} of this schedule is still live", run=previous)
            return record(schedule.pk, ScheduleEventKind.TICK_SKIPPED, payload, actor="scheduler")
        try:
            with transaction.atomic():
                run = run_from_template(
                    schedule.template,
                    actor=f"schedule:{schedule.pk}",
                    created_by=schedule.created_by,
                    schedule=schedule,
                )
        except Exception as e:  # the tick is recorded as failed; the next one tries again
            if not isinstance(e, services.RunError):
                log.exception("schedule %s: the tick at %s failed", schedule.pk, at)
            payload["error"] = str(e)[:1000]
            return record(schedule.pk, ScheduleEventKind.TICK_FAILED, payload, actor="scheduler")
        payload["run"] = run.pk
        return record(schedule.pk, ScheduleEventKind.TICK_FIRED, payload, actor="scheduler")


def wake_due(now: datetime) -> list[int]:
    """Resume the paused runs whose wake-up time has come (a wake-up is cleared either way: a
    run no longer paused has nothing to wake from)."""
    woken = []
    for run_id, status in Run.objects.filter(wake_at__lte=now).values_list("pk", "status"):
        # Claimed like a tick: only the process that clears this wake-up acts on it.
        if not Run.objects.filter(pk=run_id, wake_at__lte=now).update(wake_at=None):
            continue
        if status != RunStatus.PAUSED:
            continue
        try:
            services.resume_run(run_id, actor="scheduler:wake")
        except services.RunError as e:
            eventlog.append(
                run_id,
                EventKind.ERROR,
                {"source": "wake", "message": f"the wake-up could not resume the run: {e}"},
                actor="scheduler:wake",
            )
            continue
        woken.append(run_id)
    return woken
