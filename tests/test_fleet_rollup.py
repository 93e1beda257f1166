"""Fleet read side: descendants and the rolled-up spend (agents/fleets/tree.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agents.fleets.tree import descendant_ids, rollup
from agents.models import LIVE_STATUSES, Run, RunStatus

pytestmark = pytest.mark.django_db


def _run(parent=None, tokens=0, cost="0"):
    return Run.objects.create(
        goal="g",
        model="m",
        parent=parent,
        depth=(parent.depth + 1) if parent else 0,
        input_tokens=tokens,
        output_tokens=tokens,
        cost_usd=Decimal(cost),
    )


def test_rollup_sums_the_run_and_every_descendant_but_not_other_runs():
    root = _run(tokens=10, cost="1.5")
    a = _run(root, tokens=5, cost="0.25")
    b = _run(root, tokens=1, cost="0.5")
    grandchild = _run(a, tokens=100, cost="2")
    _run(tokens=1_000, cost="9")  # another fleet

    assert sorted(descendant_ids(root)) == sorted([a.pk, b.pk, grandchild.pk])
    assert descendant_ids(b) == []
    whole = rollup(root)
    assert whole.tokens == 2 * (10 + 5 + 1 + 100)
    assert whole.cost_usd == Decimal("4.25")
    assert whole.as_json() == {"tokens": 232, "cost_usd": "4.250000"}
    assert rollup(a).tokens == 2 * 105
    assert rollup(b).as_json()["tokens"] == 2


def test_waiting_for_children_is_live_and_fits_the_status_column():
    assert RunStatus.WAITING_FOR_CHILDREN in LIVE_STATUSES
    run = _run()
    run.status = RunStatus.WAITING_FOR_CHILDREN
    run.save()
    run.refresh_from_db()
    assert run.status == "waiting_for_children"
