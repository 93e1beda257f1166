"""A fleet at a glance: what the Overview page and `manage.py overview` show, for any set of runs.

Counts by status, approvals waiting and their age, runs that look stuck (running or verifying,
yet no event for `SHIFTLOG_STUCK_MINUTES`), external runs whose agent has gone silent past its
heartbeat window (stalled: `Run.stalled`), spend today and this week, and for every active run
its burn rate and the time left to each of its caps. Everything is aggregated in the database in
a fixed number of queries, however many runs there are; the callers choose which runs (a person
sees only theirs: agents.access) and render the figures.

Times are the server's (settings.TIME_ZONE): "today" starts at its midnight, "this week" at
Monday's. Spend is read from the events that cost something (model turns and judge verdicts,
each carrying its `cost_usd`), so it counts work on abandoned branches too: that money is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Count, Exists, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from agents.models import (
    STALLABLE_STATUSES,
    Approval,
    Event,
    EventKind,
    Provider,
    Run,
    RunStatus,
)

# A worker is driving these; a run in them that writes no event for a while looks stuck.
ACTIVE_STATUSES = (RunStatus.RUNNING, RunStatus.VERIFYING)
SPEND_KINDS = (EventKind.MODEL_TURN, EventKind.JUDGE_VERDICT)
SINCE_CHOICES = ("today", "week")
# Burn rates are measured over this much of the recent past (or since the run started).
BURN_WINDOW = timedelta(minutes=10)
SHOWN = 50  # approvals and stuck runs listed (all are counted)
MONEY = Decimal("0.000001")
TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


# --- the filters the figures link to (the runs list applies the same) --------------------------
def stuck_minutes() -> int:
    return settings.SHIFTLOG["STUCK_MINUTES"]


def last_event_at() -> Subquery:
    """The time of a run's newest event (the (run, seq) index, not a scan of the log)."""
    latest = Event.objects.filter(run=OuterRef("pk")).order_by("-seq")
    return Subquery(latest.values("created_at")[:1])


def stuck(runs: models.QuerySet[Run], now: datetime) -> models.QuerySet[Run]:
    """Running or verifying runs with no event for more than the stuck threshold."""
    cutoff = now - timedelta(minutes=stuck_minutes())
    return (
        runs.filter(status__in=ACTIVE_STATUSES)
        .annotate(last_event=last_event_at())
        .filter(Q(last_event__lt=cutoff) | Q(last_event__isnull=True))
    )


def stalled(runs: models.QuerySet[Run], now: datetime) -> models.QuerySet[Run]:
    """External runs that should be working but whose agent has been silent for longer than
    its heartbeat window (`Run.stalled_at`). Each run has its own window, so the few external
    runs that could be stalled are read (one query) and measured here; the result is a
    queryset of them, to filter, count or list."""
    candidates = runs.filter(provider=Provider.EXTERNAL, status__in=STALLABLE_STATUSES).only(
        "pk", "provider", "status", "created_at", "last_contact_at", "heartbeat_seconds"
    )
    return runs.filter(pk__in=[r.pk for r in candidates if r.stalled_at(now)])


def waiting_for_approval(runs: models.QuerySet[Run]) -> models.QuerySet[Run]:
    return runs.filter(Exists(Approval.objects.pending().filter(run=OuterRef("pk"))))


def window_start(name: str, now: datetime) -> datetime:
    """The start of `today` or this `week` (Monday) at the server's midnight."""
    local = timezone.localtime(now)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if name == "today":
        return midnight
    if name == "week":
        return midnight - timedelta(days=local.weekday())
    raise ValueError(f"since must be one of {', '.join(SINCE_CHOICES)}, not {name!r}")


def spent_since(runs: models.QuerySet[Run], start: datetime) -> models.QuerySet[Run]:
    """Runs that spent something (a model turn or a judge's verdict) since `start`: those whose
    latest spend is that recent. A run's log is appended in time order (agents/eventlog.py stamps
    each event as it takes the next seq), so the latest is found walking the (run, seq) index
    back from the end, not by reading every turn of a long run to compare its time (the runs
    list with this filter took 50 ms on 10,000 runs, one of 33,000 turns; now 15-20 ms)."""
    latest = (
        Event.objects.filter(run=OuterRef("pk"), kind__in=SPEND_KINDS)
        .order_by("-seq")
        .values("created_at")[:1]
    )
    return runs.annotate(latest_spend=Subquery(latest)).filter(latest_spend__gte=start)


# --- sums over the log's payloads ------------------------------------------------------------
def _cost() -> Cast:
    return Cast(KT("payload__cost_usd"), models.DecimalField(max_digits=18, decimal_places=6))


def _tokens() -> Any:
    parts = [
        Coalesce(Cast(KT(f"payload__usage__{key}"), models.BigIntegerField()), 0)
        for key in TOKEN_KEYS
    ]
    return parts[0] + parts[1] + parts[2] + parts[3]


def _money(value: Any) -> Decimal:
    return Decimal(str(value or 0)).quantize(MONEY)


