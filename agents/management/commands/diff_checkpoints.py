from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from agents import checkpoints, inputs
from agents.management.base import fail
from agents.models import Checkpoint
from agents.snapshots import display


def _get(cp_id: str) -> Checkpoint:
    try:
        pk = inputs.object_id(cp_id, what="a checkpoint id")
        return Checkpoint.objects.select_related("run").get(pk=pk)
    except (inputs.InputError, Checkpoint.DoesNotExist):
        raise fail(f"no checkpoint {cp_id!r}") from None


class Command(BaseCommand):
    help = "What changed between two checkpoints (B may be `live`: the run's workspace now)."

    def add_arguments(self, parser):
        parser.add_argument("a", metavar="A")
        parser.add_argument("b", metavar="B|live")
        parser.add_argument("--stat", action="store_true", help="only the list of files")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        a = _get(o["a"])
        b = None if o["b"] == "live" else _get(o["b"])
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
