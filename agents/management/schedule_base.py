"""Shared pieces of the schedule and trigger commands."""

from __future__ import annotations

from datetime import datetime

from agents import inputs
from agents.management.base import BaseCommand, fail
from agents.schedules import cron as schedules


def when(at: datetime | None, tz: str = "UTC") -> str:
    """A tick in the schedule's own zone, with UTC beside it when that differs."""
    if at is None:
        return "never"
    local = at.astimezone(schedules.zone(tz))
    shown = local.isoformat(timespec="minutes")
    return shown if tz == "UTC" else f"{shown} ({tz})"


class ScheduleCommand(BaseCommand):
    """A schedule or trigger command: bad input becomes a clean exit 2."""

    # A quick act on one row: Django's system checks (URLs, admin, templates) would double the
    # command's start-up; `manage.py check` and every server's start run them.
    requires_system_checks: list[str] = []

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except inputs.InputError as e:
            raise fail(str(e)) from None
