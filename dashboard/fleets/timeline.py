"""A fleet's parent's timeline: its children as lanes below its own, one lane a child ("child
#N"), each child's model turns and tool calls in blocks of the parent's window (the same
width/4-pixel stretches as the parent's zoomed-out lanes), read from each child's own index.

Bounded like the parent's lanes: at most MAX_CHILD_LANES children (the oldest first; the rest
counted), at most one block a stretch a lane. Times are milliseconds since the epoch in every
index, so a child's work lines up with its parent's.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from agents.models import Run
from dashboard.timeline_index import RunIndex

MAX_CHILD_LANES = 16


@dataclass(frozen=True)
class Child:
    run: Run
    index: RunIndex | None  # None: no event yet


def last_ms(children: list[Child]) -> float | None:
    """When the latest child event happened (a waiting parent's window reaches that far)."""
    ends = [c.index.ev_ms[-1] for c in children if c.index is not None and len(c.index.ev_ms)]
    return max(ends) if ends else None


def lanes(
    children: list[Child],
    *,
    first_lane: int,
    start_ms: float,
    end_ms: float,
    n_buckets: int,
    total: int,
) -> dict[str, Any]:
    """The children's lanes and blocks for the window [start_ms, end_ms] cut in n_buckets."""
    step = (end_ms - start_ms) / n_buckets
    out_lanes, blocks = [], []
    for i, child in enumerate(children[:MAX_CHILD_LANES]):
        lane = first_lane + i
        out_lanes.append(
            {
                "id": lane,
                "label": f"child #{child.run.pk}",
                "run_id": child.run.pk,
                "status": child.run.status,
            }
        )
        ix = child.index
        if ix is None:
            continue
        n = len(ix.it_key)
        a = bisect_left(ix.it_key, start_ms, 0, n)
        b = bisect_right(ix.it_key, end_ms, a, n)
        lo = a
        while lo < b:
            k = min(n_buckets - 1, max(0, int((ix.it_key[lo] - start_ms) // step)))
            hi = (
                b
                if k == n_buckets - 1
                else bisect_left(ix.it_key, start_ms + (k + 1) * step, lo, b)
            )
            hi = max(hi, lo + 1)
            blocks.append(
                {
                    "lane": lane,
                    "b": k,
                    "n": hi - lo,
                    "errors": ix.err_pre[hi] - ix.err_pre[lo],
                    "seq": ix.it_seq[lo],
                    "sessions": [ix.it_session[lo], ix.it_session[hi - 1]],
                }
            )
            lo = hi
    return {"lanes": out_lanes, "blocks": blocks, "total": total}
