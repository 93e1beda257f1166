from __future__ import annotations

import sys
from pathlib import Path

from agents import blobstore
from agents.management.base import BaseCommand, fail, id_arg
from agents.models import Artifact


class Command(BaseCommand):
    help = "Write an artifact to a file (--out) or to standard output."

    def add_arguments(self, parser):
        parser.add_argument("artifact_id", type=id_arg, metavar="ID")
        parser.add_argument("--out", metavar="FILE")

    def handle(self, *args, **o):
        try:
            artifact = Artifact.objects.get(pk=o["artifact_id"])
        except Artifact.DoesNotExist:
            raise fail(f"no artifact with id {o['artifact_id']}") from None
        try:
            data = blobstore.configured().get(artifact.blob_hash)
        except FileNotFoundError:
            raise fail(
                f"artifact {artifact.pk}'s blob {artifact.blob_hash} is missing from the store (run verify_store)"
            ) from None
        if o["out"]:
            out = Path(o["out"])
            if out.is_dir():
                out = out / Path(artifact.name).name
            out.write_bytes(data)
            self.stdout.write(f"wrote {len(data)} bytes to {out}")
        elif sys.stdout.isatty():
            # An artifact is the agent's bytes: to a terminal they are shown, never obeyed.
            self.stdout.write(data.decode("utf-8", "backslashreplace"), ending="")
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
