from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from agents.approvals import ApprovalError, decide
from agents.management.base import acting, fail


class Command(BaseCommand):
    help = "Approve a waiting tool call, optionally with edited input, as a named user."

    def add_arguments(self, parser):
        parser.add_argument("approval_id", type=int, metavar="ID")
        parser.add_argument(
            "--user", required=True, help="who decides (needs agents.decide_approval)"
        )
        parser.add_argument(
            "--input",
            metavar="JSON",
            help="run this input instead (the edit is recorded as a diff)",
        )
        parser.add_argument("--comment", default="")
        parser.add_argument(
            "--allow-similar",
            action="store_true",
            help="also allow similar calls for the rest of the run",
        )

    def handle(self, *args, **o):
        user, _ = acting(o["user"])
        edited = None
        if o["input"] is not None:
            try:
                edited = json.loads(o["input"])
            except json.JSONDecodeError as e:
                raise fail(f"--input is not valid JSON: {e}") from None
            if not isinstance(edited, dict):
                raise fail('--input must be a JSON object, e.g. \'{"command": "ls"}\'')
        try:
            approval = decide(
                o["approval_id"],
                user=user,
                approve=True,
                edited_input=edited,
                comment=o["comment"],
                allow_similar=o["allow_similar"],
            )
        except ApprovalError as e:
            raise fail(str(e)) from None
        edited_note = " with edited input" if approval.edited_input is not None else ""
        self.stdout.write(
            f"approval {approval.pk} approved{edited_note}; run {approval.run_id} continues"
        )
