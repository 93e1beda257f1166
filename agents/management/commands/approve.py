from __future__ import annotations

from agents import approvals
from agents.management.base import BaseCommand, acting, fail, id_arg


class Command(BaseCommand):
    help = "Approve a waiting tool call, optionally with edited input, as a named user."

    def add_arguments(self, parser):
        parser.add_argument("approval_id", type=id_arg, metavar="ID")
        parser.add_argument(
            "--user", required=True, help="who decides (needs agents.decide_approval)"
        )
        parser.add_argument(
            "--input",
            metavar="JSON",
            help="run this input instead, as a JSON object (for bash, the command itself also "
            "does); the edit is recorded as a diff",
        )
        parser.add_argument(
            "--reason",
            "--comment",
            dest="reason",
            default="",
            help="passed on to the agent with the approval",
        )
        parser.add_argument(
            "--allow-similar",
            action="store_true",
            help="also allow similar calls for the rest of the run",
        )

    def handle(self, *args, **o):
        user, _ = acting(o["user"])
        try:
            # The one vocabulary (agents/approvals.py): an --input makes it an edit.
            approval = approvals.decide_as(
                o["approval_id"],
                user=user,
                decision="edit" if o["input"] is not None else "approve",
                reason=o["reason"],
                input=o["input"],
                allow_similar=o["allow_similar"],
            )
        except approvals.ApprovalError as e:
            raise fail(str(e)) from None
        edited_note = " with edited input" if approval.edited_input is not None else ""
        self.stdout.write(
            f"approval {approval.pk} approved{edited_note}; {approvals.what_next(approval.run_id)}"
        )
