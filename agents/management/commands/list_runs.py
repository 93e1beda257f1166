from __future__ import annotations

import argparse
import json

from agents import inputs, pages
from agents.management.base import BaseCommand, acting, fail
from agents.models import Run, RunStatus
from agents.money import usd

MAX_LIMIT = 1000


def limit_arg(text: str) -> int:
    try:
        return inputs.whole_number(text, what="--limit", maximum=MAX_LIMIT)
    except inputs.InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Command(BaseCommand):
    help = (
        "List runs, newest first, a page at a time: the last line names the next page "
        "(--after CURSOR) when there is one. Same order and cursors as the web and the API."
    )

    def add_arguments(self, parser):
        parser.add_argument("--status", choices=RunStatus.values)
        parser.add_argument("--q", metavar="TEXT", help="words in the goal")
        parser.add_argument("--limit", type=limit_arg, default=pages.RUNS_PER_PAGE,
                            help=f"runs on this page (at most {MAX_LIMIT})")  # fmt: skip
        parser.add_argument("--after", metavar="CURSOR", help="the next page's cursor")
        parser.add_argument("--user", help="only the runs this user may see (default: all)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        runs = Run.objects.all()
        if o["user"]:
            user, _ = acting(o["user"])
            if not (user.is_active and user.has_perm("agents.view_run")):
                runs = runs.filter(created_by=user)
        if o["status"]:
            runs = runs.filter(status=o["status"])
        for word in (o["q"] or "").split()[:10]:
            runs = runs.filter(goal__icontains=word)
        try:
            after = pages.Cursor.parse(o["after"], what="--after") if o["after"] else None
        except inputs.InputError as e:
            raise fail(str(e)) from None
        rows = list(pages.older_than(runs, after)[: o["limit"] + 1])
        more = len(rows) > o["limit"]
        rows = rows[: o["limit"]]
        cursor = pages.runs_cursor(rows[-1]) if more else None
        if o["json"]:
            items = [
                {"id": r.pk, "status": r.status, "goal": r.goal, "provider": r.provider,
                 "cost_usd": str(r.cost_usd), "created_at": r.created_at.isoformat()}
                for r in rows
            ]  # fmt: skip
            self.stdout.write(json.dumps({"items": items, "next_cursor": cursor}, indent=2))
            return
        if not rows:
            self.stdout.write("no runs" + (" match" if o["status"] or o["q"] else ""))
        for r in rows:
            goal = " ".join(r.goal.split())
            goal = goal if len(goal) <= 80 else goal[:79] + "…"
            self.stdout.write(f"{r.pk:>7}  {r.status:<18} {usd(r.cost_usd)}  {goal}")
        if cursor:
            self.stdout.write(f"more: --after {cursor}")
