from __future__ import annotations

from django.core.management.base import BaseCommand

from agents.blobstore import BlobStore
from agents.checkpoints import snapshots
from agents.management.base import fail
from agents.models import Artifact, Checkpoint


class Command(BaseCommand):
    help = "Check that every checkpoint's and artifact's blobs exist and match their hash."

    def handle(self, *args, **o):
        trees = list(Checkpoint.objects.values_list("tree", flat=True).distinct())
        problems = snapshots().verify(trees)
        store = BlobStore()
        for artifact in Artifact.objects.only("pk", "blob_hash"):
            if not store.exists(artifact.blob_hash):
                problems.append(f"artifact {artifact.pk}: blob {artifact.blob_hash} is missing")
        for p in problems:
            self.stderr.write(p)
        if problems:
            raise fail(f"{len(problems)} problem(s) in the store")
        self.stdout.write(
            f"store OK: {len(trees)} checkpoint tree(s), {Artifact.objects.count()} artifact(s)"
        )
