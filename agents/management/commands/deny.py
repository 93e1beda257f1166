from __future__ import annotations

from agents.approvals import ApprovalError, decide_as, what_next
from agents.management.base import BaseCommand, acting, fail, id_arg


class Command(BaseCommand):
    help = "Deny a waiting tool call; the reason reaches the agent as the tool's result."

    def add_arguments(self, parser):
        parser.add_argument("approval_id", type=id_arg, metavar="ID")
        parser.add_argument(
            "--user", required=True, help="who decides (needs agents.decide_approval)"
        )
        parser.add_argument("--reason", required=True)

    def handle(self, *args, **o):
        user, _ = acting(o["user"])
        try:
            approval = decide_as(o["approval_id"], user=user, decision="deny", reason=o["reason"])
        except ApprovalError as e:
            raise fail(str(e)) from None
        self.stdout.write(f"approval {approval.pk} denied; {what_next(approval.run_id)}")
