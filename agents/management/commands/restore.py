from __future__ import annotations

from pathlib import Path

from django.core.management import call_command

from agents.backup import BackupError, restore
from agents.management.base import BaseCommand, fail


class Command(BaseCommand):
    help = (
        "Restore a file written by `backup` into this installation, which must be empty (no runs, "
        "no blobs, no workspaces); then apply newer migrations and verify the store."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="a file written by `manage.py backup`")

    def handle(self, *args, **o):
        try:
            summary = restore(Path(o["file"]))
        except (BackupError, OSError) as e:
            raise fail(f"restore failed: {e}") from None
        self.stdout.write(f"restored {o['file']}: {summary.line()}")
        call_command("verify_store", stdout=self.stdout, stderr=self.stderr)
