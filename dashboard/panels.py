"""The run page's panels (header, meters, sessions, memory, checkpoints, artifacts): what each needs and
their rendering. The page, an htmx swap and a socket's push all go through here, so a panel looks
the same however it arrives; a push re-renders only the panels its events change."""

from __future__ import annotations

from django.template.loader import render_to_string

from agents import access, events, memory, pages
from agents.branches import in_ranges
from agents.models import Approval, Artifact, Checkpoint, Event, Run, Session
from agents.money import usd
from dashboard import cards, stream
from dashboard.fleets import tree as fleet

PANELS = ("run-header", "meters", "sessions", "memory", "checkpoints", "artifacts")
# Inside the header: the status, the provider and an external agent's last contact. Sent alone
# for events that change only it (an external agent's turn is a contact); never with the header,
# which holds it.
STATE = "run-state"
# The Fleet panel shows runs by who may see them, so a socket (whose renders are shared by every
# viewer with the same rights) never pushes it: it pushes a loader that fetches the panel for its
# own user (FLEET), and the panel re-reads itself every few seconds while the fleet is live.
FLEET = "fleet-loader"
FLEET_POLL_SECONDS = 3
# The side panels show the newest PANEL_ITEMS items; older ones come a page at a time ("Earlier
# sessions…", keyset pages served by dashboard/panel_views.py): a run with thousands of sessions
# and checkpoints opens, and is pushed to, as fast as a new one, and no page holds them all.
PANEL_ITEMS = pages.PANEL_ITEMS
# The panels each kind of event changes. Only those are rendered and sent again: a model turn
# moves the meters and its session's counters, not the checkpoints or artifacts.
PANELS_BY_KIND = {
    "run.created": {"run-header"},
    "run.status": {"run-header", "meters", "sessions"},
    "run.updated": {"run-header", "meters"},
    "model.turn": {"meters", "sessions", STATE},
    "session.started": {"run-header", "meters", "sessions"},
    "session.ended": {"run-header", "meters", "sessions"},
    "approval.requested": {"run-header"},
    "approval.decided": {"run-header"},
    "artifact.saved": {"artifacts"},
    "checkpoint.created": {"checkpoints"},
    "budget.warning": {"run-header", "meters"},
    "budget.exceeded": {"run-header", "meters"},
    "run.rewind_requested": {"run-header"},
    "run.rewound": set(PANELS),
    "run.forked": {"checkpoints"},
    "memory.saved": {"memory"},
    "memory.changed": {"memory"},
    "memory.deleted": {"memory"},
    # A fleet's parent: its spawn, its children ending, its waking and its merges move the Fleet
    # panel (FLEET above) and the fleet's spend in the meters.
    "fleet.spawned": {"meters", FLEET},
    "fleet.child_ended": {"meters", FLEET},
    "fleet.woke": {"meters", FLEET},
    "fleet.merge": {FLEET},
}


def panels_for(rows: list[stream.Row]) -> tuple[str, ...]:
    """The panels these events change, in page order."""
    wanted = set().union(*(PANELS_BY_KIND.get(r.kind, ()) for r in rows)) if rows else set()
    if "run-header" in wanted:
        wanted.discard(STATE)
    return tuple(p for p in (*PANELS, STATE, FLEET) if p in wanted)


def meters(run: Run, sessions_used: int, rollup=None) -> list[dict]:
    """The header's meters; a fleet's parent's tokens and dollars also show the whole fleet's
    (`rollup`: its own spend plus every descendant's)."""

    def meter(label, used, limit, shown_used, shown_limit, fleet=""):
        pct = min(100, round(100 * float(used) / float(limit))) if limit else None
        level = "" if pct is None else "over" if pct >= 100 else "warn" if pct >= 80 else ""
        return {
            "label": label,
            "used": shown_used,
            "limit": shown_limit if limit else "no limit",
            "pct": pct,
            "level": level,
            "fleet": fleet,
        }

    tokens_fleet = f"{rollup.tokens:,}" if rollup else ""
    cost_fleet = usd(rollup.cost_usd) if rollup else ""

    return [
        meter("Tokens", run.total_tokens, run.max_tokens, f"{run.total_tokens:,}",
              f"{run.max_tokens or 0:,}", tokens_fleet),
        meter("Cost" + (" (estimated)" if run.cost_estimated else ""), run.cost_usd,
              run.max_cost_usd, usd(run.cost_usd), usd(run.max_cost_usd or 0, 2),
              cost_fleet),
        meter("Sessions", sessions_used, run.max_sessions, str(sessions_used),
              str(run.max_sessions)),
        meter("Wall time", run.active_seconds, run.max_wall_seconds,
              f"{run.active_seconds:.0f} s", f"{run.max_wall_seconds} s"),
    ]  # fmt: skip


