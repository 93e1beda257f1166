from __future__ import annotations

from agents.management.base import id_arg
from agents.management.schedule_base import ScheduleCommand
from agents.schedules import triggers


class Command(ScheduleCommand):
    help = "Revoke a trigger: its URL answers 404 from now on."

    def add_arguments(self, parser):
        parser.add_argument("trigger_id", type=id_arg, metavar="ID")

    def handle(self, *args, **o):
        trigger = triggers.revoke(o["trigger_id"])
        self.stdout.write(f"trigger {trigger.pk}: revoked")
