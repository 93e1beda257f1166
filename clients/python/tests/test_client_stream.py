"""Server-Sent Events: parsing, the end of the stream, and resuming after a dropped connection."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from client_helpers import event_json, make_async, problem
from shiftlog_client import NotFound, StreamDropped
from shiftlog_client._sse import SSEParser

pytestmark = pytest.mark.no_services


def frame(seq: int, kind: str = "tool.call") -> bytes:
    return f"id: {seq}\nevent: {kind}\ndata: {json.dumps(event_json(seq, kind))}\n\n".encode()


END = b"event: end\ndata: {}\n\n"


def sse(*chunks: bytes, drop: bool = False, is_async: bool = False) -> httpx.Response:
    """A text/event-stream answer sent chunk by chunk; `drop` breaks the connection after."""

    def body():
        yield from chunks
        if drop:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    async def abody():
        for chunk in body():
            yield chunk

    content = abody() if is_async else body()
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)


def test_the_parser_follows_the_rules():
    parser = SSEParser()
    lines = [": keep-alive", "id: 7", "event: tool.call", "data: {\"a\":", "data: 1}", "retry: 500",
             "", "data:no space", "", "", "id: 8", "event: end", ""]  # fmt: skip
    messages = [m for line in lines if (m := parser.feed(line)) is not None]
    assert [(m.event, m.data, m.id) for m in messages] == [
        ("tool.call", '{"a":\n1}', "7"),
        ("message", "no space", "7"),  # the id carries on
        ("end", "", "8"),
    ]
    assert messages[0].retry == 500 and parser.retry == 500
    assert parser.last_id == "8"


def test_stream_yields_events_skips_comments_and_ends_on_end(make_client):
    client, rec = make_client(
        sse(b": keep-alive\n\n", frame(1, "run.status"), frame(2)[:20], frame(2)[20:], END)
    )
    events = list(client.stream_events(3))
    assert [(e.seq, e.kind) for e in events] == [(1, "run.status"), (2, "tool.call")]
    request = rec.requests[0]
    assert request.url.path == "/api/v1/runs/3/events/stream"
    assert request.headers["accept"] == "text/event-stream"
    assert "last-event-id" not in request.headers
    assert "after" not in request.url.params


def test_stream_starts_after_a_seq(make_client):
    client, rec = make_client(sse(frame(6), END))
    assert [e.seq for e in client.stream_events(3, after=5)] == [6]
    assert rec.requests[0].url.params["after"] == "5"


def test_a_dropped_connection_resumes_with_last_event_id(make_client):
    client, rec = make_client(
        sse(frame(1), frame(2), frame(3)[:15], drop=True),  # drops in the middle of event 3
        sse(frame(3), frame(4), drop=False),  # ends without `end`: reconnect again
        sse(frame(5), END),
    )
    seqs = [e.seq for e in client.stream_events(3, after=0)]
    assert seqs == [1, 2, 3, 4, 5]  # no gap, no duplicate
    assert rec.requests[0].url.params["after"] == "0"
    assert rec.requests[1].headers["last-event-id"] == "2"
    assert "after" not in rec.requests[1].url.params
    assert rec.requests[2].headers["last-event-id"] == "4"
    assert client.sleeps == [1.0, 1.0]


def test_reconnect_honours_the_servers_retry_field(make_client):
    client, _ = make_client(sse(b"retry: 250\n\n", frame(1), drop=True), sse(END))
    assert [e.seq for e in client.stream_events(3)] == [1]
    assert client.sleeps == [0.25]


def test_a_stream_that_keeps_dropping_gives_up(make_client):
    client, rec = make_client(lambda _: sse(b": keep-alive\n\n", drop=True), max_reconnects=2)
    with pytest.raises(StreamDropped):
        list(client.stream_events(3))
    assert len(rec.requests) == 3


def test_an_error_answer_raises_at_once(make_client):
    client, rec = make_client(problem(404, "Not Found", "no run with id 3"))
    with pytest.raises(NotFound):
        list(client.stream_events(3))
    assert len(rec.requests) == 1


def test_a_429_on_connect_is_retried(make_client):
    limited = problem(429, "Too Many Requests", headers={"Retry-After": "3"})
    client, _ = make_client(limited, sse(frame(1), END))
    assert [e.seq for e in client.stream_events(3)] == [1]
    assert client.sleeps == [3.0]


def test_async_stream_resumes_the_same_way():
    async def main():
        client, rec = make_async(
            sse(frame(1), frame(2), drop=True, is_async=True), sse(frame(3), END, is_async=True)
        )
        async with client:
            seqs = [e.seq async for e in client.stream_events(3)]
        return seqs, rec, client.sleeps

    seqs, rec, sleeps = asyncio.run(main())
    assert seqs == [1, 2, 3]
    assert rec.requests[1].headers["last-event-id"] == "2"
    assert sleeps == [1.0]
