"""What the sync and async clients share: settings, headers, retry timing, the SSE bookkeeping."""

from __future__ import annotations

import json
import os
import random
import uuid
from typing import Any

import httpx

from ._errors import RateLimited, ShiftlogError, error_from_response, retry_after_seconds
from ._models import Event
from ._ops import PREFIX
from ._sse import SSEMessage

__version__ = "0.1.0"

# Reading a stream waits at least this long for a line: the server sends a comment every 15 s.
STREAM_READ_TIMEOUT = 60.0

# Retries: a 429 always (the server did nothing); a gateway's 502/503/504 or a connection that
# dropped after the request went out only for reads and for writes sent with an Idempotency-Key
# (the server answers a repeated key with the first answer: never a second run or call); a
# connection that never opened, for any call.
IDEMPOTENCY_HEADER = "Idempotency-Key"
READS = frozenset({"GET", "HEAD", "OPTIONS"})
GATEWAY_ERRORS = frozenset({502, 503, 504})
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def normalise_base_url(base_url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/api/v1` name the same API."""
    url = base_url.rstrip("/")
    if url.endswith(PREFIX):
        url = url[: -len(PREFIX)]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
    return url


def from_env(base_url: str | None, token: str | None) -> tuple[str, str]:
    base_url = base_url or os.environ.get("SHIFTLOG_URL")
    token = token or os.environ.get("SHIFTLOG_TOKEN")
    if not base_url or not token:
        raise ValueError("give base_url and token, or set SHIFTLOG_URL and SHIFTLOG_TOKEN")
    return base_url, token


class Settings:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float,
        max_retries: int,
        max_retry_wait: float,
        reconnect_delay: float,
        max_reconnects: int,
        agent: str | None = None,
    ) -> None:
        if not token:
            raise ValueError("a token is required (manage.py create_token prints one)")
        self.base_url = normalise_base_url(base_url)
        self.token = token
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.max_retry_wait = float(max_retry_wait)
        self.reconnect_delay = float(reconnect_delay)
        self.max_reconnects = int(max_reconnects)
        # The agent's stable id in the run's log (one agent drives an external run at a time).
        self.agent = agent

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            "User-Agent": f"shiftlog-client/{__version__}",
        } | ({"Shiftlog-Agent": self.agent} if self.agent else {})

    def call_headers(self, method: str, headers: dict[str, str] | None) -> dict[str, str]:
        """A call's headers: a POST gets an Idempotency-Key of its own, the same on each retry."""
        out = dict(headers or {})
        if method.upper() == "POST":
            out.setdefault(IDEMPOTENCY_HEADER, uuid.uuid4().hex)
        return out

    def backoff(self, attempt: int) -> float:
        """0.5 s, 1 s, 2 s, ... with up to half again of jitter, at most `max_retry_wait`."""
        return min(self.max_retry_wait, 0.5 * 2.0**attempt * (1 + random.random() / 2))

    def retry_delay(
        self, response: httpx.Response, attempt: int, method: str = "GET", keyed: bool = False
    ) -> float | None:
        """Seconds to wait before sending the call again after this answer, or None to give up:
        a 429 (its Retry-After); a 502/503/504 of a read or a keyed write; a 409 with Retry-After
        of a keyed write (the first request with the key is still being answered)."""
        if attempt >= self.max_retries:
            return None
        status = response.status_code
        if status == 429:
            return min(self.max_retry_wait, retry_after_seconds(response, default=2.0**attempt))
        repeatable = method.upper() in READS or keyed
        if (status in GATEWAY_ERRORS and repeatable) or (
            status == 409 and keyed and "retry-after" in response.headers
        ):
            return min(self.max_retry_wait, retry_after_seconds(response, self.backoff(attempt)))
        return None

    def error_retry_delay(
        self, error: httpx.TransportError, attempt: int, method: str, keyed: bool
    ) -> float | None:
        """Seconds to wait before sending the call again after a connection error, or None."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, NOT_SENT) or method.upper() in READS or keyed:
            return self.backoff(attempt)
        return None

    def timeout_for(self, read_timeout: float | None) -> httpx.Timeout:
        if read_timeout is None:
            return httpx.Timeout(self.timeout)
        return httpx.Timeout(self.timeout, read=max(self.timeout, read_timeout))

    def stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=max(self.timeout, STREAM_READ_TIMEOUT))


def check(response: httpx.Response) -> None:
    """Raise the ShiftlogError for an error answer (the body must have been read)."""
    if response.status_code >= 400:
        raise error_from_response(response)


def stream_request(after: int | None, last_id: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Params and headers of one connection of the event stream: `?after=` the first time, the
    last seen id as `Last-Event-ID` on a reconnect."""
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
        return {}, headers
    return ({"after": after} if after is not None else {}), headers


def event_of(message: SSEMessage) -> Event | None:
    """The Event a stream message carries; None for `end` and for messages that carry none."""
    if message.event == "end" or not message.data:
        return None
    try:
        data = json.loads(message.data)
    except ValueError:
        return None
    if not isinstance(data, dict) or "seq" not in data:
        return None
    return Event.from_json(data)


class StreamDropped(ShiftlogError):
    """The event stream dropped more times in a row than `max_reconnects` allows."""


# Errors of the connection itself (not of the API): a stream reconnects after these.
TRANSPORT_ERRORS = (httpx.TransportError,)

__all__ = ["RateLimited", "StreamDropped"]
