"""The run page's panels (header, meters, sessions, memory, checkpoints, artifacts): what each needs and
their rendering. The page, an htmx swap and a socket's push all go through here, so a panel looks
the same however it arrives; a push re-renders only the panels its events change."""

from __future__ import annotations

from django.template.loader import render_to_string

from agents import memory
from agents.models import Approval, Artifact, Checkpoint, Event, Run, Session, in_ranges
from dashboard import access, cards, stream

PANELS = ("run-header", "meters", "sessions", "memory", "checkpoints", "artifacts")
# Inside the header: the status, the provider and an external agent's last contact. Sent alone
# for events that change only it (an external agent's turn is a contact); never with the header,
# which holds it.
STATE = "run-state"
# The side panels show this many of the newest items (all with ?all=1): a run with thousands of
# sessions and checkpoints opens, and is pushed to, as fast as a new one.
PANEL_ITEMS = 25
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
}


def panels_for(rows: list[stream.Row]) -> tuple[str, ...]:
    """The panels these events change, in page order."""
    wanted = set().union(*(PANELS_BY_KIND.get(r.kind, ()) for r in rows)) if rows else set()
    if "run-header" in wanted:
        wanted.discard(STATE)
    return tuple(p for p in (*PANELS, STATE) if p in wanted)


def meters(run: Run, sessions_used: int) -> list[dict]:
    def meter(label, used, limit, shown_used, shown_limit):
        pct = min(100, round(100 * float(used) / float(limit))) if limit else None
        level = "" if pct is None else "over" if pct >= 100 else "warn" if pct >= 80 else ""
        return {
            "label": label,
            "used": shown_used,
            "limit": shown_limit if limit else "no limit",
            "pct": pct,
            "level": level,
        }

    return [
        meter("Tokens", run.total_tokens, run.max_tokens, f"{run.total_tokens:,}",
              f"{run.max_tokens or 0:,}"),
        meter("Cost" + (" (estimated)" if run.cost_estimated else ""), run.cost_usd,
              run.max_cost_usd, f"${run.cost_usd:.4f}", f"${run.max_cost_usd or 0:.2f}"),
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
    everything: bool = False,
) -> dict:
    """What the panels (all, or those named) need; a handful of queries whatever the run's
    history."""
    limit = None if everything else PANEL_ITEMS
    out: dict = {"run": run, "rights": rights}
    if "meters" in panels or "sessions" in panels:
        if "sessions" in panels:
            sessions, hidden = first_n(
                Session.objects.filter(run=run).defer("wake_up").order_by("-index"), limit
            )
            total = len(sessions[:limit]) + hidden
            out.update({"sessions": sessions[:limit][::-1], "sessions_hidden": hidden})
        else:
            total = Session.objects.filter(run=run).count()
        out["meters"] = meters(run, total)
    if "memory" in panels:
        out["memory_entries"] = memory.ranked(memory.entries(run))
    if "checkpoints" in panels:
        out["abandoned_ranges"] = Event.objects.abandoned_ranges(run.pk)
        items, hidden = first_n(
            Checkpoint.objects.filter(run=run).select_related("session").order_by("-seq", "-pk"),
            limit,
        )
        out["checkpoints"] = timeline(run, items, out["abandoned_ranges"])[:limit]
        out["checkpoints_hidden"] = hidden
    if "artifacts" in panels:
        artifacts, hidden = first_n(Artifact.objects.filter(run=run).order_by("-seq", "-pk"), limit)
        out.update({"artifacts": artifacts[:limit], "artifacts_hidden": hidden})
    return out


def first_n(qs, limit: int | None) -> tuple[list, int]:
    """The first `limit` rows of an ordered queryset (all with None), plus the next one when
    there is one (the timeline's "diff with previous" needs it), and how many rows are left
    out: one query, and a count only when the list is cut."""
    if limit is None:
        return list(qs), 0
    rows = list(qs[: limit + 1])
    return rows, (qs.count() - limit if len(rows) > limit else 0)


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
    decided = [r.payload.get("approval_id") for r in rows if r.kind == "approval.decided"]
    if decided:
        approvals = Approval.objects.select_related("run", "decided_by").filter(pk__in=decided)
        parts += [cards.render(a, can_decide=rights.decide, oob=True) for a in approvals]
    panels = panels_for(rows) if panels is None else panels
    if panels:
        run = Run.objects.get(pk=run_id)
        if not run.is_external:  # only an external run's state changes with a turn
            panels = tuple(p for p in panels if p != STATE)
        parts.append(render(run, rights, panels))
    return "".join(parts)
