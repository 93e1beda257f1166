"""Fleets, the read side: a run's descendants and what the whole tree has spent.

A run spawned by another run's `spawn_runs` call has `parent` set and `depth` one more than its
parent's. Depth is bounded (SHIFTLOG_FLEET_MAX_DEPTH), so a tree is read one level per query.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import F, Sum

from agents.models import LIVE_STATUSES, Event, EventKind, FleetChild, Run
from agents.models.fleets import MergeState


@dataclass(frozen=True)
class Rollup:
    """A run's own spend plus every descendant's."""

    tokens: int
    cost_usd: Decimal

    def as_json(self) -> dict:
        return {"tokens": self.tokens, "cost_usd": str(self.cost_usd)}


def descendant_ids(run: Run) -> list[int]:
    """Ids of every run below `run`, level by level (children first, then theirs)."""
    found: list[int] = []
    level = [run.pk]
    while level:
        level = list(Run.objects.filter(parent_id__in=level).values_list("pk", flat=True))
        found.extend(level)
    return found


def rollup(run: Run) -> Rollup:
    """`run`'s tokens and dollars plus those of all its descendants."""
    ids = [run.pk, *descendant_ids(run)]
    sums = Run.objects.filter(pk__in=ids).aggregate(
        tokens=Sum(
            F("input_tokens")
            + F("output_tokens")
            + F("cache_read_tokens")
            + F("cache_write_tokens")
        ),
        cost=Sum("cost_usd"),
    )
    cost = Decimal(sums["cost"] or 0).quantize(Decimal("0.000001"))
    return Rollup(tokens=int(sums["tokens"] or 0), cost_usd=cost)


@dataclass(frozen=True)
class WaitState:
    """Where a parent's wait for its latest spawn's children stands."""

    over: bool
    reason: str
    children: list[dict]  # [{"run_id", "status"}] of that spawn, in order
    tool_use_id: str = ""


def latest_spawn(run: Run) -> list[FleetChild]:
    """The children of the run's latest spawn_runs call, in the call's order."""
    last = FleetChild.objects.filter(parent=run).order_by("-pk").first()
    if last is None:
        return []
    return list(
        FleetChild.objects.filter(parent=run, tool_use_id=last.tool_use_id)
        .select_related("child")
        .order_by("index")
    )


def wait_state(run: Run) -> WaitState:
    """Whether the run's wait is over: every child of its latest spawn ended (wait "all"), or
    one of them (wait "any")."""
    spawned = latest_spawn(run)
    if not spawned:
        return WaitState(True, "it has no children to wait for", [])
    children = [{"run_id": f.child_id, "status": f.child.status} for f in spawned]
    ended = [c for c in children if c["status"] not in LIVE_STATUSES]
    wait = spawned[0].wait
    if wait == "any":
        over = bool(ended)
        reason = f"child run {ended[0]['run_id']} ended ({ended[0]['status']})" if over else ""
    else:
        over = len(ended) == len(children)
        reason = f"all {len(children)} child runs ended" if over else ""
    return WaitState(over, reason, children, spawned[0].tool_use_id)


def live_spawns(run_id: int, live=None) -> set[str]:
    """The tool_use_ids of the run's spawn_runs calls on its live branch: children of the
    others were spawned on a branch a rewind abandoned (and cancelled by it, if still running)."""
    live = Event.objects.on_live_branch(run_id) if live is None else live
    return set(
        live.filter(kind=EventKind.FLEET_SPAWNED).values_list("payload__tool_use_id", flat=True)
    )


def after_rewind(run_id: int) -> list[int]:
    """A fleet's parent was rewound (its `run.rewound` event is in): what its live branch no
    longer holds is undone. Each child's merge state becomes what the live branch's last merge
    of it says (none, applied, resolved by a person, or in conflict), so merge_children takes a
    child again whose merge the rewind took out of the workspace. Returns the live children
    spawned only on the abandoned branch: nothing waits for them now, so they are cancelled."""
    rows = list(FleetChild.objects.filter(parent_id=run_id))
    if not rows:
        return []
    live = Event.objects.on_live_branch(run_id)
    state: dict[int, str] = {}
    for p in (
        live.filter(kind=EventKind.FLEET_MERGE).order_by("seq").values_list("payload", flat=True)
    ):
        if p["result"] == "applied":
            state[p["run_id"]] = MergeState.RESOLVED if p.get("approval_id") else MergeState.APPLIED
        else:
            state[p["run_id"]] = MergeState.CONFLICT
    spawned = live_spawns(run_id, live)
    for row in rows:
        merge_state = state.get(row.child_id, MergeState.NONE)
        if row.merge_state != merge_state:
            FleetChild.objects.filter(pk=row.pk).update(merge_state=merge_state)
    unwanted = [r.child_id for r in rows if r.tool_use_id not in spawned]
    return list(
        Run.objects.filter(pk__in=unwanted, status__in=LIVE_STATUSES).values_list("pk", flat=True)
    )
