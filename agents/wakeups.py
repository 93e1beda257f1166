"""Waiting for a run's next committed event, woken by it instead of polling the database.

The API's long polls (a tool call's decision, a finish's verdict) used to read the database every
250 ms: a person's approval reached the waiting agent 124-431 ms later. Now a long poll registers
its run with this process's waker, reads the database once, and sleeps until the waker sees an
event of that run committed (the decision, a status change, a rewind), then reads again.

The waker is one thread per web process, whatever the number of waiters, and it works from any
event loop (Django may run an async view in a loop of its own): it wakes each waiter through its
loop. What wakes the waker itself:

- with REDIS_URL (PostgreSQL + Redis): the committed events every committing process publishes to
  the hub (dashboard.live.hub), received as the live pages' listener receives them;
- on SQLite: an inotify watch of the database's folder: a commit in any process writes the
  database's WAL file, and the waker then reads the new events' ids (an index lookup);
- on PostgreSQL without Redis: LISTEN on the channel every append NOTIFYs with its run's id
  (agents.eventlog.NOTIFY_CHANNEL), delivered when the append commits.

A read every RECHECK_SECONDS covers a lost message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connection

from agents import eventlog
from agents.models import Event

# The channel layer between processes (Redis), when there is one, and the group every committed
# event is published to (dashboard/live/hub.py publishes; the live feed and the long polls here
# listen).
HUB = "hub"
HUB_GROUP = "live-hub"
HUB_REJOIN_SECONDS = 3600  # channels-redis forgets a group's members after a day


async def join() -> tuple[Any, str]:
    """Join the hub group: whatever is committed from now on reaches this process."""
    layer = get_channel_layer(HUB)
    channel = await layer.new_channel()
    await layer.group_add(HUB_GROUP, channel)
    return layer, channel


try:
    import inotify_simple
except ImportError:
    inotify_simple = None  # type: ignore[assignment]

log = logging.getLogger("dashboard.live")

RECHECK_SECONDS = 2.0  # a message the waker missed costs a waiter at most this long
TAIL_SECONDS = 0.02  # SQLite without inotify: the waker looks this often


class Waker:
    """Runs while someone waits: the thread ends once nobody has for a look or two."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self.ready = threading.Event()  # set once the thread knows where the log ends

    def add(self, run_id: int, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        with self._lock:
            self._waiting.setdefault(run_id, set()).add((loop, event))
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self.ready.clear()
                self._thread = threading.Thread(target=self._run, name="wakeups", daemon=True)
                self._thread.start()

    def remove(self, run_id: int, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        with self._lock:
            found = self._waiting.get(run_id)
            if found is not None:
                found.discard((loop, event))
                if not found:
                    del self._waiting[run_id]

    def _idle(self) -> bool:
        """Nobody waits: the thread ends (the next waiter starts another)."""
        with self._lock:
            if self._waiting:
                return False
            self._thread = None
            return True

    def wake(self, run_ids: Iterable[int]) -> None:
        with self._lock:
            targets = [w for run_id in set(run_ids) for w in self._waiting.get(run_id, ())]
        for loop, event in targets:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits
                loop.call_soon_threadsafe(event.set)

    def _run(self) -> None:
        try:
            while True:
                try:
                    if settings.SHIFTLOG["LIVE_PUSH"]:
                        asyncio.run(self._listen())
                    else:
                        self._tail()
                    return
                except Exception:  # a database or Redis briefly away: the waiters recheck
                    log.exception("the long polls' waker failed; starting again")
                    with contextlib.suppress(Exception):
                        close_old_connections()
                    self.ready.set()  # waiters fall back to their own looks meanwhile
                    if self._idle():
                        return
                    time.sleep(1)
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    async def _listen(self) -> None:
        layer, channel = await join()
        self.ready.set()
        try:
            while not self._idle():
                with contextlib.suppress(TimeoutError):
                    message = await asyncio.wait_for(layer.receive(channel), RECHECK_SECONDS)
                    self.wake(row["run_id"] for row in message["rows"])
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(HUB_GROUP, channel)

    def _tail(self) -> None:
        if connection.vendor == "postgresql":
            return self._listen_postgres()
        # SQLite: ids are given at commit, in order, so nothing commits behind the newest seen.
        last = Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        watch = self._watch()
        self.ready.set()
        while True:
            if watch is not None:
                watch.read(timeout=int(RECHECK_SECONDS * 1000))
            else:
                time.sleep(TAIL_SECONDS)
            if self._idle():
                if watch is not None:
                    watch.close()
                return
            rows = list(Event.objects.filter(pk__gt=last).values_list("pk", "run_id")[:5000])
            if rows:
                last = max(pk for pk, _ in rows)
                self.wake(run_id for _, run_id in rows)

    def _listen_postgres(self) -> None:
        """LISTEN on a connection of its own (autocommit, outside Django's pool): each
        notification names the run an append committed to."""
        import psycopg  # noqa: PLC0415 (the postgres extra: only here is it needed)

        params = connection.get_connection_params()
        with psycopg.Connection.connect(**params, autocommit=True) as conn:
            conn.execute(f"LISTEN {eventlog.NOTIFY_CHANNEL}")
            self.ready.set()
            while not self._idle():
                for note in conn.notifies(timeout=RECHECK_SECONDS):
                    with contextlib.suppress(ValueError):
                        self.wake([int(note.payload)])

    @staticmethod
    def _watch():
        """An inotify watch of the SQLite database's folder (its WAL file changes at every
        commit), or None (no inotify): then the waker looks every TAIL_SECONDS."""
        if connection.vendor != "sqlite" or inotify_simple is None:
            return None
        folder = Path(settings.DATABASES["default"]["NAME"]).resolve().parent
        watch = inotify_simple.INotify()
        watch.add_watch(str(folder), inotify_simple.flags.MODIFY)
        return watch


waker = Waker()


@contextlib.asynccontextmanager
async def watching(run_id: int) -> AsyncIterator[asyncio.Event]:
    """An event set whenever a committed event of `run_id` reaches this process. Clear it before
    each read of the database: what commits after the read sets it again."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    waker.add(run_id, loop, event)
    try:
        if not waker.ready.is_set():  # a new thread: what it sees starts after this read
            await asyncio.to_thread(waker.ready.wait, 10)
        yield event
    finally:
        waker.remove(run_id, loop, event)


async def until(event: asyncio.Event, seconds: float) -> None:
    """Sleep until `event` is set, at most `seconds` (and at most RECHECK_SECONDS)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, min(seconds, RECHECK_SECONDS)))


async def long_poll(
    run_id: int,
    read: Callable[[], Awaitable[Any]],
    done: Callable[[Any], bool],
    deadline: float,
) -> Any:
    """`read()` until `done(answer)` or the monotonic `deadline`, reading again only when an
    event of the run was committed (or RECHECK_SECONDS passed). Answered at once needs no wait."""
    answer = await read()
    if done(answer) or time.monotonic() >= deadline:
        return answer
    async with watching(run_id) as woken:
        while True:
            woken.clear()
            answer = await read()
            if done(answer) or time.monotonic() >= deadline:
                return answer
            await until(woken, deadline - time.monotonic())
