"""The live fan-out (dashboard.live.fanout): a run's batch is rendered once per permission set
present among its viewers, never once per viewer, and every viewer still gets exactly its own
set's fragment, each event once, in order, nothing lost: in one process, and with two real
daphne processes on the same run (with Redis each listens once and fans out to its own)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from agents import eventlog, services
from agents.models import Event
from dashboard import stream
from dashboard.live import fanout
from tests.helpers import make_run
from tests.procs import Procs, free_port
from tests.test_dashboard_consumers import Socket, as_user, receive_until, seqs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

append = database_sync_to_async(eventlog.append)


def test_a_batch_is_rendered_once_per_permission_set_and_each_viewer_gets_its_own(owner, viewer):
    """Six viewers who control the run (its owner) and six who may only watch: each batch is
    rendered at most twice, sent straight to all twelve, and only the owner's get the buttons."""
    run = make_run(created_by=owner)
    start = run.last_seq

    async def go():
        users = [owner] * 6 + [viewer] * 6
        comms = [Socket(as_user(u), f"/ws/live/runs/{run.pk}/?after={start}") for u in users]
        for c in comms:
            assert (await c.connect())[0]
        await asyncio.sleep(0.3)  # with Redis, the run's own first events may still be in flight
        before = dict(fanout.viewers.stats)
        for i in range(4):
            await append(run.pk, "human.note", {"text": f"note <i>{i}</i>"}, actor="user:olivia")
        await database_sync_to_async(services.pause_run)(run.pk, actor="user:olivia")
        last = await database_sync_to_async(lambda: type(run).objects.get(pk=run.pk).last_seq)()
        want = list(range(start + 1, last + 1))
        got = []
        for c in comms:
            got.append(await receive_until(c, lambda t: last in seqs(t), timeout=10))
        stats = {k: fanout.viewers.stats[k] - before.get(k, 0) for k in fanout.viewers.stats}
        for user, html in zip(users, got, strict=True):
            assert seqs(html) == want, (user, seqs(html))  # each once, in order, none lost
            assert "note &lt;i&gt;0&lt;/i&gt;" in html and "<i>0</i>" not in html  # escaped
            if user == owner:
                assert re.search(r"/runs/\d+/resume\b", html), "the owner's header has Resume"
            else:
                assert not re.search(r"/runs/\d+/(resume|pause|cancel)\b", html), html
        # One render per permission set per batch, however many viewers; all sent straight.
        assert stats["events"] == len(want)
        assert 1 <= stats["batches"] <= len(want)
        assert stats["batches"] <= stats["renders"] <= 2 * stats["batches"], stats
        assert stats["frames"] == 12 * stats["batches"], stats
        assert stats.get("queued", 0) == 0, stats
        for c in comms:
            assert await c.receive_nothing(timeout=0.2)
            await c.disconnect()
        assert run.pk not in fanout.viewers.by_run  # the sockets left the registry

    async_to_sync(go)()


def test_a_viewer_who_may_not_see_the_run_gets_nothing_of_it(owner, outsider):
    run = make_run(created_by=owner)

    async def go():
        watcher = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after=0")
        assert (await watcher.connect())[0]
        refused = Socket(as_user(outsider), f"/ws/live/runs/{run.pk}/?after=0")
        assert not (await refused.connect())[0]
        header = Socket(as_user(outsider), "/ws/live/")
        assert (await header.connect())[0]
        await append(run.pk, "human.note", {"text": "private"})
        await receive_until(watcher, lambda t: "private" in t)
        assert await header.receive_nothing(timeout=0.5)
        assert all(s.user == owner for s in fanout.viewers.by_run[run.pk])
        await watcher.disconnect()
        await header.disconnect()

    async_to_sync(go)()


def test_a_socket_still_catching_up_gets_live_batches_in_order_after_it(owner):
    """A socket registers before its catch-up reads the database: what is committed meanwhile
    waits on its own channel and follows the catch-up, each event once."""
    run = make_run(created_by=owner)

    async def go():
        first = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after=0")
        assert (await first.connect())[0]
        await receive_until(first, lambda t: run.last_seq in seqs(t))
        writer = asyncio.ensure_future(notes(run.pk, 30))
        late = []
        for _ in range(3):  # sockets that join while events are being committed
            await asyncio.sleep(0.05)
            c = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after=0")
            assert (await c.connect())[0]
            late.append(c)
        last = await writer
        for c in [first, *late]:
            html = await receive_until(c, lambda t: last in seqs(t), timeout=15)
            assert seqs(html) == list(range(1 if c in late else run.last_seq + 1, last + 1))
            await c.disconnect()

    async_to_sync(go)()


