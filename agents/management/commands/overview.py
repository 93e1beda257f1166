from __future__ import annotations

import json

from agents import overview
from agents.management.base import BaseCommand, acting
from agents.models import Approval, Run


class Command(BaseCommand):
    help = (
        "The fleet at a glance, as the Overview page shows it: runs by status, approvals "
        "waiting, stuck runs, stalled external runs, spend today and this week, burn rates and "
        "time to each cap."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", help="only the runs this user may see (default: all)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        runs, approvals = Run.objects.all(), Approval.objects.pending()
        if o["user"]:
            user, _ = acting(o["user"])
            if not (user.is_active and user.has_perm("agents.view_run")):
                runs = runs.filter(created_by=user)
                approvals = approvals.filter(run__created_by=user)
        figures = overview.compute(runs, approvals)
        if o["json"]:
            self.stdout.write(json.dumps(figures.as_json(), indent=2))
            return
        for line in text(figures):
            self.stdout.write(line)


def text(o: overview.Overview) -> list[str]:
    counts = ", ".join(f"{status}: {n}" for status, _, n in o.counts if n) or "none"
    lines = [f"runs: {o.total} ({counts})"]
    lines.append(f"approvals waiting: {o.approvals_waiting}")
    lines += [
        f"  approval {w.approval.pk} (run {w.approval.run_id}): {w.approval.tool_name}, "
        f"waiting {w.age}"
        for w in o.approvals
    ]
    lines.append(f"stuck (no event for more than {o.stuck_minutes} min): {o.stuck_count}")
    lines += [f"  run {s.run.pk} ({s.run.status}): quiet for {s.quiet}" for s in o.stuck]
    lines.append(f"stalled (external, silent past their heartbeat): {o.stalled_count}")
    lines += [
        f"  run {s.run.pk} ({s.run.status}): silent for {s.silent}, "
        f"heartbeat {s.run.heartbeat_window} s"
        for s in o.stalled
    ]
    for name, label, start in (
        ("today", "today", o.today_start),
        ("week", "this week", o.week_start),
    ):
        spent = o.spend[name]
        lines.append(
            f"spent {label}: ${spent['usd']} ({spent['tokens']} tokens) "
            f"since {start:%Y-%m-%d %H:%M} {o.timezone_name}"
        )
    lines.append(f"active runs: {len(o.burns)}")
    for b in o.burns:
        caps = "; ".join(str(f) for f in b.forecasts)
        lines.append(
            f"  run {b.run.pk} ({b.run.status}): {b.tokens_per_minute:.0f} tokens/min, "
            f"${b.usd_per_hour}/h; {caps}"
        )
    return lines
