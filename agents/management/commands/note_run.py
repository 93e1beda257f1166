from __future__ import annotations

from agents.management.base import RunCommand, acting
from agents.services import note_run


class Command(RunCommand):
    help = "Send a note to a live run's agent; it reads it at its next turn."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("text")

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        note_run(o["run_id"], o["text"], actor=actor)
        self.stdout.write(f"note added to run {o['run_id']}")
