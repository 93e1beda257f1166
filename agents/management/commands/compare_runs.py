from __future__ import annotations

import json

from agents import compare
from agents.management.base import BaseCommand, fail, get_run, id_arg
from agents.snapshots import display


def _history(results: list[dict]) -> str:
    return " ".join("pass" if r["passed"] else "fail" for r in results) or "not run"


class Command(BaseCommand):
    help = (
        "Two runs side by side (a fork and its original, or any two): status, cost, the "
        "checks' history, and the workspace diff from A's latest checkpoint to B's."
    )

    def add_arguments(self, parser):
        parser.add_argument("a", type=id_arg, metavar="A")
        parser.add_argument("b", type=id_arg, metavar="B")
        parser.add_argument("--stat", action="store_true", help="the diff's files only")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        if o["a"] == o["b"]:
            raise fail("choose two different runs")
        found = compare.compare(get_run(o["a"]), get_run(o["b"]))
        if o["json"]:
            self.stdout.write(json.dumps(found.as_json(), indent=2, default=str))
            return
        for line in table(found):
            self.stdout.write(line)
        self.stdout.write("")
        a, b = found.a.checkpoint, found.b.checkpoint
        if found.changes is None:
            missing = found.a.run.pk if a is None else found.b.run.pk
            self.stdout.write(f"workspace: run {missing} has no checkpoint yet, nothing to diff")
            return
        self.stdout.write(
            f"workspace: checkpoint {a.number} (#{a.seq} of run {a.run_id}) → "
            f"checkpoint {b.number} (#{b.seq} of run {b.run_id}): {len(found.changes)} file(s)"
        )
        for c in found.changes:
            self.stdout.write(f"{c.status:<12} {display(c.path)}")
            if not o["stat"] and c.diff:
                self.stdout.write(c.diff.rstrip("\n"))


def table(found: compare.Comparison) -> list[str]:
    a, b = found.a, found.b

    def origin(side: compare.Side) -> str:
        return f"run {side.forked_from_run}" if side.forked_from_run else "-"

    rows = [
        ("", f"run {a.run.pk}", f"run {b.run.pk}"),
        ("goal", a.run.goal.splitlines()[0][:40], b.run.goal.splitlines()[0][:40]),
        ("status", a.run.status, b.run.status),
        ("provider/model", f"{a.run.provider}/{a.run.model}", f"{b.run.provider}/{b.run.model}"),
        ("forked from", origin(a), origin(b)),
        ("sessions", str(a.sessions), str(b.sessions)),
        ("turns", str(a.run.turns), str(b.run.turns)),
        ("tokens", str(a.run.total_tokens), str(b.run.total_tokens)),
        ("cost", f"${a.run.cost_usd}", f"${b.run.cost_usd}"),
        ("wall time", f"{a.run.active_seconds:.0f} s", f"{b.run.active_seconds:.0f} s"),
    ]
    rows += [
        (
            f"check {command}"[:30],
            _history(a.checks.get(command, [])),
            _history(b.checks.get(command, [])),
        )
        for command in found.commands
    ]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    return [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}".rstrip() for r in rows]
