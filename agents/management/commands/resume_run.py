from __future__ import annotations

from agents.management.base import RunCommand, acting
from agents.services import Budgets, resume_run


class Command(RunCommand):
    help = "Resume a paused run, optionally raising its budgets."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--max-sessions", type=int)
        parser.add_argument("--max-cost", metavar="USD")
        parser.add_argument("--max-tokens", type=int)
        parser.add_argument("--max-wall-seconds", type=int)

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        budgets = Budgets(
            max_sessions=o["max_sessions"],
            max_tokens=o["max_tokens"],
            max_cost_usd=o["max_cost"],
            max_wall_seconds=o["max_wall_seconds"],
        )
        run = resume_run(o["run_id"], actor=actor, budgets=budgets)
        self.stdout.write(f"run {run.pk}: {run.status}")
