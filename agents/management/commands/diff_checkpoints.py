from __future__ import annotations

import json

from agents import checkpoints
from agents.management.base import BaseCommand, get_run, id_arg, named_checkpoint
from agents.snapshots import display


class Command(BaseCommand):
    help = (
        "What changed between two checkpoints of a run, named by their numbers in it (B may be "
        "`live`: the workspace now; either may be RUN:N, a checkpoint of another run)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="RUN")
        parser.add_argument("a", metavar="A")
        parser.add_argument("b", metavar="B|live")
        parser.add_argument("--stat", action="store_true", help="only the list of files")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        a = named_checkpoint(run.pk, o["a"])
        b = None if o["b"] == "live" else named_checkpoint(run.pk, o["b"])
        changes = checkpoints.diff(a, b)
        if o["json"]:
            self.stdout.write(json.dumps([c.__dict__ for c in changes], indent=2, default=str))
            return
        if not changes:
            self.stdout.write("no changes")
        for c in changes:
            size = f"{c.old_size if c.old_size is not None else '-'} → {c.new_size if c.new_size is not None else '-'} bytes"
            self.stdout.write(f"{c.status:<12} {display(c.path)}  ({size})")
            if o["stat"]:
                continue
            if c.diff:
                self.stdout.write(c.diff.rstrip("\n"))
            elif c.binary:
                self.stdout.write(f"  binary: {c.old_hash or '-'} → {c.new_hash or '-'}")
            if c.note:
                self.stdout.write(f"  ({c.note})")
