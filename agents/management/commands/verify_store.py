from __future__ import annotations

from django.core.management.base import BaseCommand

from agents.blobstore import BlobStore
from agents.checkpoints import protected_originals
from agents.management.base import fail
from agents.models import Artifact, Checkpoint
from agents.workspaces import store as snapshots


class Command(BaseCommand):
    help = (
        "Check that every checkpoint's, artifact's and protected file's blobs exist and match "
        "their hash."
    )

    def handle(self, *args, **o):
        trees = list(Checkpoint.objects.values_list("tree", flat=True).distinct())
        problems = snapshots().verify(trees)
        store = BlobStore()
        artifacts = protected = 0
        with store.lock():
            for pk, blob in Artifact.objects.values_list("pk", "blob_hash").iterator():
                artifacts += 1
                if problem := store.check(blob):
                    problems.append(f"artifact {pk}: {problem}")
            for run_id, path, blob in protected_originals():
                protected += 1
                if problem := store.check(blob):
                    problems.append(f"protected file {path} of run {run_id}: {problem}")
        for p in problems:
            self.stderr.write(p)
        if problems:
            raise fail(f"{len(problems)} problem(s) in the store")
        self.stdout.write(
            f"store OK: {len(trees)} checkpoint tree(s), {artifacts} artifact(s), "
            f"{protected} protected file(s)"
        )
