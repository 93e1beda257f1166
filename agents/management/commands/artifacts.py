from __future__ import annotations

import json

from agents.management.base import RunCommand, get_run, id_arg


class Command(RunCommand):
    help = "List a run's artifacts: files, handoff notes and check reports."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="ID")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        rows = [
            {
                "id": a.pk,
                "name": a.name,
                "kind": a.kind,
                "size": a.size,
                "mime_type": a.mime_type,
                "session": a.session.index if a.session else None,
                "seq": a.seq,
                "blob": a.blob_hash,
            }
            for a in run.artifacts.select_related("session").order_by("seq", "pk")
        ]
        if o["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no artifacts")
        for r in rows:
            self.stdout.write(
                f"{r['id']:>5}  {r['kind']:<8} {r['size']:>9} B  #{r['seq']:<6} {r['name']}"
            )
