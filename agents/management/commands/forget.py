from __future__ import annotations

from agents import memory
from agents.management.base import RunCommand, acting, get_run


class Command(RunCommand):
    help = "Delete an entry of a run's memory (or, with --project, of its project's): an event."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("key")
        parser.add_argument("--project", action="store_true", help="the project's memory")

    def handle(self, *args, **o):
        get_run(o["run_id"])
        _, actor = acting(o["user"])
        scope = memory.PROJECT if o["project"] else memory.RUN
        memory.delete_entry(o["run_id"], o["key"], scope=scope, actor=actor)
        self.stdout.write(f"{scope} memory of run {o['run_id']}: {o['key']!r} deleted")
