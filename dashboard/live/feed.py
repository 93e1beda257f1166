"""Live updates: each web process has one feed of committed events, which it fans out to its
own sockets (dashboard.live.fanout). In the embedded mode the feed tails the event log
(dashboard.live.tail); with Redis it listens to what the committing processes publish
(dashboard.live.hub). Either way, one feed per process, not one per socket.

Consumers never trust the feed alone: every event carries its seq, and a consumer that sees a gap
(a dropped message, a slow socket) reads the missing events from the database. So the feed may be
late or lose a message, but a page never shows a gap or a duplicate.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from dashboard.live import hub
from dashboard.live.tail import Tail


class Feed:
    """This process's one source of committed events, started by the first socket."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    async def ensure_running(self) -> None:
        """Start the feed (once per process). Returns after its starting point is fixed, so a
        consumer that reads its catch-up from the database after this misses nothing."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new event loop (tests run one each): start afresh
            self.loop, self.task, self._starting = loop, None, None
        if self.task is not None and not self.task.done():
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.task is not None and not self.task.done():
                return
            if settings.SHIFTLOG["LIVE_PUSH"]:
                layer, channel = await hub.join()
                self.task = loop.create_task(hub.listen(layer, channel))
            else:
                tail = await Tail.from_now()
                self.task = loop.create_task(tail.run())


feed = Feed()


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
        return await self.ashare(key, lambda: self.get_or_render(key, render))

    async def ashare(self, key: Any, render):
        """One call of `render` in the database thread for every socket that asks with the same
        key while it runs (not kept after: a catch-up read from the database, say)."""
        pending = self.rendering.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = self.rendering[key] = asyncio.get_running_loop().create_future()
        try:
            html = await database_sync_to_async(render)()
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
