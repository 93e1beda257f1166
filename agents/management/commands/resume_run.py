from __future__ import annotations

from datetime import datetime

from agents.management.base import RunCommand, acting, fail
from agents.services import Budgets, cancel_wake, resume_run, wake_at


class Command(RunCommand):
    help = (
        "Resume a paused run, optionally raising its budgets; or, with --at, have it resume at "
        "a later time (--cancel-wake takes that back)."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--max-sessions", type=int)
        parser.add_argument("--max-cost", metavar="USD")
        parser.add_argument("--max-tokens", type=int)
        parser.add_argument("--max-wall-seconds", type=int)
        parser.add_argument(
            "--at", metavar="ISO8601", help="resume then, e.g. 2026-05-01T09:00:00+02:00"
        )
        parser.add_argument("--cancel-wake", action="store_true", help="take back an --at")

    def handle(self, *args, **o):
        _, actor = acting(o["user"])
        budgets = Budgets(
            max_sessions=o["max_sessions"],
            max_tokens=o["max_tokens"],
            max_cost_usd=o["max_cost"],
            max_wall_seconds=o["max_wall_seconds"],
        )
        if o["cancel_wake"]:
            run = cancel_wake(o["run_id"], actor=actor)
            self.stdout.write(f"run {run.pk}: {run.status}, no wake-up")
            return
        if o["at"] is not None:
            if budgets.cleaned():
                raise fail("--at does not raise budgets: raise them when it wakes, or now")
            try:
                when = datetime.fromisoformat(o["at"].strip().replace("z", "Z"))
            except ValueError:
                raise fail(
                    f"--at {o['at']!r} is not an ISO 8601 time, e.g. 2026-05-01T09:00:00+00:00"
                ) from None
            run = wake_at(o["run_id"], when, actor=actor)
            self.stdout.write(f"run {run.pk}: {run.status}, wakes at {run.wake_at.isoformat()}")
            return
        run = resume_run(o["run_id"], actor=actor, budgets=budgets)
        self.stdout.write(f"run {run.pk}: {run.status}")
