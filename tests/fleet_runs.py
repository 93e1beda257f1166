"""Fleets made by hand for the web's tests: runs with `parent` set directly and fleet events
appended through the event log, as the fleet runtime will write them."""

from __future__ import annotations

from decimal import Decimal

from agents import eventlog
from agents.models import Run, RunStatus, Session
from tests.helpers import make_run


def child_of(parent: Run, *, goal: str = "a child's piece", created_by=None, **usage) -> Run:
    """A run spawned by `parent` (by its creator unless said), with usage figures if given."""
    run = make_run(goal=goal, created_by=created_by or parent.created_by)
    Run.objects.filter(pk=run.pk).update(parent=parent, depth=parent.depth + 1, **usage)
    run.refresh_from_db()
    return run


def fleet(owner, *, children: int = 2, goal: str = "split the work", **child_usage) -> Run:
    """A parent waiting for `children` children, each with a session and a turn's spend, and
    the parent's fleet.spawned event."""
    parent = make_run(goal=goal, created_by=owner)
    kids = []
    for i in range(children):
        kid = child_of(
            parent,
            goal=f"piece {i + 1}",
            turns=3,
            input_tokens=100,
            output_tokens=20,
            cost_usd=Decimal("0.010000"),
            status=RunStatus.RUNNING,
            **child_usage,
        )
        Session.objects.create(run=kid, index=1, turns=3)
        eventlog.append(kid.pk, "session.started", {"index": 1})
        kids.append(kid)
    eventlog.append(
        parent.pk,
        "fleet.spawned",
        {
            "children": [
                {"run_id": k.pk, "goal": k.goal, "budget_tokens": 1000,
                 "budget_cost_usd": "0.50", "from": "checkpoint 1"}
                for k in kids
            ]
        },
    )  # fmt: skip
    Run.objects.filter(pk=parent.pk).update(status=RunStatus.WAITING_FOR_CHILDREN)
    parent.refresh_from_db()
    return parent
