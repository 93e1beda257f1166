from __future__ import annotations

from agents import blobstore
from agents.checkpoints import protected_originals
from agents.management.base import BaseCommand, fail
from agents.models import Artifact, Checkpoint, Run
from agents.snapshots import Snapshots


def kept_trees() -> list[str]:
    """Every tree a row names: checkpoints, and each run's last committed workspace."""
    trees = set(Checkpoint.objects.values_list("tree", flat=True).distinct())
    trees.update(Run.objects.exclude(workspace_tree="").values_list("workspace_tree", flat=True))
    return sorted(trees)


class Command(BaseCommand):
    help = (
        "Delete blobs that no checkpoint, run workspace, artifact or protected file references "
        "(recent ones are kept)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=3600.0,
            help="keep blobs younger than this: a checkpoint may be being written",
        )

    def handle(self, *args, **o):
        keep_blobs = set(Artifact.objects.values_list("blob_hash", flat=True).distinct())
        # The originals the checks are run against: a run queued or paused before its first
        # checkpoint has no other reference to them.
        keep_blobs.update(blob for _, _, blob in protected_originals())
        store = blobstore.configured()
        try:
            result = Snapshots(store).prune(
                kept_trees(),
                keep_blobs,
                grace_seconds=o["grace_seconds"],
                dry_run=o["dry_run"],
            )
        except blobstore.BlobStoreUnavailable as e:
            raise fail(str(e)) from None
        verb = "would delete" if o["dry_run"] else "deleted"
        self.stdout.write(
            f"{verb} {result.deleted} blob(s), {result.bytes_freed} bytes; kept {result.kept} "
            f"({store.describe()})"
        )
