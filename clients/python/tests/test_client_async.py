"""The async client: the same protocol, awaitable."""

from __future__ import annotations

import asyncio
import io

import httpx
import pytest
from client_helpers import event_json, make_async, problem, run_json
from shiftlog_client import AsyncClient, Conflict, ForkPreview, RateLimited

pytestmark = pytest.mark.no_services


def ok(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_auth_errors_and_retries():
    async def main():
        limited = problem(429, "Too Many Requests", headers={"Retry-After": "4"})
        client, rec = make_async(limited, ok(run_json()), problem(409, "Conflict", "running"))
        async with client:
            run = await client.get_run(3)
            with pytest.raises(Conflict):
                await client.resume_run(3)
        return run, rec, client.sleeps

    run, rec, sleeps = asyncio.run(main())
    assert run.id == 3
    assert sleeps == [4.0]
    assert rec.requests[0].headers["authorization"] == "Bearer shl_test"


def test_rate_limited_after_max_retries():
    async def main():
        limited = problem(429, "Too Many Requests", headers={"Retry-After": "1"})
        client, rec = make_async(limited, max_retries=1)
        async with client:
            with pytest.raises(RateLimited):
                await client.list_runs()
        return rec

    assert len(asyncio.run(main()).requests) == 2


def test_paging_runs_and_events():
    pages = {
        None: {"items": [run_json(2)], "next_cursor": "x"},
        "x": {"items": [run_json(1)], "next_cursor": None},
    }
    events = [event_json(s) for s in range(1, 6)]

    def handler(request):
        if request.url.path.endswith("/events"):
            after = int(request.url.params.get("after", 0))
            limit = int(request.url.params["limit"])
            return ok({"items": [e for e in events if e["seq"] > after][:limit], "last_seq": 5})
        return ok(pages[request.url.params.get("cursor")])

    async def main():
        client, _ = make_async(handler)
        async with client:
            runs = [r.id async for r in client.iter_runs(page_size=1)]
            seqs = [e.seq async for e in client.iter_events(3, page_size=2)]
        return runs, seqs

    assert asyncio.run(main()) == ([2, 1], [1, 2, 3, 4, 5])


def test_everything_else_once(tmp_path):
    (tmp_path / "done.txt").write_text("yes\n")
    answers = [
        ok(run_json(status="queued"), 201),
        ok({"checkpoint": 1, "dry_run": True, "would_copy": {}}),
        ok({"items": []}),
        ok({"items": []}),
        httpx.Response(200, content=b"tarball"),
        ok({"checkpoint": 2, "files": 1, "bytes_total": 4}, 201),
        ok({"session": 1, "first_message": "go", "run_status": "running"}),
    ]

    async def main():
        client, rec = make_async(*answers)
        async with client:
            created = await client.create_run("g", checks=["true"], provider="external")
            preview = await client.fork_run(3, 1, dry_run=True)
            approvals = await client.list_approvals()
            checkpoints = await client.list_checkpoints(3)
            sink = io.BytesIO()
            size = await client.export_checkpoint(3, 1, sink)
            upload = await client.upload_workspace(3, tmp_path)
            context = await client.run_context(3)
        return created, preview, approvals, checkpoints, sink, size, upload, context, rec

    created, preview, approvals, checkpoints, sink, size, upload, context, rec = asyncio.run(main())
    assert created.status == "queued"
    assert isinstance(preview, ForkPreview)
    assert approvals == [] and checkpoints == []
    assert (size, sink.getvalue()) == (7, b"tarball")
    assert upload.checkpoint == 2
    assert rec.requests[5].headers["content-type"] == "application/gzip"
    assert context.first_message == "go"


def test_async_context_manager_closes():
    async def main():
        async with AsyncClient("http://x.test", "t") as client:
            pass
        return client._http.is_closed

    assert asyncio.run(main())
