"""Fanning committed events out to this process's sockets: the channel-layer groups a socket
joins, and the one publish that both feeds (the database tail and the Redis hub) use.

Each batch goes to the groups of the runs it touches (`run-<pk>`) and, when it changes what a
list row, the inbox or the header's count shows, to `runs`. A feed waits (briefly) for the sockets
to take a batch before it sends the next, so a hundred busy viewers get fewer, larger messages
instead of falling behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dashboard import stream

FAN_OUT_MAX_WAIT = 0.05  # at most this long for the sockets to take a batch before the next
RUNS_GROUP = "runs"
# Kinds that change what a runs list row, the header or the side panels show.
ROW_KINDS = frozenset(
    {"run.created", "run.status", "run.updated", "model.turn", "session.started",
     "session.ended", "approval.requested", "approval.decided"}
)  # fmt: skip
APPROVAL_KINDS = frozenset({"approval.requested", "approval.decided"})


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


async def publish(layer, rows: list[dict[str, Any]]) -> None:
    by_run: dict[int, list[dict[str, Any]]] = {}
    owners: dict[int, int | None] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(stream.to_message(row))
        owners[row["run_id"]] = row["run__created_by_id"]
    changed = []
    for run_id, events in by_run.items():
        await layer.group_send(run_group(run_id), {"type": "run.events", "events": events})
        kinds = {e["kind"] for e in events}
        if kinds & ROW_KINDS:
            changed.append(
                {
                    "id": run_id,
                    "owner": owners[run_id],
                    "seq": events[-1]["seq"],
                    "created": "run.created" in kinds,
                    "approvals": [
                        [e["payload"].get("approval_id"), e["kind"]]
                        for e in events
                        if e["kind"] in APPROVAL_KINDS
                    ],
                }
            )
    if changed:
        await layer.group_send(RUNS_GROUP, {"type": "runs.changed", "runs": changed})


def backlog(layer) -> int:
    """Messages this process's sockets have not taken yet (the in-memory layer's queues)."""
    queues = getattr(layer, "channels", None)
    return sum(q.qsize() for q in queues.values()) if isinstance(queues, dict) else 0


async def let_sockets_catch_up(layer) -> None:
    """Back-pressure: let the sockets take a batch before the next goes out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAN_OUT_MAX_WAIT
    while backlog(layer) and loop.time() < deadline:
        await asyncio.sleep(0.002)
