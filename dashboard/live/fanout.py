"""Fanning committed events out to this process's sockets: the one publish that both feeds (the
database tail and the Redis hub) use.

The sockets register here (`viewers`), not in channel-layer groups: a batch of a run's events is
rendered once per permission set present among that run's viewers (at most one per distinct
`access.Rights`, never one per viewer) and the same text goes to every viewer of that set, sent
straight to its socket. A socket that is not exactly at the batch's first seq (it is catching up
from the database, or still has a batch queued) gets the batch through its own channel instead,
where the consumer filters and reads gaps from the database as before; the renders it needs are
then in the render cache already.

Changes to a list row, the inbox or the header's count go through each socket's own channel,
and only to the sockets that show them (the runs list, the inbox, or any page when an approval
changes the count). A feed waits (briefly) for the sockets to take what went through their
channels before it sends the next batch, and a batch is everything that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull

from agents.events import read as read_payload
from dashboard import stream

log = logging.getLogger("dashboard.live")

FAN_OUT_MAX_WAIT = 0.05  # at most this long for the sockets to take a batch before the next
# Kinds that change what a runs list row, the header or the side panels show.
ROW_KINDS = frozenset(
    {"run.created", "run.status", "run.updated", "model.turn", "session.started",
     "session.ended", "approval.requested", "approval.decided"}
)  # fmt: skip
APPROVAL_KINDS = frozenset({"approval.requested", "approval.decided"})


class Socket(Protocol):
    """What the fan-out needs of a consumer (dashboard.live.consumers.LiveConsumer)."""

    mode: str  # page | list | approvals | run
    channel_name: str
    user: Any
    sees_all: bool
    run_id: int | None
    rights: Any  # access.Rights: hashable, one render per distinct value
    last_seq: int
    busy: int  # > 0 while connecting or catching up from the database
    queued_upto: int  # the last seq of the batches put on its channel
    owed_upto: int  # a batch up to this seq never reached it: it reads the log (0: none owed)
    owed_runs: dict[int, dict[str, Any]] | None  # changed rows its full channel turned away
    owed_resync: bool  # its full channel turned a resync away: it reads again after its next

    def rendered(self, events: list[dict[str, Any]]) -> str: ...

    async def base_send(self, message: dict[str, Any]) -> None: ...


class Viewers:
    """This process's sockets: every page (for the header's count and the lists) and, by run,
    the run pages."""

    def __init__(self) -> None:
        self.pages: set[Socket] = set()
        self.by_run: dict[int, set[Socket]] = {}
        # Counters since the process started (for /metrics, the tests and the benchmark).
        self.stats: Counter[str] = Counter()

    def add(self, socket: Socket) -> None:
        self.pages.add(socket)
        if socket.run_id is not None:
            self.by_run.setdefault(socket.run_id, set()).add(socket)

    def discard(self, socket: Socket) -> None:
        self.pages.discard(socket)
        if socket.run_id is not None:
            watching = self.by_run.get(socket.run_id)
            if watching is not None:
                watching.discard(socket)
                if not watching:
                    del self.by_run[socket.run_id]


viewers = Viewers()


async def publish(layer, rows: list[dict[str, Any]]) -> None:
    by_run: dict[int, list[dict[str, Any]]] = {}
    owners: dict[int, int | None] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(stream.to_message(row))
        owners[row["run_id"]] = row["run__created_by_id"]
    changed = []
    for run_id, events in by_run.items():
        # Pushes from different committers (a worker, a person's action) reach a listener in
        # any order, and one listener batch can hold several: each run's events in seq order,
        # each once.
        events = list({e["seq"]: e for e in sorted(events, key=seq_of)}.values())
        if run_id in viewers.by_run:
            try:
                await to_run_viewers(layer, run_id, events)
            except Exception:  # the pages read what they missed from the log
                log.exception("fanning out %d event(s) of run %s failed", len(events), run_id)
                with contextlib.suppress(Exception):
                    await owe(layer, viewers.by_run.get(run_id, ()), events[-1]["seq"])
        kinds = {e["kind"] for e in events}
        if kinds & ROW_KINDS:
            changed.append(
                {
                    "id": run_id,
                    "owner": owners[run_id],
                    "seq": events[-1]["seq"],
                    "created": "run.created" in kinds,
                    "approvals": [
                        [read_payload(e["kind"], e["payload"]).approval_id, e["kind"]]
                        for e in events
                        if e["kind"] in APPROVAL_KINDS
                    ],
                }
            )
    if changed:
        await to_pages(layer, changed)


def seq_of(event: dict[str, Any]) -> int:
    return event["seq"]


async def to_run_viewers(layer, run_id: int, events: list[dict[str, Any]]) -> None:
    """One render per permission set present, the same text to every viewer that has it.
    `events` are in seq order; a batch with a gap (a push that never came) goes to no socket
    straight: each reads the gap from the database (the consumer's run_events)."""
    first, last = events[0]["seq"], events[-1]["seq"]
    gapless = last - first + 1 == len(events)
    one_of_each: dict[Any, Socket] = {}
    for socket in viewers.by_run.get(run_id, ()) if gapless else ():
        if ready(socket, first):
            one_of_each.setdefault(socket.rights, socket)
    html: dict[Any, str] = {}
    if one_of_each:
        try:
            html = await database_sync_to_async(
                lambda: {rights: s.rendered(events) for rights, s in one_of_each.items()}
            )()
        except Exception:
            # The render failed (the database dropped its connection, say). A page reads a gap
            # at its next event, but a run's last events have no next one (found by the chaos
            # soak): every viewer of the run reads the batch from the log on its own channel.
            log.exception("rendering %d event(s) of run %s failed", len(events), run_id)
            await owe(layer, viewers.by_run.get(run_id, ()), last)
            return
    viewers.stats["batches"] += 1
    viewers.stats["events"] += len(events)
    # Decided again after the render: a socket may have started a catch-up meanwhile.
    for socket in list(viewers.by_run.get(run_id, ())):
        text = html.get(socket.rights)
        if text is not None and gapless and ready(socket, first):
            socket.last_seq = last
            viewers.stats["frames"] += 1
            try:
                await socket.base_send({"type": "websocket.send", "text": text})
            except Exception:
                log.exception("sending to a socket of run %s failed", run_id)
        elif socket.last_seq >= last:  # a catch-up read it from the log meanwhile
            viewers.stats["held"] += 1
        else:  # behind, ahead of a gap, or busy: its own channel
            try:
                await layer.send(socket.channel_name, {"type": "run.events", "events": events})
            except ChannelFull:  # far behind: it reads the gap once it has taken what waits
                socket.owed_upto = max(socket.owed_upto, last)
                continue
            socket.queued_upto = last
            viewers.stats["queued"] += 1


async def owe(layer, sockets, last: int) -> None:
    """These sockets missed a batch up to `last`: each reads it from the log on its own channel
    (or, if that is full, once it has taken what waits there)."""
    viewers.stats["owed"] += 1
    for socket in list(sockets):
        socket.owed_upto = max(socket.owed_upto, last)
        with contextlib.suppress(ChannelFull):
            await layer.send(socket.channel_name, {"type": "run.owed"})


def ready(socket: Socket, first: int) -> bool:
    """The batch starting at `first` may go straight to this socket: it holds everything
    before it, is not catching up, and has nothing older waiting on its channel."""
    return not socket.busy and socket.last_seq == first - 1 and socket.queued_upto < first


async def to_pages(layer, runs: list[dict[str, Any]]) -> None:
    """Changed rows and approvals, to the sockets that show them and may see the runs."""
    approvals = any(r["approvals"] for r in runs)
    message = {"type": "runs.changed", "runs": runs}
    for socket in list(viewers.pages):
        if socket.mode not in {"list", "approvals"} and not approvals:
            continue  # the other pages show only the approval count from this stream
        if socket.sees_all or any(r["owner"] == socket.user.pk for r in runs):
            try:
                await layer.send(socket.channel_name, message)
            except ChannelFull:
                # Far behind. A later change of another run does not redraw these rows (and a
                # run's last change has no later one): they go with the next message it takes.
                owe_rows(socket, runs)


def owe_rows(socket: Socket, runs: list[dict[str, Any]]) -> None:
    """Keep changed rows for a socket whose channel was full (the consumer sends them once it
    has taken its next message: its channel is not empty). One entry per run: rows are read
    from the database when sent, so only the approvals and whether it is new add up."""
    owed = socket.owed_runs if socket.owed_runs is not None else {}
    for run in runs:
        had = owed.get(run["id"])
        if had is None:
            owed[run["id"]] = {**run, "approvals": list(run["approvals"])}
        else:
            had["seq"] = max(had["seq"], run["seq"])
            had["created"] = had["created"] or run["created"]
            had["approvals"] += run["approvals"]
    socket.owed_runs = owed
    viewers.stats["rows_owed"] += len(runs)


async def resync(layer) -> None:
    """The feed missed what was published for a while (Redis went away): every socket reads
    what it may have missed from the database (its run's events, the header's count, the
    lists), as after a reconnect."""
    viewers.stats["resyncs"] += 1
    for socket in list(viewers.pages):
        try:
            await layer.send(socket.channel_name, {"type": "live.resync"})
        except ChannelFull:
            # Far behind: it reads again (its run's log, the side panels, the count, the lists)
            # once it has taken its next message (its channel is not empty).
            if socket.run_id is not None:
                socket.owed_upto = max(socket.owed_upto, socket.last_seq + 1)
            socket.owed_resync = True
            viewers.stats["resyncs_owed"] += 1


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
