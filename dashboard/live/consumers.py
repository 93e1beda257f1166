"""One WebSocket per page. Every socket gets the header's approval count; the runs list its
rows, the approvals inbox its cards, a run page its events, header, meters and side panels.

What is pushed is the pages' own template partials, swapped out-of-band by id. A run page's
socket is gap-free: it starts after the seq the page holds (`?after=`, rewritten by the page's
script on every reconnect), sends each event once, in order, and reads any gap from the database.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from agents import access
from agents.models import Approval, Event, Run, RunStatus
from dashboard import cards, inbox, panels, stream
from dashboard.live import fanout
from dashboard.live import feed as live
from dashboard.live.frames import frames

CATCH_UP_CHUNK = 500


class LiveConsumer(AsyncWebsocketConsumer):
    mode = "page"  # page | list | approvals | run
    run_id: int | None = None
    rights: access.Rights | None = None
    last_seq = 0
    sees_all = False
    busy = 0  # > 0: connecting or catching up (dashboard.live.fanout sends nothing straight)
    queued_upto = 0  # the last seq dashboard.live.fanout put on this socket's channel
    owed_upto = 0  # a batch up to this seq never reached the socket (dashboard.live.fanout.owe)
    owed_runs: dict[int, dict[str, Any]] | None = None  # rows a full channel turned away
    owed_resync = False  # a resync a full channel turned away (dashboard.live.fanout.resync)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """As channels' own, without its aclose_old_connections() before every message: that is
        a trip to the one database thread per socket per event. Every database call here goes
        through database_sync_to_async, which closes old connections itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)
        if message["type"] == "websocket.disconnect":
            return
        # What the fan-out could not put on the full channel comes after the next message the
        # socket takes, whatever it is (a full channel has one): a resync (fanout.resync), a
        # batch of its run (fanout.to_run, fanout.owe), rows (fanout.owe_rows).
        if self.owed_resync:
            self.owed_resync = False
            await self.live_resync({"type": "live.resync"})
        else:
            await self._read_owed()
        if self.owed_runs:
            # Rows the fan-out could not put on the full channel (dashboard.live.fanout.owe_rows).
            runs, self.owed_runs = list(self.owed_runs.values()), None
            await self.runs_changed({"type": "runs.changed", "runs": runs})

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close()  # before accept: the handshake is refused (403)
            return
        query = {k: v[-1] for k, v in parse_qs(self.scope["query_string"].decode()).items()}
        self.query = query
        self.reconnect = query.get("reconnect") == "1"
        self.mode = self.scope["url_route"]["kwargs"].get("mode", "page")
        self.sees_all = await database_sync_to_async(access.sees_all)(self.user)
        self.run_id = self.scope["url_route"]["kwargs"].get("run_id")
        if self.run_id is not None:
            self.mode = "run"
            found = await database_sync_to_async(self._load_run)(self.run_id)
            if found is None:
                await self.close()
                return
            self.rights, last_seq = found
            try:
                self.last_seq = max(0, int(query.get("after", last_seq)))
            except ValueError:
                self.last_seq = last_seq
        # The feed's starting point is fixed before the catch-up below reads the database,
        # and the socket is registered before it too: whatever the catch-up misses arrives live
        # (on the socket's own channel while it connects, then handled in order).
        await live.feed.ensure_running()
        self.busy += 1
        fanout.viewers.add(self)
        try:
            await self.accept()
            if self.mode == "run":
                await self._catch_up(always_side=self.reconnect, connecting=True)
            if self.reconnect:
                await self._send_all(await database_sync_to_async(self._refresh)())
        finally:
            self.busy -= 1

    async def disconnect(self, code: int) -> None:
        fanout.viewers.discard(self)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        pass  # the page only listens; actions go through POSTs with CSRF

    # --- a run's events ----------------------------------------------------------------------
    async def run_events(self, message: dict[str, Any]) -> None:
        """A batch the fan-out could not send straight away (dashboard.live.fanout): this socket was
        catching up, had a batch queued before this one, or missed one."""
        events = [e for e in message["events"] if e["seq"] > self.last_seq]
        contiguous = all(e["seq"] == self.last_seq + 1 + i for i, e in enumerate(events))
        if not contiguous or self.owed_upto > self.last_seq:
            # A dropped message: read the gap from the database, up to this batch at least.
            await self._catch_up(upto=message["events"][-1]["seq"] if message["events"] else 0)
            return
        if not events:
            return  # already sent (by the catch-up, or before a reconnect)
        # Viewers of one run with the same rights share one render (and one trip to the
        # database thread); the fan-out has usually rendered it already.
        # The tail of a batch a catch-up read in part is a fragment of its own.
        stat = "renders" if len(events) == len(message["events"]) else "tail_renders"
        html = await live.cache.aget_or_render(
            self._events_key(events), lambda: self._render_events(events, stat)
        )
        self.last_seq = events[-1]["seq"]
        await self.send(text_data=html)

    def rendered(self, events: list[dict[str, Any]]) -> str:
        """The fragment for these events as this socket's viewer sees it: the same for every
        viewer of the run with the same rights (called in the database thread)."""
        return live.cache.get_or_render(
            self._events_key(events), lambda: self._render_events(events)
        )

    async def run_owed(self, message: dict[str, Any]) -> None:
        """A batch of this run never reached the socket (its render failed, or the channel was
        full): read it from the log, unless a catch-up already has."""
        await self._read_owed()

    async def _read_owed(self) -> None:
        if self.mode == "run" and self.owed_upto > self.last_seq:
            await self._catch_up(upto=self.owed_upto)

    async def live_resync(self, message: dict[str, Any]) -> None:
        """The process's feed missed events (dashboard.live.fanout.resync): read them from the
        database as after a reconnect, the side panels and the lists included."""
        if self.mode == "run":
            await self._catch_up(always_side=True)
        await self._send_all(await database_sync_to_async(self._refresh)())

    async def _send_all(self, messages: list[str]) -> None:
        for text in messages:
            await self.send(text_data=text)

    async def _catch_up(
        self, *, always_side: bool = False, connecting: bool = False, upto: int = 0
    ) -> None:
        """Read from the log what this socket lacks: everything committed now, and at least up
        to `upto` (the seq of the batch that showed the gap, or of what it is owed)."""
        self.busy += 1  # the fan-out sends nothing straight meanwhile
        owed = self.owed_upto  # what was owed before this read began, it covers
        shared = not connecting
        try:
            while True:
                # Sockets of the run at the same seq with the same rights (a hundred that all
                # missed one batch) share one read and render, as they share live batches. Not
                # while connecting: a read that began before this socket was registered may
                # miss what the feed had already fanned out.
                after = self.last_seq
                key = ("catch-up", self.run_id, after, self.rights, always_side)
                html, last, count = await live.cache.ashare(
                    key if shared else object(),
                    lambda after=after, side=always_side: self._render_from_db(after, side),
                )
                if html:
                    await self.send(text_data=html)
                self.last_seq = max(self.last_seq, last)
                always_side = False
                if count < CATCH_UP_CHUNK:
                    if self.last_seq < upto and shared:
                        # The shared read began before the batch that sent this socket here
                        # was committed (found by the chaos soak: a viewer never got a run's
                        # last event): once more, a read of its own.
                        shared = False
                        continue
                    if self.owed_upto == owed:
                        self.owed_upto = 0
                    return
        finally:
            self.busy -= 1

    def _load_run(self, run_id: int):
        run = Run.objects.filter(pk=run_id).first()
        if run is None or not access.can_see(self.user, run):
            return None
        return access.Rights.of(self.user, run), run.last_seq

    def _render_from_db(self, after: int, always_side: bool) -> tuple[str, int, int]:
        fanout.viewers.stats["catch_up_reads"] += 1
        rows = stream.after(self.run_id, after, limit=CATCH_UP_CHUNK)
        if not rows and not always_side:
            return "", after, 0
        if rows:  # a reconnect may catch up on events a rewind has since abandoned
            stream.mark_abandoned(rows, Event.objects.abandoned_ranges(self.run_id))
        html = panels.render_push(
            self.run_id, rows, self.rights, panels.PANELS if always_side else None
        )
        return html, rows[-1].seq if rows else after, len(rows)

    def _events_key(self, events: list[dict[str, Any]]) -> tuple:
        return ("run", self.run_id, events[0]["seq"], events[-1]["seq"], self.rights)

    def _render_events(self, events: list[dict[str, Any]], stat: str = "renders") -> str:
        fanout.viewers.stats[stat] += 1
        rows = stream.attach_approvals([stream.from_message(e) for e in events])
        return panels.render_push(self.run_id, rows, self.rights)

    # --- lists, inbox, header count ----------------------------------------------------------
    async def runs_changed(self, message: dict[str, Any]) -> None:
        runs = [r for r in message["runs"] if self.sees_all or r["owner"] == self.user.pk]
        if not runs:
            return
        if self.mode in {"run", "page"} and not any(r["approvals"] for r in runs):
            return  # these pages show only the approval count from this stream
        await self._send_all(await database_sync_to_async(self._render_runs)(runs))

    def _render_runs(self, runs: list[dict[str, Any]]) -> list[str]:
        """The messages for changed runs: the header's count, and the list's rows or the
        inbox's cards (dashboard/live/frames.py keeps rows apart from the count)."""
        parts = []
        approvals = [a for r in runs for a in r["approvals"]]
        if approvals:
            parts.append(self._count())
        if self.mode == "list":
            parts += self._rows(runs)
        elif self.mode == "approvals" and approvals:
            parts.append(self._cards(approvals))
        return frames(parts)

    def _shows_new_rows(self) -> bool:
        return (
            self.query.get("page", "1") == "1"
            and not self.query.get("q")
            and not self.query.get("group")  # grouped by fleet: a new row's place is its fleet's
            and self.query.get("status", "") in {"", RunStatus.QUEUED}
        )

    def _rows(self, runs: list[dict[str, Any]]) -> list[str]:
        """The changed rows of a runs list, rendered once per process for every socket that
        shows them alike; the runs not rendered yet are read in one query."""
        new_rows = self._shows_new_rows()
        keys = {r["id"]: ("row", r["id"], r["seq"], r["created"] and new_rows) for r in runs}
        missing = [run_id for run_id, key in keys.items() if key not in live.cache]
        found = Run.objects.filter(pk__in=missing).for_list().in_bulk() if missing else {}

        def row(run_id: int, new: bool) -> str:
            # Read again only if the cache let the row go since `missing` was worked out.
            run = found.get(run_id) or Run.objects.filter(pk=run_id).for_list().first()
            return render_row(run, new=new)

        return [
            live.cache.get_or_render(
                keys[r["id"]], lambda r=r: row(r["id"], r["created"] and new_rows)
            )
            for r in runs
        ]

    def _count(self) -> str:
        return render_to_string(
            "base.html#approval-count",
            {"pending_approvals": access.pending_count(self.user), "oob": True},
        )

    def _cards(self, approvals: list[tuple[int, str]]) -> str:
        found = Approval.objects.select_related("run__parent", "decided_by").in_bulk(
            [a for a, _ in approvals]
        )
        can = access.can_decide(self.user)
        parts = []
        for approval_id, kind in approvals:
            approval = found.get(approval_id)
            if approval is None:
                continue
            new = kind == "approval.requested" and approval.status == "pending"
            parts.append(
                cards.render(
                    approval, can_decide=can, show_run=True, oob=True, new=new, user=self.user
                )
            )
        return "".join(parts)

    def _refresh(self) -> list[str]:
        """After a reconnect: what may have changed while the socket was down (messages)."""
        parts = [self._count()]
        if self.mode == "approvals":
            parts.append(
                render_to_string(
                    "approvals/inbox.html#approval-list",
                    {
                        **inbox.context(self.user, self.query),
                        "can_decide": access.can_decide(self.user),
                        "oob": True,
                    },
                )
            )
        elif self.mode == "list":
            qs = access.visible_runs(self.user)
            if self.query.get("status") in RunStatus.values:
                qs = qs.filter(status=self.query["status"])
            if self.query.get("q"):
                qs = qs.filter(goal__icontains=self.query["q"])
            if self.query.get("page", "1") == "1":
                parts += [render_row(run) for run in reversed(list(qs.for_list()[:25]))]
        return frames(parts)


def render_row(run: Run | None, *, new: bool = False) -> str:
    """A runs list row, pushed: prepended to the list when new, else swapped in by id."""
    if run is None:
        return ""
    if new:
        return render_to_string("runs/list.html#new-row-oob", {"run": run})
    return render_to_string("runs/list.html#row-oob", {"run": run, "oob": True})
