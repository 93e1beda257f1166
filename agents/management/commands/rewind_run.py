from __future__ import annotations

import json

from agents import checkpoints, rewinds
from agents.management.base import RunCommand, acting, fail, get_run, id_arg


def describe_discarded(d: rewinds.Discarded) -> list[str]:
    lines = [
        f"  events after #{d.to_seq} (up to #{d.from_seq}): {d.events}"
        + (
            f" ({', '.join(f'{k} {n}' for k, n in sorted(d.by_kind.items()))})" if d.by_kind else ""
        ),
        f"  sessions started after it: {', '.join(map(str, d.sessions)) or 'none'}",
        f"  spent since: {d.tokens} tokens, ${d.cost_usd}",
        f"  artifacts: {', '.join(d.artifacts) or 'none'}",
        f"  workspace files: {len(d.files)} change(s)",
    ]
    lines += [f"    {f['path']}: {f['status']}" for f in d.files[:50]]
    if len(d.files) > 50:
        lines.append(f"    ... and {len(d.files) - 50} more")
    if d.children:
        lines.append(
            "  child runs spawned since, still running: cancelled "
            + ", ".join(f"run {c}" for c in d.children)
        )
    if d.irreversible:
        lines.append("  cannot be undone (effects outside the workspace):")
        lines += [f"    {c['command']}  [{', '.join(c['risks'])}]" for c in d.irreversible]
    return lines


class Command(RunCommand):
    help = (
        "Rewind a run to a checkpoint: workspace and agent state; the log keeps what is discarded."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--to",
            type=id_arg,
            required=True,
            metavar="N",
            help="the checkpoint's number in the run (show_run lists them)",
        )
        parser.add_argument("--note", default="", help="what the next session should know")
        parser.add_argument(
            "--dry-run", action="store_true", help="only show what would be discarded"
        )
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        _, actor = acting(o["user"])
        try:
            target = checkpoints.by_number(run.pk, o["to"])
            discarded = rewinds.rewind(
                run.pk, target.pk, actor=actor, note=o["note"], dry_run=o["dry_run"]
            )
        except checkpoints.CheckpointError as e:
            raise fail(str(e)) from None
        if o["json"]:
            self.stdout.write(
                json.dumps({"dry_run": o["dry_run"], **discarded.as_dict()}, indent=2)
            )
            return
        head = "would discard" if o["dry_run"] else "rewound; discarded"
        self.stdout.write(f"run {run.pk} → checkpoint {o['to']}: {head}:")
        for line in describe_discarded(discarded):
            self.stdout.write(line)
