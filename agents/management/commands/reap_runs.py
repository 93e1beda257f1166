from __future__ import annotations

from agents.management.base import BaseCommand
from agents.reaper import reap


class Command(BaseCommand):
    help = "Queue again the runs no worker is driving (a dead worker's, or a lost task's)."

    def handle(self, *args, **o):
        requeued = reap()
        self.stdout.write(
            f"requeued {len(requeued)} run(s){': ' if requeued else ''}{', '.join(map(str, requeued))}"
        )
