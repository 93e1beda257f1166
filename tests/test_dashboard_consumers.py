"""The live sockets, through channels' WebsocketCommunicator: access on connect, catch-up after
a seq, live fan-out from the one tailer, gaps read from the database, lists and counts."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections, transaction
from django.test import Client

from agents import eventlog, services
from agents.models import Event
from dashboard import stream
from dashboard.live import fanout, hub, tail
from dashboard.live import feed as live
from shiftlog.routing import websocket_urlpatterns
from tests.helpers import drive_until_idle, make_run
from tests.procs import Procs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


class Socket(WebsocketCommunicator):
    """channels' test communicator, its connect waiting 10 s instead of 1: the consumer's connect
    reads the database on its one database thread, which took over a second on a loaded 2-core
    CI machine (the test then failed in the handshake, not in what it tests)."""

    async def connect(self, timeout: float = 10):
        return await super().connect(timeout)


def as_user(user):
    inner = URLRouter(websocket_urlpatterns)

    async def app(scope, receive, send):
        return await inner({**scope, "user": user}, receive, send)

    return app


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]


async def receive_until(comm, predicate, timeout=5.0) -> str:
    """Messages joined until `predicate(all_text)` holds."""
    import asyncio

    text = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate(text):
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"timed out; got:\n{text[-3000:]}")
        text += await comm.receive_from(timeout=remaining)
    return text


async def nothing_more(comm, wait=0.3) -> bool:
    return await comm.receive_nothing(timeout=wait)


append = database_sync_to_async(eventlog.append)


def stop_delivery():
    """Stop live delivery (the tailer, or with Redis the push from the committing process);
    returns what starts it again."""
    if settings.SHIFTLOG["LIVE_PUSH"]:
        eventlog.events_committed.disconnect(dispatch_uid=PUSH_UID)
        return lambda: eventlog.events_committed.connect(hub.push_committed, dispatch_uid=PUSH_UID)
    live.feed.task.cancel()
    return lambda: None


PUSH_UID = "dashboard.live.push"


def test_an_anonymous_socket_is_refused():
    from django.contrib.auth.models import AnonymousUser

    async def go():
        comm = Socket(as_user(AnonymousUser()), "/ws/live/")
        connected, _ = await comm.connect()
        assert not connected

    async_to_sync(go)()


def test_the_real_stack_checks_the_session_and_the_origin(owner):
    from shiftlog.asgi import application

    client = Client()
    client.force_login(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def go():
        ok = Socket(
            application,
            "/ws/live/",
            headers=[(b"cookie", cookie), (b"origin", b"http://127.0.0.1:8000")],
        )
        assert (await ok.connect())[0]
        await ok.disconnect()
        no_session = Socket(
            application, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1:8000")]
        )
        assert not (await no_session.connect())[0]
        evil = Socket(
            application,
            "/ws/live/",
            headers=[(b"cookie", cookie), (b"origin", b"http://evil.example")],
        )
        assert not (await evil.connect())[0]

    async_to_sync(go)()


def test_a_run_socket_needs_the_right_to_see_the_run(owner, viewer, outsider):
    run = make_run(created_by=owner)

    async def go():
        for user, expected in ((owner, True), (viewer, True), (outsider, False)):
            comm = Socket(as_user(user), f"/ws/live/runs/{run.pk}/?after=0")
            connected, _ = await comm.connect()
            assert connected is expected, user
            if connected:
                await comm.disconnect()
        missing = Socket(as_user(owner), "/ws/live/runs/999999/")
        assert not (await missing.connect())[0]

    async_to_sync(go)()


def test_a_socket_catches_up_after_the_seq_it_holds_then_streams_live(owner):
    run = drive_until_idle(make_run(created_by=owner, turns=[{"text": "one"}, {"text": "two"}]))
    last = run.last_seq

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after=3")
        assert (await comm.connect())[0]
        got = await receive_until(comm, lambda t: last in seqs(t))
        assert seqs(got) == list(range(4, last + 1))
        assert 'hx-swap-oob="beforeend"' in got and 'id="run-header"' in got
        await append(run.pk, "human.note", {"text": "live <b>one</b>"}, actor="user:olivia")
        await append(run.pk, "human.note", {"text": "live two"}, actor="user:olivia")
        more = await receive_until(comm, lambda t: last + 2 in seqs(t))
        assert seqs(more) == [last + 1, last + 2]
        assert "live &lt;b&gt;one&lt;/b&gt;" in more
        assert await nothing_more(comm)
        await comm.disconnect()

    async_to_sync(go)()


def test_a_socket_that_holds_everything_gets_no_replay(owner):
    run = drive_until_idle(make_run(created_by=owner, turns=[{"text": "one"}]))

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={run.last_seq}")
        assert (await comm.connect())[0]
        assert await nothing_more(comm)
        await comm.disconnect()

    async_to_sync(go)()


def test_a_dropped_message_is_read_from_the_database(owner):
    run = make_run(created_by=owner)

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={run.last_seq}")
        assert (await comm.connect())[0]
        start = run.last_seq
        # Three events; the layer "loses" the first two, only the third reaches the socket.
        restore = stop_delivery()
        try:
            await append(run.pk, "human.note", {"text": "a"})
            await append(run.pk, "human.note", {"text": "b"})
            third = await append(run.pk, "human.note", {"text": "c"})
        finally:
            restore()
        assert await nothing_more(comm), "delivery was stopped"
        values = await database_sync_to_async(
            lambda: Event.objects.filter(pk=third.pk).values(
                *stream.EVENT_FIELDS, "run__created_by_id"
            )[0]
        )()
        await fanout.publish(get_channel_layer(), [values])
        got = await receive_until(comm, lambda t: start + 3 in seqs(t))
        assert seqs(got) == [start + 1, start + 2, start + 3]
        await comm.disconnect()

    async_to_sync(go)()


def test_many_sockets_share_one_delivery_and_each_gets_every_event_once(owner):
    run = make_run(created_by=owner)

    async def go():
        comms = [
            Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={run.last_seq}")
            for _ in range(20)
        ]
        for c in comms:
            assert (await c.connect())[0]
        task = live.feed.task
        for i in range(5):
            await append(run.pk, "human.note", {"text": f"n{i}"})
        want = list(range(run.last_seq + 1, run.last_seq + 6))
        for c in comms:
            got = await receive_until(c, lambda t: want[-1] in seqs(t))
            assert seqs(got) == want
        # One per process: the tailer, or with Redis the listener to what committers publish.
        assert task is not None and live.feed.task is task
        for c in comms:
            await c.disconnect()

    async_to_sync(go)()


def test_the_runs_list_gets_new_runs_and_status_changes(owner, outsider):
    async def go():
        mine = Socket(as_user(owner), "/ws/live/runs/?page=1")
        theirs = Socket(as_user(outsider), "/ws/live/runs/?page=1")
        assert (await mine.connect())[0] and (await theirs.connect())[0]
        run = await database_sync_to_async(make_run)(created_by=owner, goal="brand new")
        got = await receive_until(mine, lambda t: "brand new" in t)
        assert (
            '<tbody id="run-rows" hx-swap-oob="afterbegin">' in got and f'id="run-{run.pk}"' in got
        )
        await database_sync_to_async(services.pause_run)(run.pk, actor="user:olivia")
        paused = await receive_until(mine, lambda t: "paused" in t)
        assert f'<tr id="run-{run.pk}" hx-swap-oob="true">' in paused
        assert await nothing_more(theirs)  # an outsider hears nothing of it
        await mine.disconnect()
        await theirs.disconnect()

    async_to_sync(go)()


async def list_with_two_runs(owner):
    """A runs-list socket of `owner`'s that has shown two new runs of theirs."""
    mine = Socket(as_user(owner), "/ws/live/runs/?page=1")
    assert (await mine.connect())[0]
    a = await database_sync_to_async(make_run)(created_by=owner, goal="the first run")
    b = await database_sync_to_async(make_run)(created_by=owner, goal="the second run")
    await receive_until(mine, lambda t: "the first run" in t and "the second run" in t)
    return mine, a, b


