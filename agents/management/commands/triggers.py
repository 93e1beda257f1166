from __future__ import annotations

import json

from agents.management.schedule_base import ScheduleCommand
from agents.models import Trigger


class Command(ScheduleCommand):
    help = "List the triggers (their tokens are never shown again: only their first letters)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        rows = [
            {
                "id": t.pk,
                "template": t.template_id,
                "token_prefix": t.token_prefix,
                "signed": bool(t.secret),
                "revoked": t.revoked_at is not None,
                "last_delivery_at": t.last_delivery_at.isoformat() if t.last_delivery_at else None,
                "runs": t.runs.count(),
            }
            for t in Trigger.objects.order_by("pk")
        ]
        if o["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
        elif not rows:
            self.stdout.write("no triggers")
        for r in [] if o["json"] else rows:
            state = "revoked" if r["revoked"] else "signed" if r["signed"] else "token only"
            self.stdout.write(
                f"{r['id']:>4}  run {r['template']:<5} /hooks/{r['token_prefix']}…  {state:<10} "
                f"runs: {r['runs']}"
            )
