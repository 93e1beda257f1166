from __future__ import annotations

from agents.management.base import acting, id_arg
from agents.management.schedule_base import ScheduleCommand
from agents.schedules import cron as schedules


class Command(ScheduleCommand):
    help = "Pause a schedule."

    def add_arguments(self, parser):
        parser.add_argument("schedule_id", type=id_arg, metavar="ID")
        parser.add_argument("--user", help="act as this user (recorded in its history)")

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        schedule = schedules.pause(o["schedule_id"], actor=actor)
        self.stdout.write(f"schedule {schedule.pk}: paused")