def test_a_row_a_full_channel_turned_away_comes_with_the_socket_s_next_message(owner, monkeypatch):
    """A list socket far behind (its channel full) when a run's status changes: that change
    must not be lost for good (it was: a run's last change, turned away, left its row as it
    was until a reload). The row goes with the next message the socket takes."""
    from channels.exceptions import ChannelFull

    async def go():
        mine, a, b = await list_with_two_runs(owner)
        layer = get_channel_layer()
        real, turned = layer.send, []

        async def full_for_a(channel, message):
            runs = message.get("runs", []) if message.get("type") == "runs.changed" else []
            if not turned and any(r["id"] == a.pk for r in runs):
                turned.append(channel)
                raise ChannelFull()
            return await real(channel, message)

        monkeypatch.setattr(layer, "send", full_for_a)
        await database_sync_to_async(services.pause_run)(a.pk, actor="user:olivia")
        for _ in range(200):
            if turned:
                break
            await asyncio.sleep(0.05)
        assert turned, "the change never reached the fan-out"
        assert await nothing_more(mine)
        # What waited on the full channel: the socket's next message (here another run's row).
        await database_sync_to_async(services.pause_run)(b.pk, actor="user:olivia")
        got = await receive_until(
            mine, lambda t: f'<tr id="run-{a.pk}"' in t and f'<tr id="run-{b.pk}"' in t
        )
        row_a = got[got.index(f'<tr id="run-{a.pk}"') :]
        assert "paused" in row_a[: row_a.index("</tr>")]
        await mine.disconnect()

    async_to_sync(go)()


