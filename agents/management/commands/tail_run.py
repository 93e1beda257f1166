from __future__ import annotations

import argparse
import json
import time

from agents.eventlog import describe
from agents.lifecycle import TERMINAL
from agents.management.base import RunCommand, fail, get_run, id_arg, seq_arg
from agents.models import Event, Run


class Command(RunCommand):
    help = "Print a run's events, one a line; --follow keeps printing until the run is over."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="ID")
        parser.add_argument(
            "--after", type=seq_arg, default=0, metavar="SEQ", help="only events after this seq"
        )
        parser.add_argument("--follow", "-f", action="store_true")
        parser.add_argument("--json", action="store_true", help="one JSON object a line")
        parser.add_argument("--interval", type=float, default=0.5, help=argparse_hidden())

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        after = o["after"]
        if after < 0:
            raise fail("--after must be 0 or more")
        try:
            while True:
                for event in Event.objects.for_run(run.pk, after=after).iterator(chunk_size=500):
                    self.stdout.write(self.format(event, o["json"]))
                    after = event.seq
                self.stdout.flush()
                if not o["follow"]:
                    return
                status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
                if status in TERMINAL and not Event.objects.for_run(run.pk, after=after).exists():
                    return
                time.sleep(o["interval"])
        except KeyboardInterrupt:
            return

    @staticmethod
    def format(event: Event, as_json: bool) -> str:
        if as_json:
            return json.dumps(
                {
                    "seq": event.seq,
                    "kind": event.kind,
                    "session": event.session_id,
                    "actor": event.actor,
                    "created_at": event.created_at.isoformat(),
                    "payload": event.payload,
                }
            )
        when = event.created_at.strftime("%H:%M:%S")
        return f"#{event.seq:<5} {when} {event.kind:<17} {describe(event.kind, event.payload)}"


def argparse_hidden():
    return argparse.SUPPRESS
