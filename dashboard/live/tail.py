"""The embedded mode's feed: this web process tails the event log.

The worker is another process, and the in-memory channel layer is per process, so the worker
cannot reach this process's sockets. Instead each web process polls the event table itself, once
every POLL_SECONDS, for rows past the highest id it has seen, and fans each batch out to its own
sockets. One poll per process, not per socket: a thousand sockets cost the database the same as
one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.db.models import Max

from agents.models import Event
from dashboard import stream
from dashboard.live.fanout import let_sockets_catch_up, publish

log = logging.getLogger("dashboard.live")

POLL_SECONDS = 0.02  # an idle poll costs microseconds (an index lookup)
BATCH = 500
LOOKBACK = 200  # PostgreSQL: ids this far behind the newest seen may still commit (see below)


class Tail:
    def __init__(self, last_pk: int) -> None:
        self.last_pk = last_pk
        self.recent: set[int] = set()  # PostgreSQL: ids sent within LOOKBACK of last_pk

    @classmethod
    async def from_now(cls) -> Tail:
        """A tail that starts after the newest event committed so far."""
        return cls(await database_sync_to_async(_max_pk)())

    async def run(self) -> None:
        layer = get_channel_layer()
        while True:
            try:
                rows = await database_sync_to_async(_events_after)(self.last_pk, self.recent)
                if rows:
                    self.last_pk = max(self.last_pk, rows[-1]["pk"])
                    if connection.vendor == "postgresql":
                        floor = self.last_pk - LOOKBACK
                        self.recent = {pk for pk in self.recent if pk > floor}
                        self.recent.update(r["pk"] for r in rows)
                    await publish(layer, rows)
                    if len(rows) == BATCH:
                        continue  # more waiting: no sleep
                    await let_sockets_catch_up(layer)
            except asyncio.CancelledError:
                raise
            except Exception:  # a locked or briefly unavailable database: try again
                log.exception("tailing the event log failed; retrying")
                await asyncio.sleep(1)
            await asyncio.sleep(POLL_SECONDS)


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