def test_a_resync_a_full_channel_turned_away_comes_with_the_socket_s_next_message(
    owner, monkeypatch
):
    """The feed missed a while (Redis went away) and every page must read again: a list page
    whose channel is full then must not lose its read for good (it did: only run pages kept
    theirs). It reads the list and the count again after the next message it takes."""
    from channels.exceptions import ChannelFull

    from agents.models import Run

    async def go():
        mine, a, b = await list_with_two_runs(owner)
        # A change nobody here heard of (published while the feed was away).
        await database_sync_to_async(
            lambda: Run.objects.filter(pk=a.pk).update(goal="changed while Redis was away")
        )()
        layer = get_channel_layer()
        real = layer.send

        async def full_for_resync(channel, message):
            if message.get("type") == "live.resync":
                raise ChannelFull()
            return await real(channel, message)

        monkeypatch.setattr(layer, "send", full_for_resync)
        await fanout.resync(layer)
        assert await nothing_more(mine)
        # What waited on the full channel: the socket's next message (here another run's row).
        await database_sync_to_async(services.pause_run)(b.pk, actor="user:olivia")
        got = await receive_until(mine, lambda t: "changed while Redis was away" in t)
        assert 'id="approval-count"' in got  # the header's count is read again too
        row_a = got[got.index(f'<tr id="run-{a.pk}"') :]
        assert "changed while Redis was away" in row_a[: row_a.index("</tr>")]
        assert fanout.viewers.stats["resyncs_owed"] >= 1
        await mine.disconnect()

    async_to_sync(go)()


def test_waiting_approvals_reach_the_header_count_and_the_inbox(owner, viewer):
    async def go():
        header = Socket(as_user(viewer), "/ws/live/")
        inbox = Socket(as_user(viewer), "/ws/live/approvals/")
        assert (await header.connect())[0] and (await inbox.connect())[0]
        run = await database_sync_to_async(
            lambda: drive_until_idle(services.create_demo_run(created_by=owner))
        )()
        count = await receive_until(header, lambda t: 'id="approval-count"' in t)
        assert 'hx-swap-oob="true"' in count and ">1</span>" in count
        card = await receive_until(inbox, lambda t: "rm -rf build" in t)
        assert '<div id="approval-list" hx-swap-oob="afterbegin">' in card
        assert f"run {run.pk}" in card and 'value="approve"' not in card  # vic may not decide
        await header.disconnect()
        await inbox.disconnect()

    async_to_sync(go)()


