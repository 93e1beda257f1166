"""What the timeline page draws for a window of a run (a seq range at a width in pixels), read
from the run's index in this process (dashboard.timeline_index): lanes, the turns and tool calls
one by one or, zoomed out, blocks per lane, the waits, checkpoints and rewinds, and the charts.

Everything is bounded whatever the run's size: items one by one only up to DETAIL_ITEMS, else at
most MAX_LANES lanes of width/4 blocks, MAX_MARKS checkpoints and rewinds, MAX_SPANS waits,
MAX_SESSION_BARS session bars and tool durations from at most TOOL_SAMPLE calls.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from agents.branches import abandoned, in_ranges
from agents.models import Run
from dashboard.fleets import timeline as timeline_fleet
from dashboard.timeline_index import OPEN, TOOL, RunIndex

DETAIL_ITEMS = 1500
MAX_LANES = 24
MAX_MARKS = 300
MAX_SPANS = 300
MAX_SESSION_BARS = 120
TOOL_SAMPLE = 20_000
PX_PER_BUCKET = 4
WIDTH_MIN, WIDTH_MAX, WIDTH_DEFAULT = 200, 4000, 1200


@dataclass(frozen=True)
class Window:
    first: int  # seq
    last: int
    width: int


@dataclass(frozen=True)
class Lane:
    id: int
    first: int  # session indexes
    last: int

    @property
    def label(self) -> str:
        if self.first == self.last:
            return f"Session {self.first}"
        return f"Sessions {self.first}\u2013{self.last}"


def lanes_for(sessions: list[int]) -> list[Lane]:
    """One lane a session; past MAX_LANES, consecutive sessions share a lane."""
    if len(sessions) <= MAX_LANES:
        return [Lane(i, s, s) for i, s in enumerate(sessions)]
    per = math.ceil(len(sessions) / MAX_LANES)
    groups = [sessions[i : i + per] for i in range(0, len(sessions), per)]
    return [Lane(i, g[0], g[-1]) for i, g in enumerate(groups)]


def _r(ms: float) -> float:
    return round(ms, 1)


class Answer:
    """The JSON for one window of one run."""

    def __init__(
        self,
        run: Run,
        index: RunIndex,
        window: Window,
        children: list[timeline_fleet.Child] | None = None,
        children_total: int = 0,
    ) -> None:
        self.run, self.ix, self.w = run, index, window
        self.children, self.children_total = children or [], children_total
        self.ranges = abandoned((m.to_seq, m.from_seq) for m in index.rewinds)
        self.start_ms = index.ms_at(window.first)
        self.end_ms = max(index.ms_at(window.last), self.start_ms + 1.0)
        if self.children and window.last == index.last_seq:
            # A fleet's parent waits while its children work: its window's end reaches theirs.
            self.end_ms = max(self.end_ms, timeline_fleet.last_ms(self.children) or 0.0)
        self.now_ms = index.ev_ms[-1]
        self.lanes = lanes_for(index.sessions_in(window.first, window.last))
        self.ranges_by_lane = [
            index.item_range(lane.first, lane.last, window.first, window.last)
            for lane in self.lanes
        ]
        self.n_buckets = max(1, window.width // PX_PER_BUCKET)
        self.bucket_ms = (self.end_ms - self.start_ms) / self.n_buckets

    def as_json(self) -> dict[str, Any]:
        ix, w = self.ix, self.w
        n_items = sum(b - a for a, b in self.ranges_by_lane)
        detail = n_items <= DETAIL_ITEMS
        out: dict[str, Any] = {
            "run": {
                "id": self.run.pk,
                "status": self.run.status,
                "last_seq": ix.last_seq,
                "sessions": len(ix.session_seqs),
            },
            "window": {
                "from": w.first,
                "to": w.last,
                "start_ms": _r(self.start_ms),
                "end_ms": _r(self.end_ms),
                "width": w.width,
                "mode": "detail" if detail else "buckets",
                "bucket_ms": _r(self.bucket_ms),
                "bucket_seqs": self.bucket_seqs(),
                "counts": {
                    "events": bisect_right(ix.ev_seq, w.last) - bisect_left(ix.ev_seq, w.first),
                    "items": n_items,
                    "errors": sum(ix.err_pre[b] - ix.err_pre[a] for a, b in self.ranges_by_lane),
                    "lanes": len(self.lanes),
                },
            },
            "lanes": [
                {"id": lane.id, "label": lane.label, "first": lane.first, "last": lane.last}
                for lane in self.lanes
            ],
            "spans": self.spans(detail),
            **self.marks(),
            "charts": {
                "usage": self.usage(),
                "sessions": self.session_bars(),
                "tools": self.tool_durations(),
            },
        }
        if detail:
            out["items"] = [
                self.item(pos, lane.id)
                for lane, (a, b) in zip(self.lanes, self.ranges_by_lane, strict=True)
                for pos in range(a, b)
            ]
        else:
            out["buckets"] = self.buckets()
        if self.children:
            out["children"] = timeline_fleet.lanes(
                self.children,
                first_lane=len(self.lanes),
                start_ms=self.start_ms,
                end_ms=self.end_ms,
                n_buckets=self.n_buckets,
                total=self.children_total,
            )
        return out

    def bucket_seqs(self) -> list[int]:
        """The first seq at each bucket's start, and the window's last: how the page turns a
        stretch it was dragged over into a seq range."""
        ix = self.ix
        seqs = [ix.seq_at(self.start_ms + k * self.bucket_ms) for k in range(self.n_buckets)]
        return [max(self.w.first, min(s, self.w.last)) for s in seqs] + [self.w.last]

    def item(self, pos: int, lane: int) -> dict[str, Any]:
        ix = self.ix
        end = ix.it_end[pos]
        running = end == OPEN
        return {
            "lane": lane,
            "kind": "tool" if ix.it_kind[pos] == TOOL else "turn",
            "name": ix.names[ix.it_name[pos]],
            "session": ix.it_session[pos],
            "seq": ix.it_seq[pos],
            "end_seq": ix.it_end_seq[pos] or None,
            "start": _r(ix.it_start[pos]),
            "end": None if running else _r(end),
            "running": running,
            "error": bool(ix.it_err[pos]),
            "abandoned": in_ranges(ix.it_seq[pos], self.ranges),
        }

    def buckets(self) -> list[dict[str, Any]]:
        """Per lane, the items in each width/4-pixel stretch: how many, errors, how many a rewind
        abandoned, and the longest in full."""
        ix, out = self.ix, []
        t0, step, n = self.start_ms, self.bucket_ms, self.n_buckets
        for lane, (a, b) in zip(self.lanes, self.ranges_by_lane, strict=True):
            if a >= b:
                continue
            k0 = min(n - 1, max(0, int((ix.it_key[a] - t0) // step)))
            k1 = min(n - 1, max(0, int((ix.it_key[b - 1] - t0) // step)))
            lo = a
            for k in range(k0, k1 + 1):
                hi = b if k == k1 else bisect_left(ix.it_key, t0 + (k + 1) * step, lo, b)
                if hi > lo:
                    pos, longest = ix.longest(lo, hi, self.now_ms)
                    out.append(
                        {
                            "lane": lane.id,
                            "b": k,
                            "n": hi - lo,
                            "errors": ix.err_pre[hi] - ix.err_pre[lo],
                            "abandoned": self.abandoned_in(lo, hi),
                            "longest": {**self.item(pos, lane.id), "ms": _r(longest)},
                        }
                    )
                lo = hi
        return out

    def abandoned_in(self, lo: int, hi: int) -> int:
        ix, count = self.ix, 0
        for after, upto in self.ranges:
            count += max(
                0, bisect_right(ix.it_seq, upto, lo, hi) - bisect_right(ix.it_seq, after, lo, hi)
            )
        return count

    def spans(self, detail: bool) -> list[dict[str, Any]]:
        """Approval waits and pauses overlapping the window; zoomed out, those closer than a
        block merged."""
        out: list[dict[str, Any]] = []
        for s in self.ix.spans:
            end = self.now_ms if s.end_ms is None else s.end_ms
            if end < self.start_ms or s.start_ms > self.end_ms:
                continue
            last = out[-1] if out else None
            if (
                not detail
                and last is not None
                and last["kind"] == s.kind
                and s.start_ms - last["end"] < self.bucket_ms
            ):
                last["end"], last["open"] = _r(end), s.end_ms is None
                last["merged"] += 1
                continue
            out.append(
                {
                    "kind": s.kind,
                    "seq": s.start_seq,
                    "end_seq": s.end_seq,
                    "start": _r(s.start_ms),
                    "end": _r(end),
                    "open": s.end_ms is None,
                    "merged": 1,
                }
            )
        return _evenly(out, MAX_SPANS)

    def marks(self) -> dict[str, Any]:
        ix, w = self.ix, self.w
        rewinds = [
            {
                "seq": m.seq,
                "ms": _r(m.ms),
                "checkpoint_id": m.checkpoint_id,
                "to_seq": m.to_seq,
                "to_ms": _r(ix.ms_at(m.to_seq)),
                "from_seq": m.from_seq,
            }
            for m in ix.rewinds
            if w.first <= m.seq <= w.last or w.first <= m.to_seq <= w.last
        ][:MAX_MARKS]
        seqs = [m.seq for m in ix.checkpoints]
        inside = ix.checkpoints[bisect_left(seqs, w.first) : bisect_right(seqs, w.last)]
        shown = _evenly(inside, MAX_MARKS - len(rewinds))
        return {
            "checkpoints": [
                {
                    "seq": m.seq,
                    "ms": _r(m.ms),
                    "id": m.checkpoint_id,
                    "kind": m.kind,
                    "label": m.label,
                    "abandoned": in_ranges(m.seq, self.ranges),
                }
                for m in shown
            ],
            "checkpoints_total": len(inside),
            "rewinds": rewinds,
        }

    def usage(self) -> dict[str, Any]:
        """The run's cumulative tokens and dollars over the window (each turn, or one point a
        block when there are more), with its budgets."""
        ix, w = self.ix, self.w
        lo, hi = bisect_left(ix.turn_seq, w.first), bisect_right(ix.turn_seq, w.last)
        tokens0, cost0 = ix.usage_at(w.first - 1)
        t, tokens, cost = [_r(self.start_ms)], [tokens0], [round(cost0, 6)]
        if hi - lo <= self.n_buckets:
            picks = range(lo, hi)
        else:
            picks = sorted(
                {
                    bisect_right(ix.turn_ms, self.start_ms + (k + 1) * self.bucket_ms, lo, hi) - 1
                    for k in range(self.n_buckets)
                }
                - {lo - 1}
            )
        for i in picks:
            t.append(_r(ix.turn_ms[i]))
            tokens.append(ix.cum_tokens[i])
            cost.append(round(ix.cum_cost[i], 6))
        return {
            "t": t,
            "tokens": tokens,
            "cost": cost,
            "max_tokens": self.run.max_tokens,
            "max_cost_usd": float(self.run.max_cost_usd) if self.run.max_cost_usd else None,
        }

    def session_bars(self) -> list[dict[str, Any]]:
        """Cost and tokens per session within the window; past MAX_SESSION_BARS, consecutive
        sessions share a bar."""
        ix, w = self.ix, self.w
        sessions = ix.sessions_in(w.first, w.last)
        per = max(1, math.ceil(len(sessions) / MAX_SESSION_BARS))
        bars = []
        for i in range(0, len(sessions), per):
            group = sessions[i : i + per]
            cost, tokens = 0.0, 0
            for s in group:
                a, b = ix.item_range(s, s, w.first, w.last)
                cost += ix.cost_pre[b] - ix.cost_pre[a]
                tokens += ix.tokens_pre[b] - ix.tokens_pre[a]
            label = str(group[0]) if len(group) == 1 else f"{group[0]}\u2013{group[-1]}"
            bars.append({"label": label, "cost": round(cost, 6), "tokens": tokens})
        return bars

    def tool_durations(self) -> dict[str, Any]:
        """Median and p90 duration per tool of the finished calls in the window, from at most
        TOOL_SAMPLE calls taken evenly."""
        ix = self.ix
        spans = [
            (bisect_left(ix.tool_pos, a), bisect_left(ix.tool_pos, b))
            for a, b in self.ranges_by_lane
        ]
        total = sum(j - i for i, j in spans)
        stride = max(1, math.ceil(total / TOOL_SAMPLE))
        by_name: dict[str, list[float]] = {}
        calls = 0
        start, end, name, names = ix.it_start, ix.it_end, ix.it_name, ix.names
        for i, j in spans:
            for pos in ix.tool_pos[i:j:stride]:
                if end[pos] != OPEN:
                    by_name.setdefault(names[name[pos]], []).append(end[pos] - start[pos])
                    calls += 1
        rows = []
        for name, ds in sorted(by_name.items()):
            ds.sort()
            rows.append(
                {
                    "name": name,
                    "n": len(ds),
                    "median_ms": _r(_quantile(ds, 0.5)),
                    "p90_ms": _r(_quantile(ds, 0.9)),
                }
            )
        return {"sampled": stride > 1, "calls": calls, "rows": rows}


def _quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _evenly(items: list, limit: int) -> list:
    """At most `limit` of the items, taken evenly, first and last kept."""
    if len(items) <= limit or limit <= 0:
        return items if limit > 0 else []
    if limit == 1:
        return items[:1]
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]
