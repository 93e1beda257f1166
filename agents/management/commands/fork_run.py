from __future__ import annotations

import json

from agents import checkpoints
from agents.management.base import RunCommand, acting, fail, get_run, id_arg
from agents.services import RunError


class Command(RunCommand):
    help = "Fork a new run from a checkpoint; the original run is untouched."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--from",
            dest="checkpoint",
            type=id_arg,
            required=True,
            metavar="N",
            help="the checkpoint's number in the run (show_run lists them)",
        )
        parser.add_argument("--goal", help="a new goal (default: the same)")
        parser.add_argument("--note", default="")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        user, actor = acting(o["user"])
        try:
            origin = checkpoints.by_number(run.pk, o["checkpoint"])
            new = checkpoints.fork(
                run.pk,
                origin.pk,
                actor=actor,
                created_by=user or run.created_by,
                goal=o["goal"],
                note=o["note"],
            )
        except (checkpoints.CheckpointError, RunError) as e:
            raise fail(str(e)) from None
        if o["json"]:
            self.stdout.write(
                json.dumps({"id": new.pk, "forked_from": o["checkpoint"], "status": new.status})
            )
        else:
            self.stdout.write(str(new.pk))