def test_a_reconnect_refreshes_the_count(owner):
    async def go():
        comm = Socket(as_user(owner), "/ws/live/?reconnect=1")
        assert (await comm.connect())[0]
        got = await comm.receive_from(timeout=3)
        assert 'id="approval-count"' in got
        await comm.disconnect()

    async_to_sync(go)()


def test_an_event_committed_by_another_process_reaches_the_socket(owner, tmp_path):
    """The worker is another process: its events reach this process's sockets (through the
    tailer, or with Redis pushed by the worker itself right after its commit)."""
    run = make_run(created_by=owner)
    procs = Procs(tmp_path)

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={run.last_seq}")
        assert (await comm.connect())[0]
        code = (
            "import sys\nfrom agents import eventlog\n"
            "eventlog.append(int(sys.argv[1]), 'human.note', {'text': 'from afar'})"
        )
        proc = await database_sync_to_async(procs.python)("appender", code, str(run.pk))
        try:
            got = await receive_until(comm, lambda t: "from afar" in t, timeout=20)
        finally:
            await database_sync_to_async(proc.wait)(20)
            procs.close()
        assert seqs(got) == [run.last_seq + 1], got
        await comm.disconnect()

    async_to_sync(go)()


def test_on_postgresql_the_tail_also_finds_an_event_that_commits_after_a_later_one(owner):
    """PostgreSQL takes an id at insert: a transaction holding a smaller id may commit after a
    larger one was read. The tailer looks back for such ids (SQLite serialises writers)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers: ids commit in order")
    slow_run, fast_run = make_run(created_by=owner), make_run(created_by=owner)
    inserted, release = threading.Event(), threading.Event()

    def slow_writer():
        with transaction.atomic():
            eventlog.append(slow_run.pk, "human.note", {"text": "late"})
            inserted.set()
            release.wait(10)
        connections.close_all()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    try:
        assert inserted.wait(10)
        start = Event.objects.order_by("pk").values_list("pk", flat=True).first() - 1
        fast = eventlog.append(fast_run.pk, "human.note", {"text": "early"})
        recent: set[int] = set()
        first = tail._events_after(start, recent)
        assert [r["payload"]["text"] for r in first if r["kind"] == "human.note"] == ["early"]
        recent.update(r["pk"] for r in first)
    finally:
        release.set()
        thread.join(10)
    late = tail._events_after(fast.pk, recent)
    assert [(r["run_id"], r["payload"]["text"]) for r in late] == [(slow_run.pk, "late")]
    recent.update(r["pk"] for r in late)
    assert tail._events_after(fast.pk, recent) == []  # and it is sent once


def test_a_push_carries_only_the_panels_its_events_change(owner):
    from agents import checkpoints as cps

    run = make_run(created_by=owner)

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={run.last_seq}")
        assert (await comm.connect())[0]
        await append(run.pk, "model.turn", {"text": "thinking", "content": [], "usage": {}})
        turn = await receive_until(comm, lambda t: 'id="sessions"' in t)
        assert 'id="meters"' in turn
        assert 'id="checkpoints"' not in turn and 'id="artifacts"' not in turn
        await database_sync_to_async(cps.create)(run.pk, kind="manual", label="now")
        cp = await receive_until(comm, lambda t: 'id="checkpoints"' in t)
        assert 'id="sessions"' not in cp and 'id="artifacts"' not in cp
        await comm.disconnect()

    async_to_sync(go)()


def test_a_rewind_discards_waiting_approvals_and_the_inbox_and_count_follow_live(owner):
    from agents import rewinds
    from agents.models import Approval

    run = drive_until_idle(services.create_demo_run(created_by=owner))
    waiting = list(Approval.objects.filter(run=run, status="pending"))
    assert waiting, run.status_reason
    target = run.checkpoints.get(kind="session_end")

    async def go():
        header = Socket(as_user(owner), "/ws/live/")
        inbox = Socket(as_user(owner), "/ws/live/approvals/")
        assert (await header.connect())[0] and (await inbox.connect())[0]
        await database_sync_to_async(rewinds.rewind)(run.pk, target.pk, actor="user:olivia")
        count = await receive_until(header, lambda t: 'id="approval-count"' in t)
        assert ">0</span>" in count, count
        cards = await receive_until(
            inbox, lambda t: all(f'id="approval-{a.pk}"' in t for a in waiting)
        )
        assert "a-discarded" in cards and 'value="approve"' not in cards, cards
        assert "Discarded" in cards and "rewind to checkpoint" in cards, cards
        await header.disconnect()
        await inbox.disconnect()

    async_to_sync(go)()
    for approval in waiting:
        approval.refresh_from_db()
        assert approval.status == "discarded"
        decided = Event.objects.get(
            run=run, kind="approval.decided", payload__approval_id=approval.pk
        )
        assert decided.payload["decision"] == "discarded" and decided.actor == "user:olivia"


def test_a_runs_list_push_reads_its_rows_in_one_query_however_many_change(owner):
    """No query per row: the rows that changed are read together (and rendered once)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.live.consumers import LiveConsumer

    consumer = LiveConsumer()
    consumer.user, consumer.mode, consumer.query = owner, "list", {}
    runs = [make_run(created_by=owner, goal=f"run {i}") for i in range(8)]

    def changed(some, seq):
        return [
            {"id": r.pk, "owner": owner.pk, "seq": seq, "created": False, "approvals": []}
            for r in some
        ]

    with CaptureQueriesContext(connection) as one:
        html = "".join(consumer._render_runs(changed(runs[:1], 1)))
    with CaptureQueriesContext(connection) as eight:
        html = "".join(consumer._render_runs(changed(runs, 2)))
    assert all(f'id="run-{r.pk}"' in html for r in runs)
    assert len(one) == len(eight) == 1, [q["sql"] for q in eight]
    with CaptureQueriesContext(connection) as cached:  # the same rows again: from the cache
        consumer._render_runs(changed(runs, 2))
    assert len(cached) == 0


