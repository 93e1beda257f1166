from __future__ import annotations

import json

from django.db.models import Q
from django.utils.dateparse import parse_datetime
from django.utils.timezone import is_naive, make_aware

from agents.events import summary
from agents.management.base import BaseCommand, fail, id_arg
from agents.models import Event


class Command(BaseCommand):
    help = "What people did: decisions, edits, notes, pause/resume/cancel, rewinds, policy changes."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=id_arg, metavar="ID")
        parser.add_argument("--since", metavar="TIME", help="ISO time, e.g. 2026-12-01T09:00")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        events = Event.objects.filter(Q(actor__startswith="user:") | Q(actor__startswith="cli:"))
        if o["run"]:
            events = events.filter(run_id=o["run"])
        if o["since"]:
            since = parse_datetime(o["since"])
            if since is None:
                raise fail(
                    f"--since {o['since']!r} is not a time (use ISO 8601, e.g. 2026-12-01T09:00)"
                )
            events = events.filter(created_at__gte=make_aware(since) if is_naive(since) else since)
        for event in events.order_by("created_at", "run_id", "seq").iterator(chunk_size=500):
            if o["json"]:
                self.stdout.write(
                    json.dumps(
                        {
                            "run": event.run_id,
                            "seq": event.seq,
                            "at": event.created_at.isoformat(),
                            "actor": event.actor,
                            "kind": event.kind,
                            "payload": event.payload,
                        }
                    )
                )
            else:
                when = event.created_at.strftime("%Y-%m-%d %H:%M:%S")
                self.stdout.write(
                    f"{when} run {event.run_id} #{event.seq} {event.actor} {event.kind}: "
                    f"{summary(event.kind, event.payload)}"
                )
