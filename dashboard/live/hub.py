"""The scale-out feed: with REDIS_URL nobody tails the database.

The process that commits events (a worker, or a web process recording a person's action)
publishes them right after the commit (`push_committed`, connected in dashboard.apps) to the
`hub` channel layer (channels-redis), once, to one group that each web process's listener has
joined; the listener fans them out to its own sockets (dashboard.live.fanout), as
the tail does. So a commit costs Redis one message per web process, not one per socket, and
several web processes cost the database nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from channels.layers import get_channel_layer

from agents.models import Event, Run
from dashboard import stream
from dashboard.live.fanout import let_sockets_catch_up, publish, resync

log = logging.getLogger("dashboard.live")

# The hub's layer, group and joining live below both the live feed and the API's long polls.
from agents.wakeups import HUB, HUB_GROUP, HUB_REJOIN_SECONDS, join  # noqa: E402, F401


async def listen(layer, channel: str) -> None:
    """Redis mode: what the committing processes publish to the hub, to our sockets.

    Receiving and fanning out are two tasks joined by a queue: while the sockets are busy
    with one batch, what arrives meanwhile piles up and goes out as one message, as the
    tail's batches do. When idle, an event goes out the moment it arrives.
    """
    arrived: asyncio.Queue = asyncio.Queue()
    fan_out = asyncio.get_running_loop().create_task(_fan_out(arrived))
    loop_time = asyncio.get_running_loop().time
    joined = loop_time()
    lost = False  # Redis went away: it may have come back empty, without our membership
    try:
        while True:
            try:
                if lost or loop_time() - joined > HUB_REJOIN_SECONDS:
                    await layer.group_add(HUB_GROUP, channel)
                    joined = loop_time()
                    if lost:
                        # What was published while we were not listening reached nobody here:
                        # every page reads it from the database.
                        lost = False
                        await resync(get_channel_layer())
                message = await layer.receive(channel)
                arrived.put_nowait(message["rows"])
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis briefly away: join again, and pages catch up
                log.exception("listening to the live hub failed; retrying")
                lost = True
                await asyncio.sleep(1)
    finally:
        fan_out.cancel()
        with contextlib.suppress(Exception):
            await layer.group_discard(HUB_GROUP, channel)


async def _fan_out(arrived: asyncio.Queue) -> None:
    layer = get_channel_layer()
    while True:
        rows = list(await arrived.get())
        while not arrived.empty():
            rows += arrived.get_nowait()
        try:
            await publish(layer, [from_hub(row) for row in rows])
        except Exception:
            log.exception("fanning out %d event(s) failed", len(rows))
        await let_sockets_catch_up(layer)


def to_hub(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "created_at": row["created_at"].timestamp()}  # msgpack has no datetimes


def from_hub(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "created_at": datetime.fromtimestamp(row["created_at"], tz=UTC)}


@lru_cache(maxsize=4096)
def _owner(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("created_by_id", flat=True).first()


PUSH_RETRY_SECONDS = 30.0


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
                await self._send(hub, rows)
            finally:
                with self.idle:
                    self.pending -= len(batches)
                    self.idle.notify_all()

    async def _send(self, hub, rows: list[dict[str, Any]]) -> None:
        """Send, trying again while Redis is away (a restart, a failover), in order: a page that
        misses an event reads the gap from the database at the next event it gets, but a run's
        last events have no next one (found by the chaos soak: a viewer missed a run's last
        event pushed while Redis restarted). Past PUSH_RETRY_SECONDS the events are left to
        the pages' reconnects, which read them from the database."""
        delay, waited = 0.1, 0.0
        while True:
            try:
                await hub.group_send(HUB_GROUP, {"type": "hub.rows", "rows": rows})
                return
            except Exception:
                if waited >= PUSH_RETRY_SECONDS:
                    log.exception("pushing %d event(s) failed; giving up", len(rows))
                    return
                log.warning("pushing %d event(s) failed; trying again", len(rows))
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 2.0)


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
