from __future__ import annotations

import json
from pathlib import Path

from agents import inputs
from agents.management.base import RunCommand, acting, fail, get_run
from agents.services import RunError, set_policy


class Command(RunCommand):
    help = "Show or replace a run's tool policy (JSON rules); a change is recorded as an event."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--rules",
            metavar="JSON",
            help='e.g. \'[{"tool": "bash", "pattern": "^pip ", "action": "allow"}]\'',
        )
        source.add_argument("--file", metavar="FILE")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        if o["rules"] is None and o["file"] is None:
            self.stdout.write(json.dumps(run.tool_policy, indent=2))
            return
        _, actor = acting(o["user"])
        try:
            text = Path(o["file"]).read_text() if o["file"] else o["rules"]
            rules = inputs.load_json(text, what="the rules")
        except OSError as e:
            raise fail(f"cannot read {o['file']}: {e.strerror}") from None
        except inputs.InputError as e:
            raise fail(str(e)) from None
        try:
            rules = set_policy(run.pk, rules, actor=actor, because="set from the command line")
        except RunError as e:
            raise fail(str(e)) from None
        self.stdout.write(f"run {run.pk}: {len(rules)} rule(s) set")
