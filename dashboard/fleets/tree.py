"""Seeing a fleet on the web: a run's children and grandchildren as the run page's Fleet panel
and the grouped runs list show them, in a bounded number of queries whatever the fleet's size.

Only runs the user may see are shown (`access.visible_runs`); a run below one they may not see is
left out with it, so a tree never shows a branch without its stem. The spend rolled up over the
whole fleet (`agents.fleets.tree.rollup`) is the parent's own figure and counts every descendant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import models
from django.db.models import Q

from agents import access
from agents.fleets import tree as fleets
from agents.models import Event, Run

# Two levels show: children and grandchildren (a grandchild with children of its own says "N more
# below" and shows them on its page).
MAX_NODES = 60  # runs a Fleet panel lists at most (a fleet is at most 8 a spawn by default)
MAX_LIST_CHILDREN = 200  # child rows the grouped runs list shows under one page of roots


@dataclass
class Node:
    run: Run  # annotated by `_annotated`
    level: int  # 1: a child, 2: a grandchild
    children: list[Node] = field(default_factory=list)

    @property
    def checks(self) -> dict:
        value = self.run.head_checks
        return value if isinstance(value, dict) else {}

    @property
    def checks_passing(self) -> int:
        return sum(1 for r in self.checks.values() if isinstance(r, dict) and r.get("passed"))


@dataclass
class Fleet:
    """What a parent's page shows of its fleet."""

    nodes: list[Node]  # in tree order: each child followed by its own children
    hidden: int  # visible runs of the two levels left out past MAX_NODES
    rollup: fleets.Rollup
    live: bool  # the parent or a shown run is live: the panel keeps re-reading itself

    @property
    def children(self) -> int:
        return sum(1 for n in self.nodes if n.level == 1)


def _annotated(qs: models.QuerySet[Run]) -> models.QuerySet[Run]:
    """The runs list's columns (`for_list`), plus each run's latest event kind, its child count
    and its latest checkpoint's check results: subqueries, no query per run."""
    latest = Event.objects.filter(run=models.OuterRef("pk")).order_by("-seq")
    kids = (
        Run.objects.filter(parent=models.OuterRef("pk"))
        .order_by()
        .values("parent")
        .annotate(n=models.Count("pk"))
        .values("n")
    )
    return qs.for_list().annotate(
        last_kind=models.Subquery(latest.values("kind")[:1]),
        head_checks=models.F("head_checkpoint__state__checks"),
        child_count=models.functions.Coalesce(
            models.Subquery(kids, output_field=models.IntegerField()), 0
        ),
    )


def below(user, root_ids: list[int], *, limit: int) -> list[Run]:
    """Visible children and grandchildren of the given runs, oldest first: one query."""
    if not root_ids:
        return []
    qs = access.visible_runs(user).filter(
        Q(parent_id__in=root_ids) | Q(parent__parent_id__in=root_ids)
    )
    return list(_annotated(qs).order_by("depth", "created_at", "pk")[:limit])


def _tree(root_ids: list[int], runs: list[Run]) -> dict[int, list[Node]]:
    """Each root's nodes in tree order; a run whose parent is not among them is dropped."""
    nodes: dict[int, Node] = {}
    tops: dict[int, list[Node]] = {pk: [] for pk in root_ids}
    for run in runs:  # by depth: a parent comes before its children
        if run.parent_id in tops:
            node = nodes[run.pk] = Node(run, 1)
            tops[run.parent_id].append(node)
        elif run.parent_id in nodes and nodes[run.parent_id].level == 1:
            node = nodes[run.pk] = Node(run, 2)
            nodes[run.parent_id].children.append(node)
    return {pk: [n for top in kids for n in (top, *top.children)] for pk, kids in tops.items()}


def tree(user, run: Run, rollup: fleets.Rollup | None = None) -> Fleet | None:
    """The fleet below `run` as `user` may see it, or None when it has no visible child.
    `rollup`: the fleet's spend when the caller has it already (the meters read it)."""
    runs = below(user, [run.pk], limit=MAX_NODES + 1)
    if not runs:
        return None
    shown = runs[:MAX_NODES]
    nodes = _tree([run.pk], shown)[run.pk]
    hidden = 0
    if len(runs) > MAX_NODES:
        hidden = access.visible_runs(user).filter(
            Q(parent=run) | Q(parent__parent=run)
        ).count() - len(shown)
    return Fleet(
        nodes=nodes,
        hidden=hidden,
        rollup=rollup or fleets.rollup(run),
        live=run.is_live or any(n.run.is_live for n in nodes),
    )


def list_children(user, roots: list[Run]) -> dict[int, list[Node]]:
    """The grouped runs list: each root's visible children and grandchildren, for one page of
    roots in one query (the page itself is the runs list's own query, however it pages)."""
    ids = [r.pk for r in roots]
    return _tree(ids, below(user, ids, limit=MAX_LIST_CHILDREN))


def fleet_label(user, run: Run) -> dict | None:
    """For a child's page: its parent, if the user may see it ({"id", "goal"}), or
    {"id": None} (part of a fleet they may not see); None for a run with no parent."""
    if run.parent_id is None:
        return None
    parent = access.visible_runs(user).filter(pk=run.parent_id).values("pk", "goal").first()
    if parent is None:
        return {"id": None, "goal": ""}
    return {"id": parent["pk"], "goal": parent["goal"]}


def rollup_if_parent(run: Run) -> fleets.Rollup | None:
    """The whole fleet's spend for the meters, or None for a run without children (one query
    then). Not per user: a parent's rollup is its own figure, as `show_run --json` gives it."""
    if not Run.objects.filter(parent_id=run.pk).exists():
        return None
    return fleets.rollup(run)
