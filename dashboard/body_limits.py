"""Request bodies under daphne: limited as they arrive, and never held in memory whole.

daphne (on twisted) reads a request's whole body before the application sees any of it:
twisted into a temporary file, then daphne out of that file into the application's queue, all at
once. A 600 MB workspace upload grew the web process by 600 MB, and its 413 could come only after
the last byte. So daphne's request is replaced (`install()`, from shiftlog/asgi.py, which daphne
imports before it serves) by one that
- stops reading at the cap, when Content-Length says more (before any `100 Continue`) or as the
  chunks arrive (a chunked body has no length), and answers 413 itself: a workspace upload's cap is
  its run's (the workspace cap, with room for the archive's headers, under
  SHIFTLOG_API_MAX_UPLOAD_MB), looked up in a thread while the connection waits; every other
  body's is OTHER_BODY_CAP (the largest the pages and the API take is 2.5 MB);
- hands the body to the application a chunk at a time from twisted's temporary file, as the
  application reads it. Django's own ASGI handler then spools it to disk past
  FILE_UPLOAD_MAX_MEMORY_SIZE, and the upload view reads that file in chunks.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from functools import partial

from daphne import http_protocol
from django.conf import settings
from django.db import connections
from twisted.internet import reactor, threads

from agents import isolation
from agents.models import Run

MIB = 1024 * 1024
OTHER_BODY_CAP = 32 * MIB
UPLOAD = re.compile(rb"/api/v1/runs/(\d{1,18})/workspace(?:\?.*)?")
# After a 413, what still arrives is read and dropped for a little while, so that the client
# can read the answer (closing on unread data resets the connection, and the answer is lost).
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 * MIB


def upload_cap(run_id: int) -> int:
    """The most bytes a workspace upload of this run may send (reads the database: a thread)."""
    try:
        return isolation.upload_cap(Run.objects.filter(pk=run_id).first())
    finally:
        connections.close_all()


def _problem(cap: int) -> bytes:
    body = json.dumps(
        {
            "type": "about:blank",
            "title": "Payload Too Large",
            "status": 413,
            "detail": f"the request body is over its limit of {cap / MIB:g} MB",
        }
    ).encode()
    head = (
        "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class BodyQueue:
    """The application's input queue, which reads the body from twisted's file as the application
    asks for it (daphne's own queue is given every chunk at once)."""

    def __init__(self, content, chunk_size: int) -> None:
        self.content, self.chunk_size = content, chunk_size
        self.others: asyncio.Queue = asyncio.Queue()
        self.body_done = True

    def start_body(self) -> None:
        self.body_done = False

    def put_nowait(self, message: dict) -> None:
        if message.get("type") == "http.request" and not message.get("body"):
            return  # the body's place: get() reads it
        self.others.put_nowait(message)

    async def get(self) -> dict:
        if self.body_done:
            return await self.others.get()
        chunk = b"" if self.content.closed else self.content.read(self.chunk_size)
        self.body_done = len(chunk) < self.chunk_size
        return {"type": "http.request", "body": chunk, "more_body": not self.body_done}


class _Server:
    """daphne's server, as one request sees it: its application gets a BodyQueue."""

    def __init__(self, server, request: LimitedRequest) -> None:
        self._server, self._request = server, request

    def __getattr__(self, name: str):
        return getattr(self._server, name)

    def create_application(self, protocol, scope):
        # As daphne's Server.create_application, with our queue.
        server = self._server
        queue = BodyQueue(self._request.body_file, server.request_buffer_size)
        scope.setdefault("asgi", {"version": "3.0"})
        instance = server.application(
            scope=scope, receive=queue.get, send=partial(server.handle_reply, protocol)
        )
        if protocol not in server.connections:
            return None
        server.connections[protocol]["application_instance"] = asyncio.ensure_future(
            instance, loop=asyncio.get_event_loop()
        )
        queue.start_body()
        return queue


class LimitedRequest(http_protocol.WebRequest):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server = _Server(self.server, self)
        self.body_cap = OTHER_BODY_CAP
        self.body_seen = 0
        self.body_file = None
        self.refused = False
        self.dropped = 0

    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        self.body_file = self.content
        path = getattr(self.channel, "_path", b"") or b""
        upload = UPLOAD.fullmatch(path)
        if upload is not None:
            self.body_cap = settings.SHIFTLOG["API_MAX_UPLOAD_MB"] * MIB
        if not self._within(length):
            return
        if upload is not None:
            transport = self.channel.transport
            transport.pauseProducing()
            # A client that waits for `100 Continue` hears it once the run's cap is known.
            expects = (self.requestHeaders.getRawHeaders(b"expect") or [b""])[0]
            self.requestHeaders.removeHeader(b"expect")
            found = threads.deferToThread(upload_cap, int(upload.group(1)))
            found.addCallback(self._got_cap, length, expects.lower() == b"100-continue")
            found.addBoth(lambda _: None if self.refused else transport.resumeProducing())

    def _got_cap(self, cap: int, length: int | None, expects: bool) -> None:
        self.body_cap = cap
        if self._within(length) and expects:
            self.channel.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _within(self, length: int | None) -> bool:
        if self.refused:
            return False
        if (length is not None and length > self.body_cap) or self.body_seen > self.body_cap:
            self._refuse()
            return False
        return True

    def _refuse(self) -> None:
        self.refused = True
        self.requestHeaders.removeHeader(b"expect")  # no `100 Continue` for a body refused
        transport = self.channel.transport
        transport.write(_problem(self.body_cap))
        transport.resumeProducing()  # read (and drop) what comes, for a little while
        reactor.callLater(LINGER_SECONDS, transport.loseConnection)
        self.content.close()
        self.content = io.BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            self.dropped += len(data)
            if self.dropped > LINGER_BYTES:
                self.channel.transport.loseConnection()
            return
        self.body_seen += len(data)
        if self._within(None):
            super().handleContentChunk(data)

    def process(self):
        if self.refused:
            self.channel.transport.loseConnection()
            return None
        # daphne's process() reads the body into the queue at once: it reads an empty file
        # here, and the BodyQueue reads the real one as the application asks.
        upgrade = (self.requestHeaders.getRawHeaders(b"upgrade") or [b""])[0]
        if upgrade.lower() != b"websocket":
            self.body_file, self.content = self.content, io.BytesIO()
        return super().process()


def install() -> None:
    """daphne builds each request with http_protocol.WebRequest (HTTPFactory.buildProtocol)."""
    http_protocol.WebRequest = LimitedRequest