def test_viewers_who_all_missed_a_batch_share_one_catch_up(owner):
    """A batch lost for every viewer (the feed stopped) is read from the database once for all
    the viewers at the same seq with the same rights, not once each."""
    from tests.test_dashboard_consumers import stop_delivery

    run = make_run(created_by=owner)
    start = run.last_seq

    async def go():
        comms = [
            Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}") for _ in range(10)
        ]
        for c in comms:
            assert (await c.connect())[0]
        await asyncio.sleep(0.3)
        restore = stop_delivery()
        try:
            await append(run.pk, "human.note", {"text": "lost"})
            second = await append(run.pk, "human.note", {"text": "arrives"})
        finally:
            restore()
        before = fanout.viewers.stats["catch_up_reads"]
        values = await database_sync_to_async(
            lambda: (
                type(second)
                .objects.filter(pk=second.pk)
                .values(*stream.EVENT_FIELDS, "run__created_by_id")[0]
            )
        )()
        await fanout.publish(get_channel_layer(), [values])
        for c in comms:
            html = await receive_until(c, lambda t: start + 2 in seqs(t))
            assert seqs(html) == [start + 1, start + 2]
        reads = fanout.viewers.stats["catch_up_reads"] - before
        assert 1 <= reads <= 2, reads  # ten without sharing
        for c in comms:
            await c.disconnect()

    async_to_sync(go)()


def test_a_batch_a_full_channel_turned_away_comes_with_whatever_the_socket_takes_next(
    owner, monkeypatch
):
    """A run page far behind (its channel full) when its run's batch is fanned out reads that
    batch from the log after the next message it takes, whatever that is: it did only when the
    next was another batch of its run, which a run's last batch never has."""
    from channels.exceptions import ChannelFull

    run = make_run(created_by=owner)
    start = run.last_seq

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}")
        assert (await comm.connect())[0]
        (sock,) = fanout.viewers.by_run[run.pk]
        layer = get_channel_layer()
        real = layer.send

        async def full_for_the_run(channel, message):
            if channel == sock.channel_name and message["type"] in {"run.events", "run.owed"}:
                raise ChannelFull()
            return await real(channel, message)

        monkeypatch.setattr(layer, "send", full_for_the_run)
        sock.busy += 1  # (catching up: the fan-out puts the batch on its channel, full)
        last = (await append(run.pk, "human.note", {"text": "the run's last word"})).seq
        for _ in range(200):
            if sock.owed_upto >= last:
                break
            await asyncio.sleep(0.05)
        assert sock.owed_upto >= last, "the batch never reached the fan-out"
        sock.busy -= 1
        assert await comm.receive_nothing(timeout=0.3)
        # Its next message is not a batch of its run (here: rows it does not show).
        await real(sock.channel_name, {"type": "runs.changed", "runs": []})
        html = await receive_until(comm, lambda t: last in seqs(t), timeout=10)
        assert seqs(html) == [last] and sock.owed_upto == 0
        await comm.disconnect()

    async_to_sync(go)()


def test_a_run_s_last_batch_whose_render_fails_still_reaches_every_viewer(owner, monkeypatch):
    """The fan-out's render can fail (the chaos soak: the database dropped the web process's
    connection). A viewer reads a gap at its next event, but a run's last event has no next
    one: the viewers read the batch from the log at once instead."""
    from dashboard.live.consumers import LiveConsumer

    run = make_run(created_by=owner)
    start = run.last_seq
    real, failed = LiveConsumer.rendered, []

    def rendered_once_failing(self, events):
        if not failed:
            failed.append(events[0]["seq"])
            raise RuntimeError("terminating connection due to administrator command")
        return real(self, events)

    monkeypatch.setattr(LiveConsumer, "rendered", rendered_once_failing)

    async def go():
        comms = [Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}") for _ in range(3)]
        for c in comms:
            assert (await c.connect())[0]
        await asyncio.sleep(0.3)
        last = (await append(run.pk, "human.note", {"text": "the run's last word"})).seq
        for c in comms:
            html = await receive_until(c, lambda t: last in seqs(t), timeout=10)
            assert seqs(html) == [last] and "the run&#x27;s last word" in html
            assert await c.receive_nothing(timeout=0.2)  # once
        assert failed == [last]
        assert all(s.owed_upto == 0 for s in fanout.viewers.by_run[run.pk])
        for c in comms:
            await c.disconnect()

    async_to_sync(go)()


