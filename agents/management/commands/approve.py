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
        parser.add_argument("--comment", default="")
        parser.add_argument(
            "--allow-similar",
            action="store_true",
            help="also allow similar calls for the rest of the run",
        )

    def handle(self, *args, **o):
        user, _ = acting(o["user"])
        try:
            edited = None
            if o["input"] is not None:
                edited = approvals.parse_edit(approvals.get(o["approval_id"]), o["input"])
            approval = approvals.decide(
                o["approval_id"],
                user=user,
                approve=True,
                edited_input=edited,
                comment=o["comment"],
                allow_similar=o["allow_similar"],
            )
        except approvals.ApprovalError as e:
            raise fail(str(e)) from None
        edited_note = " with edited input" if approval.edited_input is not None else ""
        self.stdout.write(
            f"approval {approval.pk} approved{edited_note}; run {approval.run_id} continues"
        )
