from __future__ import annotations

from agents.management.base import RunCommand, acting
from agents.services import cancel_run


class Command(RunCommand):
    help = "Cancel a run; a running tool is stopped."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--reason", default="")

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        run = cancel_run(o["run_id"], actor=actor, reason=o["reason"])
        self.stdout.write(f"run {run.pk}: {run.status}")
