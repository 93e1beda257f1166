"""Keyset (cursor) pages for the long lists: the runs list, and a run page's sessions, checkpoints
and artifacts. A page is "the N rows after this one" in a fixed order that an index serves, so the
last page costs what the first does (no OFFSET walking past the rows before it), and a page never
holds more than N rows. Counts are bounded: a list says "1,000+" rather than count a million rows.

The runs list is ordered newest first by (created_at, id): runs made in the same instant keep a
stable order. Its cursor names the row a page ends at, `<microseconds since 1970 UTC>-<id>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import Q, QuerySet

from agents.inputs import MAX_BIG_INT, InputError
from agents.models import Run

RUNS_PER_PAGE = 25
PANEL_ITEMS = 25  # sessions, checkpoints or artifacts on a run page at a time
COUNT_CAP = 1000  # the runs list counts up to this many, then says "1,000+"

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CURSOR = re.compile(r"(\d{1,18})-(\d{1,19})", re.ASCII)


@dataclass(frozen=True)
class Cursor:
    """Where a page of runs starts (exclusive): a run's created_at and id."""

    created_at: datetime
    pk: int

    def __str__(self) -> str:
        delta = self.created_at - EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return f"{micros}-{self.pk}"

    @classmethod
    def of(cls, run: Run) -> Cursor:
        return cls(run.created_at, run.pk)

    @classmethod
    def parse(cls, text: str, *, what: str) -> Cursor:
        """A cursor from a link, or InputError saying what is wrong with it."""
        m = _CURSOR.fullmatch(text.strip())
        if not m:
            raise InputError(f"{what}: not a page link this list made ({text[:40]!r})", what)
        micros, pk = int(m[1]), int(m[2])
        try:
            at = EPOCH + timedelta(microseconds=micros)
        except OverflowError:
            raise InputError(f"{what}: the time in it is out of range", what) from None
        if not 0 < pk <= MAX_BIG_INT:
            raise InputError(f"{what}: the id in it is out of range", what)
        return cls(at, pk)


def runs_cursor(run: Run) -> str:
    return str(Cursor.of(run))


@dataclass
class RunsPage:
    rows: list[Run]
    newer: str | None = None  # cursor for "← Newer" (None: this is the first page)
    older: str | None = None  # cursor for "Older →" (None: this is the last page)
    count: int = 0
    count_capped: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        return self.newer is None

    @property
    def count_label(self) -> str:
        return f"{self.count:,}+" if self.count_capped else f"{self.count:,}"


def runs_page(
    qs: QuerySet[Run],
    *,
    after: Cursor | None = None,
    before: Cursor | None = None,
    oldest: bool = False,
    size: int = RUNS_PER_PAGE,
) -> RunsPage:
    """One page of `qs` (already filtered; `for_list()` is applied here), newest first: the first
    page, the page after `after` (older rows), the page before `before` (newer rows), or the
    oldest page. One query for the rows (size + 1 to see whether more follow) and, unless they
    are the whole list, one bounded count."""
    listed = qs.for_list()
    if before is not None or oldest:
        # Read upwards from the cursor (or from the oldest run), then show newest first.
        up = listed.order_by("created_at", "pk")
        if before is not None:
            up = up.filter(
                Q(created_at__gte=before.created_at)
                & (Q(created_at__gt=before.created_at) | Q(pk__gt=before.pk))
            )
        rows = list(up[: size + 1])
        more_newer = len(rows) > size
        rows = rows[:size][::-1]
        has_older = before is not None and bool(rows)
        newer = runs_cursor(rows[0]) if more_newer and rows else None
        older = runs_cursor(rows[-1]) if has_older else None
        if before is not None and not rows:
            older = str(before)  # nothing newer any more: the way back stays
    else:
        down = older_than(listed, after)
        rows = list(down[: size + 1])
        more_older = len(rows) > size
        rows = rows[:size]
        older = runs_cursor(rows[-1]) if more_older else None
        newer = (runs_cursor(rows[0]) if rows else str(after)) if after is not None else None
    if newer is None and older is None:  # the whole list is on this page: no need to count it
        count, capped = len(rows), False
    else:
        count, capped = bounded_count(qs)
    return RunsPage(rows=rows, newer=newer, older=older, count=count, count_capped=capped)


def older_than(qs: QuerySet[Run], cursor: Cursor | None) -> QuerySet[Run]:
    """`qs` newest first, from the run after `cursor` (from the newest without one). The
    leading `created_at <=` lets the index range-scan; the OR settles runs of the same instant."""
    qs = qs.order_by("-created_at", "-pk")
    if cursor is None:
        return qs
    return qs.filter(
        Q(created_at__lte=cursor.created_at)
        & (Q(created_at__lt=cursor.created_at) | Q(pk__lt=cursor.pk))
    )


def bounded_count(qs: QuerySet, cap: int | None = None) -> tuple[int, bool]:
    """How many rows, counting at most `cap` + 1 of them: (n, True) means "n or more"."""
    cap = COUNT_CAP if cap is None else cap
    n = qs.order_by().values("pk")[: cap + 1].count()
    return (cap, True) if n > cap else (n, False)


@dataclass
class PanelPage:
    """One page of a run page's panel: its items and where the next (older) page starts."""

    items: list
    next_before: int | None  # the key to ask `?before=` for next; None: nothing older
    left: int = 0  # how many older items there are after this page


def panel_page(qs: QuerySet, key: str, before: int | None, size: int = PANEL_ITEMS) -> PanelPage:
    """The `size` items of `qs` with the highest `key` below `before` (all, without it), highest
    first; `items` holds one more when there is one (a checkpoint's "diff with previous" needs
    it). The key is unique within a run and indexed with it ((run, index) for sessions,
    (run, number) for checkpoints, the id for artifacts)."""
    if before is not None:
        qs = qs.filter(**{f"{key}__lt": before})
    items = list(qs.order_by(f"-{key}")[: size + 1])
    if len(items) <= size:
        return PanelPage(items, None, 0)
    last = getattr(items[size - 1], key)
    return PanelPage(items, last, qs.filter(**{f"{key}__lt": last}).count())
