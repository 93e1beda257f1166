from __future__ import annotations

import json

from agents.management.schedule_base import ScheduleCommand, when
from agents.models import Run, Schedule


class Command(ScheduleCommand):
    help = "List the schedules with their next tick."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        rows = []
        for s in Schedule.objects.select_related("created_by").order_by("pk"):
            last = Run.objects.filter(schedule=s).order_by("-pk").values_list("pk", flat=True)
            rows.append(
                {
                    "id": s.pk,
                    "template": s.template_id,
                    "cron": s.cron,
                    "timezone": s.timezone,
                    "overlap": s.overlap,
                    "paused": s.paused,
                    "next_at": None if s.paused or not s.next_at else s.next_at.isoformat(),
                    "last_tick_at": s.last_tick_at.isoformat() if s.last_tick_at else None,
                    "last_run": last.first(),
                    "owner": s.created_by.get_username() if s.created_by else None,
                    "_next": "paused" if s.paused else when(s.next_at, s.timezone),
                }
            )
        if o["json"]:
            for row in rows:
                row.pop("_next")
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no schedules")
            return
        for r in rows:
            self.stdout.write(
                f"{r['id']:>4}  run {r['template']:<5} {r['cron']:<18} {r['overlap']:<5} "
                f"next: {r['_next']}"
            )
