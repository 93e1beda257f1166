from __future__ import annotations

from agents import blobstore
from agents.checkpoints import protected_originals
from agents.management.base import BaseCommand, fail
from agents.management.commands.prune_store import kept_trees
from agents.models import Artifact
from agents.snapshots import Snapshots


class Command(BaseCommand):
    help = (
        "Check that every checkpoint's, run workspace's, artifact's and protected file's blobs "
        "exist and match their hash."
    )

    def handle(self, *args, **o):
        try:
            self._verify()
        except blobstore.BlobStoreUnavailable as e:
            raise fail(str(e)) from None

    def _verify(self):
        trees = kept_trees()
        store = blobstore.configured()
        store.check_ready()  # also when there is nothing to check
        problems = Snapshots(store).verify(trees)
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
            f"{protected} protected file(s) ({store.describe()})"
        )
