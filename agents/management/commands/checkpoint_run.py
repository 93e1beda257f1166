from __future__ import annotations

from agents import checkpoints, inputs
from agents.management.base import RunCommand, acting, fail, get_run
from agents.models import CheckpointKind


class Command(RunCommand):
    help = "Checkpoint a run's workspace and agent state now."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--label", default="")

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        if not run.workspace_path.is_dir():
            raise fail(f"run {run.pk} has no workspace at {run.workspace_path}")
        _, actor = acting(o["user"])
        try:
            label = inputs.text(o["label"], what="--label", max_length=200, required=False)
        except inputs.InputError as e:
            raise fail(str(e)) from None
        cp = checkpoints.create(run.pk, kind=CheckpointKind.MANUAL, label=label, actor=actor)
        self.stdout.write(
            f"checkpoint {cp.number} of run {run.pk} at #{cp.seq}: {cp.files} files; "
            f"the store grew by {cp.bytes_added} bytes"
        )