async def notes(run_id: int, count: int) -> int:
    last = 0
    for i in range(count):
        last = (await append(run_id, "human.note", {"text": f"n{i}"})).seq
        await asyncio.sleep(0.01)
    return last


@pytest.mark.slow
def test_two_daphne_processes_each_render_once_per_permission_set(owner, viewer, tmp_path):
    """Two real web processes watching one run (in the embedded mode each tails the log; with
    Redis each listens to the hub once): every viewer on either gets every event once, in order,
    its own set's fragment, and each process renders a batch at most once per set."""
    from websockets.asyncio.client import connect

    run = make_run(created_by=owner)
    start = run.last_seq
    procs = Procs(tmp_path)
    token = "fanout-test-token"
    cookies = {}
    for user in (owner, viewer):
        client = Client()
        client.force_login(user)
        cookies[user.pk] = client.cookies["sessionid"].value
    ports = [free_port(), free_port()]
    for i, port in enumerate(ports):
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        procs.spawn(
            f"daphne-{i}",
            [*argv, "shiftlog.asgi:application"],
            procs.env(SHIFTLOG_METRICS_TOKEN=token, SHIFTLOG_LOG_LEVEL="WARNING"),
        )

    def metrics(port: int) -> dict[str, float]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            text = r.read().decode()
        return {
            k: float(v) for k, v in re.findall(r"^shiftlog_live_(\w+)_total (\S+)$", text, re.M)
        }

    async def go():
        for port in ports:
            await wait_up(port)
        sockets = []
        for port in ports:
            for user in [owner] * 3 + [viewer] * 3:
                ws = await connect(
                    f"ws://127.0.0.1:{port}/ws/live/runs/{run.pk}/?after={start}",
                    origin=f"http://127.0.0.1:{port}",
                    additional_headers={"Cookie": f"sessionid={cookies[user.pk]}"},
                    proxy=None,
                )
                sockets.append((user, ws))
        last = await notes(run.pk, 20)
        await database_sync_to_async(services.pause_run)(run.pk, actor="user:olivia")
        last += 1
        for user, ws in sockets:
            text = ""
            while last not in seqs(text):
                text += await asyncio.wait_for(ws.recv(), timeout=15)
            assert seqs(text) == list(range(start + 1, last + 1)), (user, seqs(text))
            has_buttons = bool(re.search(r"/runs/\d+/resume\b", text))
            assert has_buttons is (user == owner)
            await ws.close()
        for port in ports:
            stats = await asyncio.to_thread(metrics, port)
            assert stats["events"] == last - start, stats
            assert stats["batches"] <= stats["renders"] <= 2 * stats["batches"], stats
            # Each batch reached each of the six sockets: straight, through its channel, or
            # already read from the log by a catch-up that raced the fan-out.
            delivered = stats["frames"] + stats["queued"] + stats["held"]
            assert delivered >= 6 * stats["batches"], stats

    try:
        async_to_sync(go)()
    finally:
        procs.close()


