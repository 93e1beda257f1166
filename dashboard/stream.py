"""The event stream as the run page shows it: rows built from Event values, read from the
database or taken from a message of the channel layer.

Rows are built from plain values (not model instances) so the same code serves a page query and a
message that came through the channel layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from agents import events
from agents.branches import in_ranges
from agents.models import Approval, Event

PAGE_SIZE = 50  # events on first open, and per "older" page
LONG_LINES = 12
LONG_CHARS = 1500
EVENT_FIELDS = ("pk", "run_id", "seq", "session_id", "kind", "actor", "payload", "created_at")


@dataclass
class Row:
    pk: int
    run_id: int
    seq: int
    kind: str
    actor: str
    payload: dict[str, Any]
    created_at: datetime
    session_id: int | None = None
    approval: Approval | None = None
    abandoned: bool = False  # on a branch a rewind left behind
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def p(self) -> Any:
        """The payload as its kind's type (agents/events.py); templates read `row.p.<field>`."""
        return events.read(self.kind, self.payload)

    @property
    def summary(self) -> str:
        entry = events.KINDS.get(self.kind)
        return entry.summary(self.p) if entry else events.short(self.payload)

    @property
    def label(self) -> str:
        return events.label(self.kind)

    @property
    def failed(self) -> bool:
        """Whether the row records a failure (a red row): the registry's word, per kind."""
        entry = events.KINDS.get(self.kind)
        return bool(entry and entry.failed(self.p))

    @property
    def css(self) -> str:
        return self.kind.replace(".", "-")

    def _field(self, name: str) -> Any:
        p = self.p
        return p.get(name) if isinstance(p, dict) else getattr(p, name, None)

    @property
    def text(self) -> str:
        return str(self._field("text") or "")

    @property
    def usage(self) -> dict[str, Any]:
        return self._field("usage") or {}

    @property
    def tool_name(self) -> str:
        return str(self._field("name") or self._field("tool") or "")

    @property
    def tool_input(self) -> dict[str, Any]:
        found = self._field("input")
        return found if isinstance(found, dict) else {}

    @property
    def command(self) -> str:
        return str(self.tool_input.get("command") or "")

    @property
    def input_json(self) -> str:
        return json.dumps(self.tool_input, indent=2, ensure_ascii=False)

    @property
    def output(self) -> str:
        return str(self._field("output") or "")

    @property
    def output_is_long(self) -> bool:
        return is_long(self.output)

    @property
    def output_head(self) -> str:
        return head(self.output)

    @property
    def is_error(self) -> bool:
        return self.kind == "tool.result" and self.failed

    @property
    def actor_label(self) -> str:
        if self.actor.startswith("worker:"):
            return "worker"
        return self.actor.removeprefix("user:")


def is_long(text: str) -> bool:
    return len(text) > LONG_CHARS or text.count("\n") > LONG_LINES


def head(text: str) -> str:
    lines = text.splitlines()[:LONG_LINES]
    return "\n".join(lines)[:LONG_CHARS]


def to_message(values: dict[str, Any]) -> dict[str, Any]:
    """An event's values made safe for any channel layer (msgpack has no datetimes)."""
    out = {k: values[k] for k in EVENT_FIELDS}
    out["created_at"] = values["created_at"].timestamp()
    return out


def from_message(values: dict[str, Any]) -> Row:
    created = values["created_at"]
    if not isinstance(created, datetime):
        created = datetime.fromtimestamp(created, tz=UTC)
    return Row(**{**{k: values[k] for k in EVENT_FIELDS}, "created_at": created})


def attach_approvals(rows: list[Row]) -> list[Row]:
    """One query for the approvals the rows mention, so each card shows its current state."""
    asks = [r for r in rows if isinstance(r.p, events.ApprovalRequested)]
    ids = {r.p.approval_id for r in asks} - {None}
    if ids:
        found = Approval.objects.select_related("run", "decided_by").in_bulk(ids)
        for r in asks:
            r.approval = found.get(r.p.approval_id)
    return rows


def mark_abandoned(rows: list[Row], ranges: list[tuple[int, int]]) -> list[Row]:
    """Flag the rows on abandoned branches, from ranges read once (no query per row)."""
    if ranges:
        for r in rows:
            r.abandoned = in_ranges(r.seq, ranges)
    return rows


def newest(run_id: int, *, before: int | None = None, limit: int = PAGE_SIZE) -> list[Row]:
    """The newest `limit` events (before `before`), oldest first: the (run, seq) index only."""
    qs = Event.objects.filter(run_id=run_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    values = list(qs.order_by("-seq").values(*EVENT_FIELDS)[:limit])
    values.reverse()
    return attach_approvals([Row(**v) for v in values])


def after(run_id: int, seq: int, *, limit: int = 1000) -> list[Row]:
    values = Event.objects.for_run(run_id, after=seq).values(*EVENT_FIELDS)[:limit]
    return attach_approvals([Row(**v) for v in values])
