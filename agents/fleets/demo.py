"""The fleet demo (`manage.py demo fleet`): a scripted planner that splits a small task between
two child runs, waits for them, merges their work and finishes with checks that need both
(agents/scripts/fleet.json; each child's script rides in the planner's spawn_runs call)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from agents import services
from agents.models import Run
from agents.providers.scripted import builtin_script
from agents.runspec import RunSpec

FLEET_GOAL = (
    "Write report.py, a one-line report of a text that uses two modules, textstats.py "
    "(word_count, top_words) and numstats.py (mean, median), each with its own unit tests; "
    "split the two modules between child runs. Every test must pass."
)
FLEET_CHECKS = [
    "python3 -m unittest -q",
    "test -f textstats.py && test -f numstats.py && python3 -c 'import report'",
]


def _with_delay(script: dict[str, Any], delay: float) -> dict[str, Any]:
    script["turn_delay_seconds"] = delay
    for turn in script["turns"]:
        for call in turn.get("tool_calls", []):
            if call["name"] == "spawn_runs":
                for child in call["input"]["children"]:
                    child["script"]["turn_delay_seconds"] = delay
    return script


def create_fleet_demo_run(created_by=None, *, turn_delay_seconds: float | None = None) -> Run:
    delay = (
        settings.SHIFTLOG["DEMO_TURN_DELAY_SECONDS"]
        if turn_delay_seconds is None
        else turn_delay_seconds
    )
    spec = RunSpec(
        goal=FLEET_GOAL,
        checks=FLEET_CHECKS,
        script=_with_delay(builtin_script("fleet"), delay),
        script_name="fleet demo (built in)",
    )
    return services.create_run(spec, created_by=created_by)
