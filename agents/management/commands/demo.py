from __future__ import annotations

from agents.fleets.demo import create_fleet_demo_run
from agents.management.base import BaseCommand
from agents.services import create_demo_run


class Command(BaseCommand):
    help = (
        "Create a demo run (scripted, offline) and print its id as the last line: the single-run "
        "demo, or with `fleet` a planner that splits its task between two child runs."
    )

    def add_arguments(self, parser):
        parser.add_argument("which", nargs="?", choices=["run", "fleet"], default="run")

    def handle(self, *args, **o):
        if o["which"] == "fleet":
            run = create_fleet_demo_run()
            self.stdout.write(
                "Created the fleet demo's planner run. It spawns two child runs, waits for them, "
                "merges their work and finishes; one child's cleanup waits for a person "
                "(`manage.py approvals`, then `approve ID`). Watch it with `manage.py show_run "
                "ID` or on its run page."
            )
        else:
            run = create_demo_run()
            self.stdout.write("Created the demo run. Watch it with `manage.py tail_run ID`.")
        self.stdout.write(str(run.pk))
