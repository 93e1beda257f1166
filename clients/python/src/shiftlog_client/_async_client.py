"""The asynchronous client: the same methods as `Client`, awaitable."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, Unpack, overload

import httpx

from . import _ops as ops
from ._archive import build_archive
from ._base import (
    IDEMPOTENCY_HEADER,
    TRANSPORT_ERRORS,
    Settings,
    StreamDropped,
    check,
    event_of,
    from_env,
    stream_request,
)
from ._client import Dest, _seekable
from ._models import (
    Approval,
    Artifact,
    Checkpoint,
    Context,
    Diff,
    Event,
    EventPage,
    FinishResult,
    ForkPreview,
    MemoryEntry,
    Page,
    ResultAck,
    RewindResult,
    Run,
    ToolDecision,
    TurnResult,
    WorkspaceUpload,
)
from ._sse import SSEParser

T = TypeVar("T")


async def _achunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    for chunk in ops.file_chunks(stream):
        yield chunk


class AsyncClient:
    """Shiftlog's API for asyncio: `async with AsyncClient(url, token) as shiftlog: …`.
    The same methods, settings and errors as `Client`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 3,
        max_retry_wait: float = 60.0,
        reconnect_delay: float = 1.0,
        max_reconnects: int = 5,
        agent: str | None = None,
    ) -> None:
        self._settings = Settings(
            base_url,
            token,
            timeout=timeout,
            max_retries=max_retries,
            max_retry_wait=max_retry_wait,
            reconnect_delay=reconnect_delay,
            max_reconnects=max_reconnects,
            agent=agent,
        )
        self._http = httpx.AsyncClient(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=self._settings.timeout,
            transport=transport,
        )
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    @classmethod
    def from_env(
        cls, base_url: str | None = None, token: str | None = None, **kw: Any
    ) -> AsyncClient:
        return cls(*from_env(base_url, token), **kw)

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- sending -------------------------------------------------------------------------------

    async def _send(self, call: ops.Call[T]) -> T:
        attempt = 0
        headers = self._settings.call_headers(call.method, call.headers)
        keyed = IDEMPOTENCY_HEADER in headers
        while True:
            content: Any = call.content
            opened: IO[bytes] | None = None
            if callable(content):
                opened = content()
                content = _achunks(opened)
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    content=content,
                    headers=headers,
                    timeout=self._settings.timeout_for(call.read_timeout),
                )
            except httpx.TransportError as error:
                delay = self._settings.error_retry_delay(error, attempt, call.method, keyed)
                if delay is None:
                    raise
                attempt += 1
                await self._sleep(delay)
                continue
            finally:
                if opened is not None:
                    opened.seek(0)
            delay = self._settings.retry_delay(response, attempt, call.method, keyed)
            if delay is not None:
                attempt += 1
                await self._sleep(delay)
                continue
            check(response)
            return call.parse(response)

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[httpx.Response]:
        attempt = 0
        while True:
            async with self._http.stream(
                "GET", path, params=params, headers=headers, timeout=self._settings.stream_timeout()
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    delay = self._settings.retry_delay(response, attempt)
                    if delay is not None:
                        attempt += 1
                        await self._sleep(delay)
                        continue
                    check(response)
                yield response
                return

    # -- runs ----------------------------------------------------------------------------------

    async def list_runs(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        q: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Run]:
        return await self._send(ops.list_runs(status, provider, q, limit, cursor))

    async def iter_runs(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        q: str | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Run]:
        cursor: str | None = None
        while True:
            page = await self.list_runs(
                status=status, provider=provider, q=q, limit=page_size, cursor=cursor
            )
            for run in page.items:
                yield run
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def create_run(self, goal: str, **spec: Unpack[ops.RunSpec]) -> Run:
        return await self._send(ops.create_run(goal, spec))

    async def get_run(self, run_id: int) -> Run:
        return await self._send(ops.get_run(run_id))

    async def pause_run(self, run_id: int, reason: str = "") -> Run:
        return await self._send(ops.run_action(run_id, "pause", {"reason": reason}))

    async def resume_run(
        self,
        run_id: int,
        *,
        max_tokens: int | None = None,
        max_cost_usd: float | str | None = None,
        max_wall_seconds: int | None = None,
        max_sessions: int | None = None,
    ) -> Run:
        body = {
            "max_tokens": max_tokens,
            "max_cost_usd": max_cost_usd,
            "max_wall_seconds": max_wall_seconds,
            "max_sessions": max_sessions,
        }
        body = {k: v for k, v in body.items() if v is not None}
        return await self._send(ops.run_action(run_id, "resume", body))

    async def cancel_run(self, run_id: int, reason: str = "") -> Run:
        return await self._send(ops.run_action(run_id, "cancel", {"reason": reason}))

    async def set_run_slack(
        self,
        run_id: int,
        *,
        channel: str | None = None,
        news: list[str] | str | None = None,
    ) -> Run:
        return await self._send(ops.set_run_slack(run_id, channel, news))

    async def note_run(self, run_id: int, text: str) -> int:
        return await self._send(ops.note_run(run_id, text))

    async def rewind_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: bool = False
    ) -> RewindResult:
        return await self._send(ops.rewind_run(run_id, checkpoint, note, dry_run))

    @overload
    async def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: Literal[False] = False
    ) -> Run: ...
    @overload
    async def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: Literal[True]
    ) -> ForkPreview: ...
    async def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: bool = False
    ) -> Run | ForkPreview:
        return await self._send(ops.fork_run(run_id, checkpoint, note, dry_run))

    # -- events --------------------------------------------------------------------------------

    async def list_events(
        self, run_id: int, *, after: int | None = None, limit: int | None = None
    ) -> EventPage:
        return await self._send(ops.list_events(run_id, after, limit))

    async def iter_events(
        self, run_id: int, after: int = 0, *, page_size: int = 200
    ) -> AsyncIterator[Event]:
        while True:
            page = await self.list_events(run_id, after=after, limit=page_size)
            if not page.items:
                return
            for event in page.items:
                yield event
            after = page.items[-1].seq
            if after >= page.last_seq:
                return

    async def stream_events(self, run_id: int, after: int | None = None) -> AsyncIterator[Event]:
        """As `Client.stream_events`: reconnects with `Last-Event-ID`, ends on `event: end`."""
        path = ops.stream_path(run_id)
        last_id: str | None = None
        failures = 0
        delay = self._settings.reconnect_delay
        while True:
            params, headers = stream_request(after, last_id)
            parser = SSEParser()
            try:
                async with self._stream(path, params=params, headers=headers) as response:
                    async for line in response.aiter_lines():
                        message = parser.feed(line)
                        if parser.retry is not None:
                            delay = parser.retry / 1000
                        if message is None:
                            continue
                        if message.event == "end":
                            return
                        if message.id is not None:
                            last_id = message.id
                        event = event_of(message)
                        if event is not None:
                            failures = 0
                            yield event
            except TRANSPORT_ERRORS:
                pass
            failures += 1
            if failures > self._settings.max_reconnects:
                raise StreamDropped(0, "Stream dropped", f"gave up after {failures - 1} reconnects")
            await self._sleep(delay)

    # -- approvals -----------------------------------------------------------------------------

    async def list_approvals(
        self, *, status: str | None = "pending", run: int | None = None, limit: int | None = None
    ) -> list[Approval]:
        return await self._send(ops.list_approvals(status, run, limit))

    async def get_approval(self, approval_id: int) -> Approval:
        return await self._send(ops.get_approval(approval_id))

    async def decide(
        self,
        approval_id: int,
        decision: ops.Decision,
        *,
        reason: str = "",
        input: Any = None,
        allow_similar: bool = False,
    ) -> Approval:
        return await self._send(ops.decide(approval_id, decision, reason, input, allow_similar))

    # -- checkpoints, diffs, exports -----------------------------------------------------------

    async def list_checkpoints(self, run_id: int) -> list[Checkpoint]:
        return await self._send(ops.list_checkpoints(run_id))

    async def create_checkpoint(self, run_id: int, label: str = "") -> Checkpoint:
        return await self._send(ops.create_checkpoint(run_id, label))

    async def diff(self, run_id: int, a: int, b: int | Literal["live"]) -> Diff:
        return await self._send(ops.diff(run_id, a, b))

    async def diff_patch(self, run_id: int, a: int, b: int | Literal["live"]) -> str:
        return await self._send(ops.diff_patch(run_id, a, b))

    async def export_checkpoint(self, run_id: int, number: int, dest: Dest) -> int:
        path = ops.export_path(run_id, number)
        async with self._stream(path, headers={"Accept": "*/*"}) as response:
            if isinstance(dest, str | os.PathLike):
                target = Path(dest)
                part = target.with_name(f".{target.name}.part-{os.getpid()}")
                try:
                    with part.open("wb") as out:
                        written = await _acopy(response.aiter_bytes(), out)
                    part.replace(target)
                except BaseException:
                    part.unlink(missing_ok=True)
                    raise
                return written
            return await _acopy(response.aiter_bytes(), dest)

    # -- artifacts -----------------------------------------------------------------------------

    async def list_artifacts(self, run_id: int) -> list[Artifact]:
        return await self._send(ops.list_artifacts(run_id))

    async def get_artifact(self, artifact_id: int) -> Artifact:
        return await self._send(ops.get_artifact(artifact_id))

    async def artifact_content(self, artifact_id: int) -> bytes:
        return await self._send(ops.artifact_content(artifact_id))

    # -- memory --------------------------------------------------------------------------------

    async def read_memory(self, run_id: int) -> list[MemoryEntry]:
        """The run's memory and its project's, most useful first."""
        return await self._send(ops.read_memory(run_id))

    async def remember(
        self,
        run_id: int,
        key: str,
        text: str,
        *,
        pinned: bool | None = None,
        scope: Literal["run", "project"] = "run",
    ) -> list[MemoryEntry]:
        """Add or change an entry (`scope="project"`: every later run of the project has it)."""
        return await self._send(ops.remember(run_id, key, text, pinned, scope))

    async def forget(
        self, run_id: int, key: str, *, scope: Literal["run", "project"] = "run"
    ) -> list[MemoryEntry]:
        return await self._send(ops.forget(run_id, key, scope))

    # -- external agents -----------------------------------------------------------------------

    async def run_context(self, run_id: int) -> Context:
        return await self._send(ops.run_context(run_id))

    async def heartbeat(self, run_id: int) -> str:
        return await self._send(ops.heartbeat(run_id))

    async def record_turn(
        self,
        run_id: int,
        text: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> TurnResult:
        return await self._send(
            ops.record_turn(
                run_id,
                text,
                model,
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_write_tokens,
            )
        )

    async def request_tool_call(
        self,
        run_id: int,
        tool: str,
        input: Any,
        *,
        call_id: str | None = None,
        root: str | None = None,
    ) -> ToolDecision:
        """Ask before running a tool. `call_id`: the agent's own id of the call (asked again,
        the same answer); `root`: its folder, for absolute paths under it."""
        return await self._send(ops.request_tool_call(run_id, tool, input, call_id, root))

    async def withdraw_tool_call(self, call_id: str) -> ToolDecision:
        """Take a call back before it runs (its approval leaves the inbox, withdrawn)."""
        return await self._send(ops.withdraw_tool_call(call_id))

    async def get_tool_call(self, call_id: str, *, wait: float | None = None) -> ToolDecision:
        return await self._send(ops.get_tool_call(call_id, wait, self._settings.timeout))

    async def report_tool_result(
        self, call_id: str, output: Any, is_error: bool = False
    ) -> ResultAck:
        return await self._send(ops.report_tool_result(call_id, output, is_error))

    async def upload_workspace(
        self, run_id: int, folder: str | os.PathLike[str]
    ) -> WorkspaceUpload:
        archive, size = await asyncio.to_thread(build_archive, folder)
        with archive:
            return await self._send(ops.upload_workspace(run_id, lambda: archive, size))

    async def upload_archive(self, run_id: int, archive: bytes | IO[bytes]) -> WorkspaceUpload:
        stream = _seekable(archive)
        size = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        return await self._send(ops.upload_workspace(run_id, lambda: stream, size))

    async def handoff(
        self,
        run_id: int,
        summary: str,
        *,
        done: Iterable[str] = (),
        next_steps: Iterable[str] = (),
        open_questions: Iterable[str] = (),
    ) -> Context:
        return await self._send(ops.handoff(run_id, summary, done, next_steps, open_questions))

    async def finish(self, run_id: int, summary: str) -> FinishResult:
        """The agent says it is done; waits for the harness's checks and returns the verdict."""
        answer = await self._send(ops.finish(run_id, summary))
        while answer.get("state") == "checking":
            answer = await self._send(
                ops.finish_verdict(run_id, answer["id"], self._settings.timeout)
            )
        return FinishResult.from_json(answer)


async def _acopy(chunks: AsyncIterator[bytes], out: IO[bytes]) -> int:
    written = 0
    async for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
    return written
