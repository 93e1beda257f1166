"""Helpers for the client's tests: a scripted `httpx.MockTransport` that records requests."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from shiftlog_client import AsyncClient, Client

BASE = "http://shiftlog.test"
Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """Answers requests from a list of handlers (or one handler for all) and keeps them."""

    def __init__(self, *answers: Handler | httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return answer(request) if callable(answer) else answer

    def json(self, index: int = -1) -> Any:
        return json.loads(self.bodies[index])


def problem(status: int, title: str, detail: str = "", **extra: Any) -> httpx.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"content-type": "application/problem+json", **extra.pop("headers", {})},
    )


def run_json(run_id: int = 3, status: str = "running", **extra: Any) -> dict[str, Any]:
    return {
        "id": run_id,
        "goal": "make done.txt",
        "status": status,
        "status_reason": "",
        "provider": "external",
        "external": True,
        "stalled": False,
        "last_contact_at": "2026-12-04T17:00:00Z",
        "heartbeat_seconds": 300,
        "model": "claude-x",
        "checks": ["test -f done.txt"],
        "created_at": "2026-12-04T16:00:00Z",
        "started_at": None,
        "finished_at": None,
        "turns": 4,
        "tokens": {"input": 10, "output": 5, "cache_read": 0, "cache_write": 0, "total": 15},
        "cost_usd": "0.001200",
        "budgets": {"max_sessions": 10, "max_tokens": None},
        "sessions": 1,
        "last_seq": 12,
        "pending_approvals": 0,
        "url": "/runs/3/",
        **extra,
    }


def event_json(seq: int, kind: str = "tool.call") -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "actor": "agent",
        "session": 1,
        "created_at": "2026-12-04T17:00:00Z",
        "payload": {"n": seq},
        "summary": f"event {seq}",
    }


@pytest.fixture
def make_client() -> Iterator[Callable[..., tuple[Client, Recorder]]]:
    clients: list[Client] = []
    sleeps: list[float] = []

    def make(*answers: Handler | httpx.Response, **kw: Any) -> tuple[Client, Recorder]:
        recorder = Recorder(*answers)
        client = Client(BASE, "shl_test", transport=httpx.MockTransport(recorder), **kw)
        client._sleep = sleeps.append  # type: ignore[assignment]
        client.sleeps = sleeps  # type: ignore[attr-defined]
        clients.append(client)
        return client, recorder

    yield make
    for client in clients:
        client.close()


def make_async(*answers: Handler | httpx.Response, **kw: Any) -> tuple[AsyncClient, Recorder]:
    recorder = Recorder(*answers)
    client = AsyncClient(BASE, "shl_test", transport=httpx.MockTransport(recorder), **kw)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client._sleep = sleep  # type: ignore[assignment]
    client.sleeps = sleeps  # type: ignore[attr-defined]
    return client, recorder