# --- forecasts -------------------------------------------------------------------------------
def duration(seconds: float) -> str:
    """ "~2 h 10 min", "~5 min", "< 1 min", "~3 d 4 h"."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "< 1 min"
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"~{days} d {hours} h" if hours else f"~{days} d"
    if hours:
        return f"~{hours} h {minutes} min" if minutes else f"~{hours} h"
    return f"~{minutes} min"


@dataclass(frozen=True)
class Forecast:
    """The time left to one cap at the current burn rate."""

    cap: str  # tokens, dollars, wall time
    state: str  # no_cap, reached, no_burn, eta
    seconds: float | None = None

    def __str__(self) -> str:
        if self.state == "no_cap":
            return f"{self.cap}: no cap"
        if self.state == "reached":
            return f"{self.cap}: cap reached"
        if self.state == "no_burn":
            return f"{self.cap}: not burning"
        return f"{self.cap} cap in {duration(self.seconds or 0)}"

    def as_json(self) -> dict[str, Any]:
        return {"cap": self.cap, "state": self.state, "seconds": self.seconds, "text": str(self)}


def forecast(cap: str, used: Any, limit: Any, spent: Any, over_seconds: float) -> Forecast:
    """The time to `limit` from `used`, at the rate of `spent` per `over_seconds`."""
    if not limit:
        return Forecast(cap, "no_cap")
    left = Decimal(str(limit)) - Decimal(str(used))
    if left <= 0:
        return Forecast(cap, "reached")
    if not spent or Decimal(str(spent)) <= 0:
        return Forecast(cap, "no_burn")
    return Forecast(
        cap, "eta", round(float(left * Decimal(str(over_seconds)) / Decimal(str(spent))), 1)
    )


@dataclass(frozen=True)
class Burn:
    """An active run's burn over the recent window, and the time left to each of its caps."""

    run: Run
    window_seconds: float
    tokens: int
    cost_usd: Decimal

    @property
    def tokens_per_minute(self) -> float:
        return self.tokens * 60 / self.window_seconds

    @property
    def usd_per_hour(self) -> Decimal:
        return _money(self.cost_usd * 3600 / Decimal(str(self.window_seconds)))

    @property
    def forecasts(self) -> list[Forecast]:
        run = self.run
        span = self.window_seconds
        return [
            forecast("tokens", run.total_tokens, run.max_tokens, self.tokens, span),
            forecast("dollars", run.cost_usd, run.max_cost_usd, self.cost_usd, span),
            # A running run spends a second of active time a second. active_seconds is summed
            # when a slice ends, so this is the most it has left.
            forecast("wall time", run.active_seconds, run.max_wall_seconds, 1, 1.0),
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.run.pk,
            "goal": self.run.goal[:200],
            "status": self.run.status,
            "window_seconds": round(self.window_seconds, 1),
            "tokens": self.tokens,
            "cost_usd": str(self.cost_usd),
            "tokens_per_minute": round(self.tokens_per_minute, 1),
            "usd_per_hour": str(self.usd_per_hour),
            "forecasts": [f.as_json() for f in self.forecasts],
        }


def burn_window(run: Run, now: datetime) -> float:
    """Seconds the burn is measured over: the window, or since the run started if later."""
    span = BURN_WINDOW.total_seconds()
    if run.started_at is not None:
        span = min(span, (now - run.started_at).total_seconds())
    return max(span, 1.0)


def burns(runs: models.QuerySet[Run], now: datetime) -> list[Burn]:
    """Every active run with its model turns' tokens and dollars in the window: one query."""
    recent = Event.objects.filter(
        run=OuterRef("pk"), kind__in=SPEND_KINDS, created_at__gte=now - BURN_WINDOW
    ).order_by()
    tokens = recent.filter(kind=EventKind.MODEL_TURN).values("run").annotate(n=Sum(_tokens()))
    cost = recent.values("run").annotate(usd=Sum(_cost()))
    active = (
        runs.filter(status__in=ACTIVE_STATUSES)
        .annotate(
            window_tokens=Subquery(tokens.values("n"), output_field=models.BigIntegerField()),
            window_cost=Subquery(
                cost.values("usd"),
                output_field=models.DecimalField(max_digits=18, decimal_places=6),
            ),
        )
        .order_by("pk")
    )
    return [
        Burn(
            run=r,
            window_seconds=burn_window(r, now),
            tokens=int(r.window_tokens or 0),
            cost_usd=_money(r.window_cost),
        )
        for r in active
    ]


# --- the whole overview ----------------------------------------------------------------------
@dataclass(frozen=True)
class Waiting:
    approval: Approval
    age_seconds: float

    @property
    def age(self) -> str:
        return duration(self.age_seconds).removeprefix("~")


@dataclass(frozen=True)
class StuckRun:
    run: Run
    last_event: datetime | None
    quiet_seconds: float

    @property
    def quiet(self) -> str:
        return duration(self.quiet_seconds).removeprefix("~")