def test_batches_out_of_order_or_with_a_gap_reach_each_page_once_in_order(owner):
    """A worker's push [n+1, n+3] and a person's [n+2] can reach the listener in either order,
    in one batch; a push can also be lost. Each page still gets every event once, in order."""
    run = make_run(created_by=owner)
    start = run.last_seq

    def values(*events):
        return list(
            Event.objects.filter(pk__in=[e.pk for e in events])
            .order_by("?")  # the order they arrive in is not the order they committed in
            .values(*stream.EVENT_FIELDS, "run__created_by_id")
        )

    async def go():
        comm = Socket(as_user(owner), f"/ws/live/runs/{run.pk}/?after={start}")
        assert (await comm.connect())[0]
        restore = stop_delivery()
        try:
            a, b, c = [await append(run.pk, "human.note", {"text": t}) for t in "abc"]
            d, _lost, f = [await append(run.pk, "human.note", {"text": t}) for t in "def"]
        finally:
            restore()
        layer = get_channel_layer()
        rows = await database_sync_to_async(values)(a, b, c)
        rows = sorted(rows, key=lambda r: r["seq"])
        await fanout.publish(layer, [rows[0], rows[2], rows[1], rows[2]])  # late, and twice
        got = await receive_until(comm, lambda t: c.seq in seqs(t))
        await fanout.publish(
            layer, await database_sync_to_async(values)(d, f)
        )  # the one between never came
        got += await receive_until(comm, lambda t: f.seq in seqs(t))
        assert seqs(got) == list(range(start + 1, start + 7))
        assert await nothing_more(comm)
        await comm.disconnect()

    async_to_sync(go)()
