"""The approvals inbox, paged and fair between runs: one section per run, the runs in the order of
their oldest waiting call, each showing its oldest few cards and how many more wait. One run
asking for hundreds of calls fills one section, never the page: another run's single waiting
call is in the first page's sections as long as it is among the oldest runs waiting.

`?run=ID` shows one run's waiting calls, paged; `?page=N` pages the sections. The view, the
socket's refresh after a reconnect and the tests read the same `context()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, F, Min, Subquery, Window
from django.db.models.functions import RowNumber

from agents import access, inputs
from agents.models import Approval, Run
from dashboard import cards

RUNS_PER_PAGE = 20  # sections on a page
CARDS_PER_RUN = 5  # cards in a run's section; the rest behind "N more"
CARDS_PER_RUN_PAGE = 50  # cards on a page of one run's calls


@dataclass
class Section:
    run: Run
    approvals: list[Approval]
    waiting: int

    @property
    def more(self) -> int:
        return self.waiting - len(self.approvals)


@dataclass
class Pages:
    """Where a page is among the pages (`num_pages` only where it was counted)."""

    number: int
    has_next: bool
    num_pages: int | None = None

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_other_pages(self) -> bool:
        return self.has_previous or self.has_next

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1


def _number(raw: Any) -> int:
    try:
        return min(inputs.object_id(raw, what="a page"), 1_000_000)
    except inputs.InputError:
        return 1


def context(user, query) -> dict[str, Any]:
    """What the inbox shows for this user and query string (`run`, `page`); bad values fall back
    to the first page. `pending_approvals` is the header's count, read with the page's first
    query (the list page's queries stay a fixed few however many calls wait)."""
    pending = access.pending_approvals(user)
    run_id = query.get("run")
    if run_id:
        try:
            run_id = inputs.object_id(run_id, what="a run id")
        except inputs.InputError:
            run_id = None
    if run_id:
        return _one_run(user, pending, run_id, _number(query.get("page")))
    number = _number(query.get("page"))
    # Every pending row has the one status: grouped by it, the count is a single row.
    total = Subquery(pending.order_by().values("status").annotate(n=Count("pk")).values("n"))
    start = (number - 1) * RUNS_PER_PAGE
    groups = list(
        pending.order_by()
        .values("run_id")
        .annotate(first=Min("created_at"), waiting=Count("pk"), total=total)
        .order_by("first", "run_id")[start : start + RUNS_PER_PAGE + 1]
    )
    waiting = {g["run_id"]: g["waiting"] for g in groups[:RUNS_PER_PAGE]}
    count = groups[0]["total"] if groups else (0 if number == 1 else _count(pending))
    return {
        "sections": _sections(pending, waiting, user),
        "page": Pages(number, has_next=len(groups) > RUNS_PER_PAGE),
        "only_run": None,
        "total": count,
        "pending_approvals": count,
    }


def _count(pending) -> int:
    return pending.order_by().count()


def _one_run(user, pending, run_id: int, number: int) -> dict[str, Any]:
    page = Paginator(pending.filter(run_id=run_id), CARDS_PER_RUN_PAGE).get_page(number)
    items = list(page.object_list)
    cards.mark_fleets(items, user)
    count = _count(pending)
    return {
        "sections": [Section(items[0].run, items, page.paginator.count)] if items else [],
        "page": Pages(page.number, page.has_next(), page.paginator.num_pages),
        "only_run": run_id,
        "total": count,
        "pending_approvals": count,
    }


def _sections(pending, waiting: dict[int, int], user) -> list[Section]:
    """Each run's oldest CARDS_PER_RUN waiting calls, in one query (a window per run)."""
    if not waiting:
        return []
    ranked = pending.filter(run_id__in=list(waiting)).annotate(
        place=Window(RowNumber(), partition_by=F("run_id"), order_by=[F("created_at"), F("pk")])
    )
    by_run: dict[int, list[Approval]] = {run_id: [] for run_id in waiting}
    for approval in ranked.filter(place__lte=CARDS_PER_RUN):
        by_run[approval.run_id].append(approval)
    shown = [a for items in by_run.values() for a in items]
    cards.mark_fleets(shown, user)
    return [
        Section(by_run[run_id][0].run, by_run[run_id], count)
        for run_id, count in waiting.items()
        if by_run[run_id]
    ]
