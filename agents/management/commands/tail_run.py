from __future__ import annotations

import argparse
import json
import time

from agents.events import KINDS, summary
from agents.lifecycle import TERMINAL
from agents.management.base import RunCommand, fail, get_run, id_arg, seq_arg
from agents.models import Event, Run, Session


class Command(RunCommand):
    help = (
        "Print a run's events, one a line, optionally only some (--kind, --tool, --grep, "
        "--errors, --session); --follow keeps printing until the run is over."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="ID")
        parser.add_argument(
            "--after", type=seq_arg, default=0, metavar="SEQ", help="only events after this seq"
        )
        parser.add_argument("--follow", "-f", action="store_true")
        parser.add_argument("--kind", choices=sorted(KINDS), help="only events of this kind")
        parser.add_argument("--tool", help="only calls and results of this tool")
        parser.add_argument("--grep", metavar="TEXT", help="only events holding TEXT (any case)")
        parser.add_argument("--errors", action="store_true", help="only failures")
        parser.add_argument("--session", type=id_arg, metavar="N", help="only session N")
        parser.add_argument("--json", action="store_true", help="one JSON object a line")
        parser.add_argument("--interval", type=float, default=0.5, help=argparse_hidden())

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        after = o["after"]
        if after < 0:
            raise fail("--after must be 0 or more")
        session_id = None
        if o["session"] is not None:
            session_id = (
                Session.objects.filter(run=run, index=o["session"])
                .values_list("pk", flat=True)
                .first()
            )
            if session_id is None:
                raise fail(f"run {run.pk} has no session {o['session']}")
        if o["grep"] is not None and ("\x00" in o["grep"] or len(o["grep"]) > 200):
            raise fail("--grep takes up to 200 characters, no NUL")
        filters = {
            "kind": o["kind"] or "",
            "tool": o["tool"] or "",
            "text": o["grep"] or "",
            "errors": o["errors"],
            "session_id": session_id,
        }
        try:
            while True:
                # Up to the newest seq now: a filter skips events, and none is read twice.
                upto = Run.objects.filter(pk=run.pk).values_list("last_seq", flat=True).get()
                events = (
                    Event.objects.for_run(run.pk, after=after)
                    .filter(seq__lte=upto)
                    .matching(**filters)
                    .select_related("session")
                )
                for event in events.iterator(chunk_size=500):
                    self.stdout.write(self.format(event, o["json"]))
                after = max(after, upto)
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
                    # The session's number in the run, as the API and show_run give it.
                    "session": event.session.index if event.session_id else None,
                    "actor": event.actor,
                    "created_at": event.created_at.isoformat(),
                    "payload": event.payload,
                }
            )
        when = event.created_at.strftime("%H:%M:%S")
        return f"#{event.seq:<5} {when} {event.kind:<17} {summary(event.kind, event.payload)}"


def argparse_hidden():
    return argparse.SUPPRESS
