"""Live updates: one tailer per web process reads new events and fans them out.

The worker is another process, and the in-memory channel layer is per process, so the worker
cannot reach this process's sockets. Instead each web process tails the event log itself — one
query every POLL_SECONDS for rows past the highest pk it has seen (in SQLite, pk order is commit
order: writers are serialised) — and sends each batch to the channel-layer groups of the runs it
touches (`run-<pk>`) and to `runs` (lists, inboxes and every header's approval count). One poll
per process, not per socket: a thousand sockets cost the database the same as one.

With REDIS_URL nobody tails: the process that commits events — a worker, or a web process
recording a person's action — publishes them right after the commit (`push_committed`, connected
in dashboard.apps) to the `hub` channel layer (channels-redis), once, to one group that each web
process's listener has joined; the listener then fans them out to its own sockets through the
in-memory `default` layer, exactly as the tailer does. So a commit costs Redis one message per web
process, not one per socket, and several web processes cost the database nothing.

Consumers never trust the tailer alone: every event carries its seq, and a consumer that sees a
gap (a dropped message, a slow socket) reads the missing events from the database. So the tailer
may be late or lose a message, but a page never shows a gap or a duplicate.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Max

from agents.models import Event, Run
from dashboard import stream

log = logging.getLogger("dashboard.live")

POLL_SECONDS = 0.02  # an idle poll costs microseconds (an index lookup)
BATCH = 500
HUB = "hub"  # the channel layer between processes (Redis), when there is one
HUB_GROUP = "live-hub"
HUB_REJOIN_SECONDS = 3600  # channels-redis forgets a group's members after a day
FAN_OUT_MAX_WAIT = 0.05  # at most this long for the sockets to take a batch before the next
LOOKBACK = 200  # PostgreSQL: ids this far behind the newest seen may still commit (see below)
RUNS_GROUP = "runs"
# Kinds that change what a runs list row, the header or the side panels show.
ROW_KINDS = frozenset(
    {"run.created", "run.status", "run.updated", "model.turn", "session.started",
     "session.ended", "approval.requested", "approval.decided"}
)  # fmt: skip
APPROVAL_KINDS = frozenset({"approval.requested", "approval.decided"})


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


class Tailer:
    def __init__(self) -> None:
        self.last_pk: int | None = None
        self.recent: set[int] = set()  # PostgreSQL: ids sent within LOOKBACK of last_pk
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    async def ensure_running(self) -> None:
        """Start tailing (once per process). Returns after the starting point is fixed, so a
        consumer that reads its catch-up from the database after this misses nothing."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new event loop (tests run one each): start afresh
            self.loop, self.task, self.last_pk, self._starting = loop, None, None, None
            self.recent = set()
        if self.task is not None and not self.task.done():
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.task is not None and not self.task.done():
                return
            if settings.SHIFTLOG["LIVE_PUSH"]:
                # Joined before this returns: whatever is committed from now on reaches us.
                hub = get_channel_layer(HUB)
                channel = await hub.new_channel()
                await hub.group_add(HUB_GROUP, channel)
                self.task = loop.create_task(self._listen(hub, channel))
                return
            if self.last_pk is None:
                self.last_pk = await database_sync_to_async(_max_pk)()
            self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        layer = get_channel_layer()
        while True:
            try:
                rows = await database_sync_to_async(_events_after)(self.last_pk or 0, self.recent)
                if rows:
                    self.last_pk = max(self.last_pk or 0, rows[-1]["pk"])
                    if connection.vendor == "postgresql":
                        floor = self.last_pk - LOOKBACK
                        self.recent = {pk for pk in self.recent if pk > floor}
                        self.recent.update(r["pk"] for r in rows)
                    await publish(layer, rows)
                    if len(rows) == BATCH:
                        continue  # more waiting: no sleep
                    await self._let_sockets_catch_up(layer)
            except asyncio.CancelledError:
                raise
            except Exception:  # a locked or briefly unavailable database: try again
                log.exception("tailing the event log failed; retrying")
                await asyncio.sleep(1)
            await asyncio.sleep(POLL_SECONDS)

    async def _let_sockets_catch_up(self, layer) -> None:
        """Back-pressure: let the sockets take a batch before the next goes out, so a hundred
        busy viewers get fewer, larger messages instead of falling behind."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAN_OUT_MAX_WAIT
        while backlog(layer) and loop.time() < deadline:
            await asyncio.sleep(0.002)

    async def _listen(self, hub, channel: str) -> None:
        """Redis mode: what the committing processes publish to the hub, to our sockets.

        Receiving and fanning out are two tasks joined by a queue: while the sockets are busy
        with one batch, what arrives meanwhile piles up and goes out as one message, as the
        tailer's batches do. When idle, an event goes out the moment it arrives.
        """
        arrived: asyncio.Queue = asyncio.Queue()
        fan_out = asyncio.get_running_loop().create_task(self._fan_out(arrived))
        loop_time = asyncio.get_running_loop().time
        joined = loop_time()
        try:
            while True:
                try:
                    if loop_time() - joined > HUB_REJOIN_SECONDS:
                        await hub.group_add(HUB_GROUP, channel)
                        joined = loop_time()
                    message = await hub.receive(channel)
                    arrived.put_nowait(message["rows"])
                except asyncio.CancelledError:
                    raise
                except Exception:  # Redis briefly away: pages catch up from the database
                    log.exception("listening to the live hub failed; retrying")
                    await asyncio.sleep(1)
        finally:
            fan_out.cancel()
            with contextlib.suppress(Exception):
                await hub.group_discard(HUB_GROUP, channel)

    async def _fan_out(self, arrived: asyncio.Queue) -> None:
        layer = get_channel_layer()
        while True:
            rows = list(await arrived.get())
            while not arrived.empty():
                rows += arrived.get_nowait()
            try:
                await publish(layer, [from_hub(row) for row in rows])
            except Exception:
                log.exception("fanning out %d event(s) failed", len(rows))
            await self._let_sockets_catch_up(layer)


def backlog(layer) -> int:
    """Messages this process's sockets have not taken yet (the in-memory layer's queues)."""
    queues = getattr(layer, "channels", None)
    return sum(q.qsize() for q in queues.values()) if isinstance(queues, dict) else 0


def to_hub(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "created_at": row["created_at"].timestamp()}  # msgpack has no datetimes


def from_hub(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "created_at": datetime.fromtimestamp(row["created_at"], tz=UTC)}


def _max_pk() -> int:
    return Event.objects.aggregate(m=Max("pk"))["m"] or 0


def _events_after(pk: int, recent: set[int]) -> list[dict[str, Any]]:
    """Events past id `pk`. In SQLite writers are serialised, so id order is commit order. In
    PostgreSQL an id is taken at insert and commits land in any order: a transaction holding id
    9 may commit after the one holding id 10 was read. So there the tail also looks LOOKBACK ids
    back, for ids it has not sent yet (`recent` holds the ones it has), with an index-only query.
    """
    fields = (*stream.EVENT_FIELDS, "run__created_by_id")
    if connection.vendor != "postgresql":
        return list(Event.objects.filter(pk__gt=pk).order_by("pk").values(*fields)[:BATCH])
    ids = Event.objects.filter(pk__gt=pk - LOOKBACK).order_by("pk").values_list("pk", flat=True)
    new = [i for i in ids[: BATCH + LOOKBACK] if i not in recent][:BATCH]
    if not new:
        return []
    return list(Event.objects.filter(pk__in=new).order_by("pk").values(*fields))


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


tailer = Tailer()


@lru_cache(maxsize=4096)
def _owner(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("created_by_id", flat=True).first()


class Pusher:
    """Publishes from one thread of the process with its own event loop, in commit order.

    The committing thread (a worker's step, a view) only hands the rows over and goes on; the
    channel layer keeps its Redis connections in that one loop, instead of a new loop and a new
    connection per commit (async_to_sync from a plain thread: ~2.6 ms and a connection each).
    At exit it is given a moment to send what is left, so a command such as `approve` that
    exits right after its commit still reaches the pages.
    """

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue | None = None
        self.pending = 0
        self.idle = threading.Condition()
        self._lock = threading.Lock()
        self._pid: int | None = None

    def push(self, rows: list[dict[str, Any]]) -> None:
        self._start()
        with self.idle:
            self.pending += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, rows)

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until everything handed over has been sent (or failed); False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def _start(self) -> None:
        if self.loop is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self.loop is not None and self._pid == os.getpid():
                return
            ready = threading.Event()

            def main() -> None:
                loop = asyncio.new_event_loop()
                asyncio.set_event_loop(loop)
                self.queue = asyncio.Queue()
                self.loop, self._pid, self.pending = loop, os.getpid(), 0
                ready.set()
                loop.run_until_complete(self._drain())

            threading.Thread(target=main, name="shiftlog-live-push", daemon=True).start()
            ready.wait()
            atexit.register(self.flush)

    async def _drain(self) -> None:
        hub = get_channel_layer(HUB)
        while True:
            batches = [await self.queue.get()]
            while not self.queue.empty():  # what piled up meanwhile goes out as one message
                batches.append(self.queue.get_nowait())
            rows = [row for batch in batches for row in batch]
            try:
                await hub.group_send(HUB_GROUP, {"type": "hub.rows", "rows": rows})
            except Exception:
                # The events are committed; a page that missed them reads them from the
                # database at the next event it gets, or when it reconnects.
                log.exception("pushing %d event(s) failed", len(rows))
            finally:
                with self.idle:
                    self.pending -= len(batches)
                    self.idle.notify_all()


pusher = Pusher()


def push_committed(sender, events: list[Event], **kwargs) -> None:
    """eventlog.events_committed → the channel layer, from the process that committed them."""
    pusher.push(
        [
            to_hub(
                {
                    **{f: getattr(e, f) for f in stream.EVENT_FIELDS},
                    "run__created_by_id": _owner(e.run_id),
                }
            )
            for e in events
        ]
    )


class RenderCache:
    """Fragments rendered once per process for all sockets that would render them the same:
    a hundred viewers of one run cost one render, not a hundred."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self.items: OrderedDict[Any, str] = OrderedDict()
        self.rendering: dict[Any, asyncio.Future] = {}

    async def aget_or_render(self, key: Any, render) -> str:
        """From a consumer: the cached fragment, or one render in the database thread that the
        sockets asking for the same key meanwhile all wait for (a trip each would queue a
        hundred trips behind one another on that one thread)."""
        if key in self.items:
            return self.items[key]
        pending = self.rendering.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = self.rendering[key] = asyncio.get_running_loop().create_future()
        try:
            html = await database_sync_to_async(self.get_or_render)(key, render)
        except BaseException as e:
            pending.set_exception(e)
            pending.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        else:
            pending.set_result(html)
            return html
        finally:
            del self.rendering[key]

    def __contains__(self, key: Any) -> bool:
        return key in self.items

    def get_or_render(self, key: Any, render) -> str:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        html = render()
        self.items[key] = html
        if len(self.items) > self.size:
            self.items.popitem(last=False)
        return html


cache = RenderCache()