@dataclass(frozen=True)
class StalledRun:
    run: Run
    now: datetime

    @property
    def silent_seconds(self) -> float:
        return self.run.silent_seconds(self.now)

    @property
    def silent(self) -> str:
        """In seconds under a minute: a heartbeat may be a few seconds long."""
        if self.silent_seconds < 60:
            return f"{int(self.silent_seconds)} s"
        return duration(self.silent_seconds).removeprefix("~")


@dataclass
class Overview:
    now: datetime
    counts: list[tuple[str, str, int]]  # (status, label, runs), every status
    approvals_waiting: int
    approvals: list[Waiting]
    stuck_minutes: int
    stuck_count: int
    stuck: list[StuckRun]
    today_start: datetime
    week_start: datetime
    spend: dict[str, dict[str, Any]]  # today|week -> {"usd", "tokens"}
    burns: list[Burn] = field(default_factory=list)
    stalled_count: int = 0
    stalled: list[StalledRun] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(n for _, _, n in self.counts)

    @property
    def timezone_name(self) -> str:
        return settings.TIME_ZONE

    def as_json(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "timezone": self.timezone_name,
            "runs": self.total,
            "counts": {status: n for status, _, n in self.counts},
            "approvals_waiting": self.approvals_waiting,
            "approvals": [
                {
                    "id": w.approval.pk,
                    "run": w.approval.run_id,
                    "tool": w.approval.tool_name,
                    "requested_at": w.approval.created_at.isoformat(),
                    "age_seconds": round(w.age_seconds, 1),
                }
                for w in self.approvals
            ],
            "stuck_minutes": self.stuck_minutes,
            "stuck": self.stuck_count,
            "stuck_runs": [
                {
                    "run": s.run.pk,
                    "status": s.run.status,
                    "last_event_at": s.last_event.isoformat() if s.last_event else None,
                    "quiet_seconds": round(s.quiet_seconds, 1),
                }
                for s in self.stuck
            ],
            "stalled": self.stalled_count,
            "stalled_runs": [
                {
                    "run": s.run.pk,
                    "status": s.run.status,
                    "last_contact_at": (
                        s.run.last_contact_at.isoformat() if s.run.last_contact_at else None
                    ),
                    "heartbeat_seconds": s.run.heartbeat_window,
                    "silent_seconds": round(s.silent_seconds, 1),
                }
                for s in self.stalled
            ],
            "spend": {
                name: {
                    "since": start.isoformat(),
                    "usd": str(self.spend[name]["usd"]),
                    "tokens": self.spend[name]["tokens"],
                }
                for name, start in (("today", self.today_start), ("week", self.week_start))
            },
            "active": [b.as_json() for b in self.burns],
        }


def spend(runs: models.QuerySet[Run], today: datetime, week: datetime) -> dict[str, dict]:
    """Dollars and tokens spent today and this week, in one query."""
    events = Event.objects.filter(
        run__in=runs.values("pk"), kind__in=SPEND_KINDS, created_at__gte=min(today, week)
    )
    turn = Q(kind=EventKind.MODEL_TURN)
    found = events.aggregate(
        today_usd=Sum(_cost(), filter=Q(created_at__gte=today)),
        week_usd=Sum(_cost(), filter=Q(created_at__gte=week)),
        today_tokens=Sum(_tokens(), filter=turn & Q(created_at__gte=today)),
        week_tokens=Sum(_tokens(), filter=turn & Q(created_at__gte=week)),
    )
    return {
        name: {"usd": _money(found[f"{name}_usd"]), "tokens": int(found[f"{name}_tokens"] or 0)}
        for name in ("today", "week")
    }


def compute(
    runs: models.QuerySet[Run],
    approvals: models.QuerySet[Approval],
    *,
    now: datetime | None = None,
) -> Overview:
    """The overview of `runs`, with `approvals` the pending ones among them (oldest first)."""
    now = now or timezone.now()
    by_status = dict(runs.order_by().values_list("status").annotate(n=Count("pk")))
    counts = [(value, label, by_status.get(value, 0)) for value, label in RunStatus.choices]
    waiting = list(approvals.select_related("run").order_by("created_at", "pk")[:SHOWN])
    stuck_runs = stuck(runs, now).order_by("last_event", "pk")
    listed = list(stuck_runs[:SHOWN])
    stalled_runs = sorted(stalled(runs, now), key=lambda r: (-r.silent_seconds(now), r.pk))
    today, week = window_start("today", now), window_start("week", now)
    return Overview(
        now=now,
        counts=counts,
        approvals_waiting=approvals.count() if len(waiting) == SHOWN else len(waiting),
        approvals=[Waiting(a, (now - a.created_at).total_seconds()) for a in waiting],
        stuck_minutes=stuck_minutes(),
        stuck_count=stuck_runs.count() if len(listed) == SHOWN else len(listed),
        stuck=[
            StuckRun(
                r,
                r.last_event,
                (now - (r.last_event or r.created_at)).total_seconds(),
            )
            for r in listed
        ],
        today_start=today,
        week_start=week,
        spend=spend(runs, today, week),
        burns=burns(runs, now),
        stalled_count=len(stalled_runs),
        stalled=[StalledRun(r, now) for r in stalled_runs[:SHOWN]],
    )