def context(
    run: Run,
    rights: access.Rights,
    *,
    panels: tuple[str, ...] = PANELS,
) -> dict:
    """What the panels (all, or those named) need; a handful of queries whatever the run's
    history: each list is its newest page."""
    out: dict = {"run": run, "rights": rights}
    if "meters" in panels or "sessions" in panels:
        if "sessions" in panels:
            out.update(sessions_page(run, None))
            total = len(out["sessions"]) + out["sessions_left"]
        else:
            total = Session.objects.filter(run=run).count()
        out["rollup"] = fleet.rollup_if_parent(run)
        out["meters"] = meters(run, total, out["rollup"])
    if "memory" in panels:
        out["memory_entries"] = memory.ranked(memory.entries(run))
    if "checkpoints" in panels:
        out.update(checkpoints_page(run, None))
    if "artifacts" in panels:
        out.update(artifacts_page(run, None))
    return out


def sessions_page(run: Run, before: int | None) -> dict:
    """Sessions with an index below `before` (the newest without it), a page, oldest first (the
    panel reads down to the newest; older pages go above)."""
    page = pages.panel_page(Session.objects.filter(run=run).defer("wake_up"), "index", before)
    return {
        "sessions": page.items[:PANEL_ITEMS][::-1],
        "sessions_before": page.next_before,
        "sessions_left": page.left,
    }


def checkpoints_page(run: Run, before: int | None) -> dict:
    """Checkpoints numbered below `before` (the newest without it), a page, newest first."""
    ranges = Event.objects.abandoned_ranges(run.pk)
    page = pages.panel_page(
        Checkpoint.objects.filter(run=run).select_related("session"), "number", before
    )
    return {
        "abandoned_ranges": ranges,
        "checkpoints": timeline(run, page.items, ranges)[:PANEL_ITEMS],
        "checkpoints_before": page.next_before,
        "checkpoints_left": page.left,
    }


def artifacts_page(run: Run, before: int | None) -> dict:
    """Artifacts with an id below `before` (the newest without it), a page, newest first."""
    page = pages.panel_page(Artifact.objects.filter(run=run), "pk", before)
    return {
        "artifacts": page.items[:PANEL_ITEMS],
        "artifacts_before": page.next_before,
        "artifacts_left": page.left,
    }


def timeline(run: Run, items: list[Checkpoint], ranges: list[tuple[int, int]]) -> list:
    """Checkpoints, newest first, each with what the timeline shows: the checkpoint before it
    (for "diff with previous"), whether a rewind abandoned it, its usage and its checks."""
    for i, c in enumerate(items):
        c.previous = items[i + 1] if i + 1 < len(items) else None
        c.abandoned = in_ranges(c.seq, ranges)
        c.is_head = c.pk == run.head_checkpoint_id
        usage = c.usage or {}
        c.tokens = int(usage.get("total_tokens") or 0)
        c.cost = usage.get("cost_usd") or "0"
        c.turns = usage.get("turns") or 0
        c.checks = (c.state or {}).get("checks") or {}
        c.checks_passing = sum(1 for r in c.checks.values() if r.get("passed"))
    return items


def render(run: Run, rights: access.Rights, panels: tuple[str, ...], **extra) -> str:
    """The named panels, each swapped out-of-band by id."""
    data = {**context(run, rights, panels=panels), "oob": True, **extra}
    return "".join(render_to_string(f"runs/detail.html#{name}", data) for name in panels)


def render_fleet_loader(run_id: int) -> str:
    """The same for every viewer: an element that fetches the Fleet panel for its own user."""
    return render_to_string("runs/detail.html#fleet-loader", {"run_id": run_id, "oob": True})


def render_push(
    run_id: int,
    rows: list[stream.Row],
    rights: access.Rights,
    panels: tuple[str, ...] | None = None,
) -> str:
    """What a run page's socket sends for new events: the rows, the approval cards they decide,
    and the panels they change (or those named)."""
    parts = []
    if rows:
        parts.append(
            render_to_string(
                "runs/detail.html#events-oob", {"rows": rows, "rights": rights, "run": None}
            )
        )
    decided = [r.p.approval_id for r in rows if isinstance(r.p, events.ApprovalDecided)]
    if decided:
        approvals = Approval.objects.select_related("run", "decided_by").filter(pk__in=decided)
        parts += [cards.render(a, can_decide=rights.decide, oob=True) for a in approvals]
    panels = panels_for(rows) if panels is None else panels
    if FLEET in panels:
        parts.append(render_fleet_loader(run_id))
        panels = tuple(p for p in panels if p != FLEET)
    if panels:
        run = Run.objects.get(pk=run_id)
        if not run.is_external:  # only an external run's state changes with a turn
            panels = tuple(p for p in panels if p != STATE)
        parts.append(render(run, rights, panels))
    return "".join(parts)
