from __future__ import annotations

from agents.management.base import acting, fail, get_run, id_arg
from agents.management.schedule_base import ScheduleCommand, when
from agents.models import Overlap
from agents.schedules import cron as schedules


class Command(ScheduleCommand):
    help = (
        "Make a new run from a run (its goal, checks, policy, budgets, script and workspace "
        "source) at each tick of a cron expression. The schedule's id is the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("--from-run", type=id_arg, required=True, metavar="ID")
        parser.add_argument("--cron", required=True, metavar="EXPR", help="e.g. '0 9 * * MON-FRI'")
        parser.add_argument("--timezone", default="UTC", metavar="TZ", help="IANA name (UTC)")
        parser.add_argument(
            "--overlap",
            choices=Overlap.values,
            default=Overlap.SKIP,
            help="while the previous run is live: skip the tick (default) or queue a run anyway",
        )
        parser.add_argument("--user", help="act as this user (the runs are theirs)")

    def handle(self, *args, **o):
        template = get_run(o["from_run"])
        user, actor = acting(o["user"])
        if user is not None and not (
            template.created_by_id == user.pk or user.has_perm("agents.control_run")
        ):
            raise fail(f"{user.get_username()} may not control run {template.pk}")
        schedule = schedules.create(
            template,
            o["cron"],
            tz=o["timezone"],
            overlap=o["overlap"],
            created_by=user or template.created_by,
            actor=actor,
        )
        self.stdout.write(f"next tick: {when(schedule.next_at, schedule.timezone)}")
        self.stdout.write(str(schedule.pk))