async def wait_up(port: int, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed")
def test_after_redis_restarts_empty_the_hub_listener_joins_again_and_pages_catch_up(
    owner, tmp_path
):
    """A Redis of its own, killed and started again empty: the listener's membership of the hub
    group went with it. It joins again (what is published next reaches it), and every page reads
    from the database what was committed while nobody here was listening."""
    from channels_redis.core import RedisChannelLayer

    from dashboard.live import feed as live
    from dashboard.live import hub

    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp_path)]

    def redis() -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return proc
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    server = redis()
    run = make_run(created_by=owner)
    start = run.last_seq
    layer = RedisChannelLayer(hosts=[f"redis://127.0.0.1:{port}/0"])

    async def publish(event) -> None:
        values = await database_sync_to_async(
            lambda: (
                Event.objects.filter(pk=event.pk)
                .values(*stream.EVENT_FIELDS, "run__created_by_id")
                .get()
            )
        )()
        await layer.group_send(hub.HUB_GROUP, {"type": "hub.rows", "rows": [hub.to_hub(values)]})

    async def go():
        nonlocal server
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}")
        assert (await comm.connect())[0]
        if live.feed.task is not None:  # this process's own feed (the tail, on SQLite): stopped
            live.feed.task.cancel()
        channel = await layer.new_channel()
        await layer.group_add(hub.HUB_GROUP, channel)
        listener = asyncio.get_running_loop().create_task(hub.listen(layer, channel))
        try:
            first = await append(run.pk, "human.note", {"text": "before"})
            await publish(first)
            assert seqs(await receive_until(comm, lambda t: first.seq in seqs(t))) == [first.seq]
            server.kill()
            server.wait()
            missed = await append(run.pk, "human.note", {"text": "while Redis was away"})
            server = redis()  # empty: no group, no members
            got = await receive_until(comm, lambda t: missed.seq in seqs(t), timeout=30)
            assert seqs(got) == [missed.seq]  # the resync's catch-up, from the database
            after = await append(run.pk, "human.note", {"text": "after"})
            await publish(after)  # reaches the listener: it joined again
            got = await receive_until(comm, lambda t: after.seq in seqs(t), timeout=10)
            assert seqs(got) == [after.seq]
            assert await comm.receive_nothing(timeout=0.5)  # and nothing twice
            assert fanout.viewers.stats["resyncs"] >= 1
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await comm.disconnect()

    try:
        async_to_sync(go)()
    finally:
        server.kill()
        server.wait()


def test_a_viewer_that_joins_a_catch_up_begun_before_its_event_still_gets_the_event(
    owner, monkeypatch
):
    """Viewers of a run at the same seq share one catch-up read. Found by the chaos soak (a viewer
    never got a run's last event): a viewer sent to catch up by a batch committed after a shared
    read began got only what that read saw, and the batch that sent it was gone. It now reads
    again, on its own, up to the batch."""
    run = make_run(created_by=owner)
    start = run.last_seq
    real_after, reads = stream.after, []

    def before_the_second_event(run_id, after, *, limit=1000):
        rows = real_after(run_id, after, limit=limit)
        if not reads:  # the first read began before start + 2 was committed, and is slow
            rows = [r for r in rows if r.seq <= start + 1]
            time.sleep(0.3)
        reads.append(after)
        return rows

    async def go():
        a, b = (Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}") for _ in "ab")
        assert (await a.connect())[0] and (await b.connect())[0]
        await asyncio.sleep(0.3)
        sockets = list(fanout.viewers.by_run[run.pk])
        for s in sockets:  # both miss the next two batches, as when Redis restarts
            fanout.viewers.discard(s)
        await append(run.pk, "human.note", {"text": "one"})
        last = (await append(run.pk, "human.note", {"text": "two"})).seq
        await asyncio.sleep(0.3)
        for s in sockets:
            fanout.viewers.add(s)
        batch = await database_sync_to_async(lambda: real_after(run.pk, last - 1, limit=10))()
        fields = [{f: getattr(r, f) for f in stream.EVENT_FIELDS} for r in batch]
        monkeypatch.setattr(stream, "after", before_the_second_event)
        first, second = sockets
        first.owed_upto = start + 1  # the first was owed a batch (fanout.owe)
        reading = asyncio.create_task(first.run_owed({"type": "run.owed"}))
        await asyncio.sleep(0.1)  # the read is under way
        await second.run_events({"events": [stream.to_message(f) for f in fields]})
        await reading
        assert reads[0] == start and start not in reads[1:]  # the second joined the first's read
        assert first.last_seq == start + 1  # all the first asked for
        assert second.last_seq == last  # not only what the shared read saw
        pages = []
        for c in (a, b):  # receive_from's timeout would end the socket: look first
            text = ""
            while not await c.receive_nothing(timeout=0.5):
                text += await c.receive_from()
            pages.append(seqs(text))
        # Each page got the shared read's event; the second's its own read's too.
        assert sorted(pages) == [[start + 1], [start + 1, last]]
        for c in (a, b):
            await c.disconnect()

    async_to_sync(go)()
