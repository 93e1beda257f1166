from __future__ import annotations

from agents.management.base import acting, id_arg
from agents.management.schedule_base import ScheduleCommand
from agents.schedules import cron as schedules


class Command(ScheduleCommand):
    help = "Delete a schedule."

    def add_arguments(self, parser):
        parser.add_argument("schedule_id", type=id_arg, metavar="ID")
        parser.add_argument("--user", help="act as this user")

    def handle(self, *args, **o):
        acting(o["user"])  # an unknown user is refused
        schedules.delete(o["schedule_id"])
        self.stdout.write(f"schedule {o['schedule_id']}: deleted (its runs stay)")
