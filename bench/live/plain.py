"""The reference `live_latency.py` measures Shiftlog against: a plain fan-out of the same events
to the same viewers, served by the same daphne.

    python -m daphne bench.live.plain:application    # what live_latency.py starts (--plain)

The events reach this process as they reach Shiftlog's (the same feed: a tail of the event log
every 20 ms in the embedded mode, or with REDIS_URL what the committing worker publishes to the
hub), and every socket then gets one small frame per batch that names each event's seq
(`<tr data-seq="N"></tr>`): no login, no permissions, no templates, no database reads, no
catch-up. So it is the floor under Shiftlog's figures: the feed and daphne's own cost of a frame.
HTTP goes to Shiftlog's application (the bench asks /healthz).
"""

from __future__ import annotations

import asyncio
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shiftlog.settings")
django.setup()  # before the app's modules, which import its models

from channels.db import database_sync_to_async  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.live import hub, tail  # noqa: E402
from shiftlog.asgi import application as shiftlog  # noqa: E402

sockets: set = set()
feed: asyncio.Task | None = None


def frame(rows: list[dict]) -> str:
    return "".join(f'<tr data-seq="{r["seq"]}"></tr>' for r in rows)


async def send_to_all(rows: list[dict]) -> None:
    text = frame(rows)
    for send in list(sockets):
        await send({"type": "websocket.send", "text": text})


async def tail_feed() -> None:
    last_pk = await database_sync_to_async(tail._max_pk)()
    while True:
        rows = await database_sync_to_async(tail._events_after)(last_pk, set())
        if rows:
            last_pk = rows[-1]["pk"]
            await send_to_all(rows)
        await asyncio.sleep(tail.POLL_SECONDS)


async def hub_feed() -> None:
    layer, channel = await hub.join()
    while True:
        message = await layer.receive(channel)
        await send_to_all(message["rows"])


async def application(scope, receive, send):
    global feed
    if scope["type"] != "websocket":
        return await shiftlog(scope, receive, send)
    if feed is None or feed.done():
        started = hub_feed() if settings.SHIFTLOG["LIVE_PUSH"] else tail_feed()
        feed = asyncio.get_running_loop().create_task(started)
    while True:
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            sockets.add(send)
        elif message["type"] == "websocket.disconnect":
            sockets.discard(send)
            return
