from __future__ import annotations

from pathlib import Path

from agents.backup import BackupError, backup
from agents.management.base import BaseCommand, fail


class Command(BaseCommand):
    help = (
        "Write a consistent copy of the database and the blob store (and the workspaces) to one "
        "file while the product runs; `restore FILE` brings it back into an empty installation."
    )

    def add_arguments(self, parser):
        parser.add_argument("--out", required=True, help="the backup file to write")
        parser.add_argument(
            "--no-workspaces",
            action="store_true",
            help="leave the workspaces out (runs can still be rewound to any checkpoint)",
        )

    def handle(self, *args, **o):
        try:
            summary = backup(Path(o["out"]), workspaces=not o["no_workspaces"])
        except (BackupError, OSError) as e:
            raise fail(f"backup failed: {e}") from None
        self.stdout.write(f"backup written to {o['out']}: {summary.line()}")
