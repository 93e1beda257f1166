from __future__ import annotations

import json

from agents import memory
from agents.management.base import RunCommand, get_run


class Command(RunCommand):
    help = (
        "A run's memory: what it learned (run memory, on its live branch) and what its project "
        "shares, pinned first, then the most recalled, then the newest."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        entries = memory.ranked(memory.entries(run))
        if o["json"]:
            data = {"run": run.pk, "project": run.project, "entries": []}
            data["entries"] = [e.as_json() for e in entries]
            self.stdout.write(json.dumps(data, indent=2))
            return
        project = f" (project {run.project})" if run.project else ""
        self.stdout.write(f"Memory of run {run.pk}{project}: {len(entries)} entries")
        for e in entries:
            pin = ", pinned" if e.pinned else ""
            used = f", recalled {e.uses}x" if e.uses else ""
            self.stdout.write(f"  [{e.scope}{pin}{used}] {e.key}: {e.text}")
            if e.by:
                self.stdout.write(f"      last changed by {e.by}")
