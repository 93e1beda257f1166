from __future__ import annotations

import json

from agents import config_changes
from agents.management.base import BaseCommand, id_arg
from agents.models import Approval, ApprovalStatus


class Command(BaseCommand):
    help = "List the tool calls waiting for a person (all runs, or one with --run)."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=id_arg, metavar="ID")
        parser.add_argument("--all", action="store_true", help="decided ones too")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        approvals = Approval.objects.select_related("decided_by").order_by("created_at", "pk")
        if not o["all"]:
            approvals = approvals.filter(status=ApprovalStatus.PENDING)
        if o["run"]:
            approvals = approvals.filter(run_id=o["run"])
        rows = [
            {
                "id": a.pk,
                "run": a.run_id,
                "tool": a.tool_name,
                "input": a.tool_input,
                # What ran (or will run): the person's edit when there was one.
                "ran": a.edited_input if a.edited_input is not None else a.tool_input,
                "edited": a.edited_input is not None,
                "status": a.status,
                "requested_at": a.created_at.isoformat(),
                "expires_at": a.expires_at.isoformat() if a.expires_at else None,
                "decided_by": a.decided_by.get_username() if a.decided_by else None,
                "comment": a.comment,
            }
            for a in approvals
        ]
        if o["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no approvals waiting")
        for r in rows:
            ran = r["ran"]
            what = ran.get("command") if r["tool"] == "bash" else json.dumps(ran)
            if r["tool"] == config_changes.TOOL:  # a change to how the checks run: its diff
                what = f"{config_changes.paths(ran)}\n{config_changes.card_diff(ran)}"
            line = f"approval {r['id']} (run {r['run']}, {r['status']}): {r['tool']} {what}"
            if r["edited"]:
                asked = r["input"].get("command") if r["tool"] == "bash" else json.dumps(r["input"])
                line += f"  (edited; asked: {asked})"
            self.stdout.write(line)
