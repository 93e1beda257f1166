from __future__ import annotations

from agents.management.base import RunCommand, acting
from agents.services import pause_run


class Command(RunCommand):
    help = "Pause a run; a running step finishes first."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--reason", default="")

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        run = pause_run(o["run_id"], actor=actor, reason=o["reason"])
        self.stdout.write(f"run {run.pk}: {run.status}")
