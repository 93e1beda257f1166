from __future__ import annotations

from agents import memory
from agents.management.base import RunCommand, acting, get_run


class Command(RunCommand):
    help = (
        "Add or change an entry of a run's memory (or, with --project, of its project's): an "
        "event naming you; the agent's next session is told what changed."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("key")
        parser.add_argument("text", nargs="?", help="the new text (omit to only pin or unpin)")
        parser.add_argument("--project", action="store_true", help="the project's memory")
        pin = parser.add_mutually_exclusive_group()
        pin.add_argument("--pin", action="store_true", help="always include it at wake-up")
        pin.add_argument("--unpin", action="store_true")
        parser.add_argument(
            "--promote", action="store_true", help="copy a run entry to the project's memory"
        )

    def handle(self, *args, **o):
        get_run(o["run_id"])
        _, actor = acting(o["user"])
        run_id, key = o["run_id"], o["key"]
        if o["promote"]:
            memory.promote(run_id, key, actor=actor)
            self.stdout.write(f"{key!r} promoted to the project's memory")
            return
        pinned = True if o["pin"] else False if o["unpin"] else None
        scope = memory.PROJECT if o["project"] else memory.RUN
        memory.set_entry(run_id, key, text=o["text"], pinned=pinned, scope=scope, actor=actor)
        self.stdout.write(f"{scope} memory of run {run_id}: {key!r} saved")
