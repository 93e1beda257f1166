"""Spawning a fleet's children: checked against the limits and the parent's budget, each made a
normal run (through `services.create_run`) with `parent` set, its workspace seeded from the
parent's checkpoint (the whole tree, or one folder of it), and queued once the transaction
commits.

Idempotent: children are keyed by parent + tool_use_id + index (`FleetChild`), and the caller
makes them in one transaction with the parent's tool result and its move to
`waiting_for_children`; a retry after a dead worker finds what was made and makes only what is
missing, so there is never a duplicate child nor a lost one.

Budgets: a child's share is carved out of what remains of the parent's budget (its limit minus its
own spend, minus each live child's share or spend, whichever is more, minus each ended child's
spend). Shares that add up to more than remains are refused; children given no share split what
remains after the given shares evenly. Without a limit on the parent, a child gets the share it
was given, or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from agents import eventlog, services, workspaces
from agents.eventlog import NewEvent
from agents.fleets import tree as fleets
from agents.models import (
    LIVE_STATUSES,
    Checkpoint,
    EventKind,
    FleetChild,
    Provider,
    Run,
)
from agents.runspec import RunSpec

CENT = Decimal("0.000001")


class SpawnError(ValueError):
    """The spawn cannot be done as asked; the message is for the agent."""


@dataclass
class ChildPlan:
    index: int
    spec: dict[str, Any]
    folder: str
    tree: str
    budget_tokens: int | None
    budget_cost_usd: Decimal | None


def _folder(raw: str, files: dict) -> str:
    folder = "/".join(p for p in str(raw).strip().split("/") if p not in ("", "."))
    if not folder:
        return ""
    if ".." in folder.split("/"):
        raise SpawnError(f"from: {raw!r} leaves the workspace; give a folder inside it")
    entry = files.get(folder)
    if entry is None or entry.type != "d":
        raise SpawnError(f"from: the workspace has no folder {folder!r} at its latest checkpoint")
    return folder


def committed(parent: Run) -> tuple[int, Decimal]:
    """What the parent's budget is already spoken for: its own spend plus, per child, its
    share while it is live (or its spend, when more) and its spend once it has ended."""
    tokens, cost = parent.total_tokens, parent.cost_usd
    for child in Run.objects.filter(parent=parent):
        spent = fleets.rollup(child)
        if child.status in LIVE_STATUSES:
            tokens += max(child.max_tokens or 0, spent.tokens)
            cost += max(child.max_cost_usd or Decimal(0), spent.cost_usd)
        else:
            tokens += spent.tokens
            cost += spent.cost_usd
    return tokens, cost


def _carve(limit, spent, given: list, what: str, *, whole: bool) -> list:
    if limit is None:
        return given
    remaining = max(limit - spent, 0)
    explicit = sum((g for g in given if g is not None), 0 if whole else Decimal(0))
    if explicit > remaining:
        raise SpawnError(
            f"the children's {what} shares add up to {explicit}, but only {remaining} of this "
            f"run's {limit} remain (its own spend and its children's count)"
        )
    missing = [i for i, g in enumerate(given) if g is None]
    if not missing:
        return given
    rest = remaining - explicit
    even = rest // len(missing) if whole else (rest / len(missing)).quantize(CENT, ROUND_DOWN)
    if even <= 0:
        raise SpawnError(
            f"nothing of this run's {what} budget remains to split among the "
            f"{len(missing)} children given no share"
        )
    return [even if g is None else g for g in given]


def plan(parent: Run, tool_input: dict[str, Any], tree: str) -> list[ChildPlan]:
    """The children as they will be made, or SpawnError saying what is wrong."""
    config = settings.SHIFTLOG
    children = tool_input["children"]
    if parent.depth + 1 > config["FLEET_MAX_DEPTH"]:
        raise SpawnError(
            f"this run is at depth {parent.depth} of its fleet; runs may be spawned at most "
            f"{config['FLEET_MAX_DEPTH']} levels deep (SHIFTLOG_FLEET_MAX_DEPTH): do the work "
            "yourself"
        )
    if len(children) > config["FLEET_MAX_CHILDREN"]:
        raise SpawnError(
            f"{len(children)} children asked for; one spawn_runs call starts at most "
            f"{config['FLEET_MAX_CHILDREN']} (SHIFTLOG_FLEET_MAX_CHILDREN)"
        )
    files = workspaces.store().files(tree)
    folders = [_folder(c.get("from", "."), files) for c in children]
    spent_tokens, spent_cost = committed(parent)
    tokens = _carve(
        parent.max_tokens,
        spent_tokens,
        [c.get("budget_tokens") for c in children],
        "token",
        whole=True,
    )
    costs = _carve(
        parent.max_cost_usd,
        spent_cost,
        [
            None if c.get("budget_cost_usd") is None else Decimal(str(c["budget_cost_usd"]))
            for c in children
        ],
        "cost",
        whole=False,
    )
    return [
        ChildPlan(i, c, folder, files[folder].hash if folder else tree, tokens[i], costs[i])
        for i, (c, folder) in enumerate(zip(children, folders, strict=True))
    ]


def _create_child(parent: Run, p: ChildPlan, actor: str) -> Run:
    spec = p.spec
    script = spec.get("script")
    # Not given: scripted when it has a script, else the parent's (an external parent's children
    # are Shiftlog's own: the anthropic provider's).
    provider = spec.get("provider") or (
        Provider.SCRIPTED
        if script is not None
        else parent.provider
        if parent.provider != Provider.EXTERNAL
        else Provider.ANTHROPIC
    )
    if provider == Provider.SCRIPTED and script is None:
        raise SpawnError(f"children[{p.index}]: a scripted child needs a script")
    model = spec.get("model") or (parent.model if provider == parent.provider else None)
    try:
        # The parent's settings, but for what a child is told and given: its goal, checks,
        # driver and a share of the budget.
        child = RunSpec.of(
            parent,
            goal=spec["goal"],
            checks=spec["checks"],
            provider=provider,
            script=script,
            script_name=f"child {p.index} of run {parent.pk}" if script is not None else "",
            model=model,
            max_tokens=p.budget_tokens,
            max_cost_usd=p.budget_cost_usd,
            max_wall_seconds=None,
            rubric="",
            judge_model="",
            acceptance=[],
            protected_paths=[],
            heartbeat_seconds=None,
        )
        return services.create_run(
            child, created_by=parent.created_by, parent=parent, workspace_tree=p.tree, actor=actor
        )
    except services.RunError as e:
        raise SpawnError(f"children[{p.index}]: {e}") from None


def spawn(
    parent: Run,
    tool_use_id: str,
    tool_input: dict[str, Any],
    checkpoint: Checkpoint,
    *,
    actor: str,
    lease_owner: str | None,
    session_id: int | None = None,
) -> list[FleetChild]:
    """Make the children of one spawn_runs call (those not made yet) and record
    `fleet.spawned` in the parent's log. Call it inside the caller's transaction."""
    assert transaction.get_connection().in_atomic_block, "spawn needs the caller's transaction"
    made = {
        f.index: f
        for f in FleetChild.objects.filter(parent=parent, tool_use_id=tool_use_id).select_related(
            "child"
        )
    }
    plans = (
        plan(parent, tool_input, checkpoint.tree) if len(made) < len(tool_input["children"]) else []
    )
    wait = tool_input.get("wait", "all")
    for p in plans:
        if p.index in made:
            continue
        child = _create_child(parent, p, actor)
        made[p.index] = FleetChild.objects.create(
            parent=parent,
            child=child,
            tool_use_id=tool_use_id,
            index=p.index,
            wait=wait,
            folder=p.folder,
            base_tree=p.tree,
            from_checkpoint=checkpoint.number,
            budget_tokens=p.budget_tokens,
            budget_cost_usd=p.budget_cost_usd,
        )
    spawned = [made[i] for i in sorted(made)]
    if plans:
        eventlog.append_many(
            parent.pk,
            [
                NewEvent(
                    EventKind.FLEET_SPAWNED,
                    {
                        "tool_use_id": tool_use_id,
                        "wait": wait,
                        "checkpoint": checkpoint.number,
                        "children": [
                            {
                                "run_id": f.child_id,
                                "goal": f.child.goal,
                                "budget_tokens": f.budget_tokens,
                                "budget_cost_usd": None
                                if f.budget_cost_usd is None
                                else str(f.budget_cost_usd),
                                "from": f.folder or ".",
                            }
                            for f in spawned
                        ],
                    },
                    session_id=session_id,
                    actor=actor,
                )
            ],
            lease_owner=lease_owner,
        )
    return spawned
