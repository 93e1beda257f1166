"""The synchronous client."""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Iterable, Iterator
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
Dest = str | os.PathLike[str] | IO[bytes]


class Client:
    """Shiftlog's API, synchronously. `Client("http://127.0.0.1:8000", "shl_…")`.

    Retried up to `max_retries` times (waiting a Retry-After, else 0.5 s, 1 s, 2 s... with jitter,
    at most `max_retry_wait` seconds): a 429; a connection that never opened; and for reads and
    POSTs, a dropped connection and a 502/503/504. Every POST carries an `Idempotency-Key` of its
    own, the same on its retries, so the server answers a repeat with the first answer (never a
    second run or call). Every other error answer raises a `ShiftlogError` subclass.
    Use it as a context manager, or call `close()`.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
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
        self._http = httpx.Client(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=self._settings.timeout,
            transport=transport,
        )
        self._sleep: Callable[[float], None] = time.sleep

    @classmethod
    def from_env(cls, base_url: str | None = None, token: str | None = None, **kw: Any) -> Client:
        """A client for `SHIFTLOG_URL` with `SHIFTLOG_TOKEN` (either may be given instead)."""
        return cls(*from_env(base_url, token), **kw)

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sending -------------------------------------------------------------------------------

    def _send(self, call: ops.Call[T]) -> T:
        attempt = 0
        headers = self._settings.call_headers(call.method, call.headers)
        keyed = IDEMPOTENCY_HEADER in headers
        while True:
            content = call.content
            opened: IO[bytes] | None = None
            if callable(content):
                opened = content()
                content = ops.file_chunks(opened)  # type: ignore[assignment]
            try:
                response = self._http.request(
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
                self._sleep(delay)
                continue
            finally:
                if opened is not None:
                    opened.seek(0)
            delay = self._settings.retry_delay(response, attempt, call.method, keyed)
            if delay is not None:
                attempt += 1
                self._sleep(delay)
                continue
            check(response)
            return call.parse(response)

    @contextlib.contextmanager
    def _stream(
        self,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Iterator[httpx.Response]:
        attempt = 0
        while True:
            with self._http.stream(
                "GET", path, params=params, headers=headers, timeout=self._settings.stream_timeout()
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    delay = self._settings.retry_delay(response, attempt)
                    if delay is not None:
                        attempt += 1
                        self._sleep(delay)
                        continue
                    check(response)
                yield response
                return

    # -- runs ----------------------------------------------------------------------------------

    def list_runs(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        q: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Run]:
        """One page of runs, newest first; pass `next_cursor` back as `cursor`."""
        return self._send(ops.list_runs(status, provider, q, limit, cursor))

    def iter_runs(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        q: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Run]:
        """Every run matching the filters, newest first, following `next_cursor` page by page."""
        cursor: str | None = None
        while True:
            page = self.list_runs(
                status=status, provider=provider, q=q, limit=page_size, cursor=cursor
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def create_run(self, goal: str, **spec: Unpack[ops.RunSpec]) -> Run:
        """Create a run (`provider="external"` for one you drive yourself)."""
        return self._send(ops.create_run(goal, spec))

    def get_run(self, run_id: int) -> Run:
        return self._send(ops.get_run(run_id))

    def pause_run(self, run_id: int, reason: str = "") -> Run:
        return self._send(ops.run_action(run_id, "pause", {"reason": reason}))

    def resume_run(
        self,
        run_id: int,
        *,
        max_tokens: int | None = None,
        max_cost_usd: float | str | None = None,
        max_wall_seconds: int | None = None,
        max_sessions: int | None = None,
    ) -> Run:
        """Resume a paused run, raising any budget given."""
        body = {
            "max_tokens": max_tokens,
            "max_cost_usd": max_cost_usd,
            "max_wall_seconds": max_wall_seconds,
            "max_sessions": max_sessions,
        }
        body = {k: v for k, v in body.items() if v is not None}
        return self._send(ops.run_action(run_id, "resume", body))

    def cancel_run(self, run_id: int, reason: str = "") -> Run:
        return self._send(ops.run_action(run_id, "cancel", {"reason": reason}))

    def set_run_slack(
        self,
        run_id: int,
        *,
        channel: str | None = None,
        news: list[str] | str | None = None,
    ) -> Run:
        """The run's own Slack settings: `channel` (a channel id or #name; "" for its
        project's), `news` (some of "ended", "paused", "budget"; [] for none; "project" for its
        project's). None leaves a setting as it is."""
        return self._send(ops.set_run_slack(run_id, channel, news))

    def note_run(self, run_id: int, text: str) -> int:
        """A note the agent reads at its next turn; returns the note event's seq."""
        return self._send(ops.note_run(run_id, text))

    def rewind_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: bool = False
    ) -> RewindResult:
        """Rewind to checkpoint N (queued: `queued` is True), or with `dry_run` only say what
        would be discarded."""
        return self._send(ops.rewind_run(run_id, checkpoint, note, dry_run))

    @overload
    def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: Literal[False] = False
    ) -> Run: ...
    @overload
    def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: Literal[True]
    ) -> ForkPreview: ...
    def fork_run(
        self, run_id: int, checkpoint: int, *, note: str = "", dry_run: bool = False
    ) -> Run | ForkPreview:
        """A new run from checkpoint N (or with `dry_run`, what it would copy)."""
        return self._send(ops.fork_run(run_id, checkpoint, note, dry_run))

    # -- events --------------------------------------------------------------------------------

    def list_events(
        self, run_id: int, *, after: int | None = None, limit: int | None = None
    ) -> EventPage:
        """One page of the run's events in seq order, after seq `after`."""
        return self._send(ops.list_events(run_id, after, limit))

    def iter_events(self, run_id: int, after: int = 0, *, page_size: int = 200) -> Iterator[Event]:
        """Every event after seq `after` there is now, page by page."""
        while True:
            page = self.list_events(run_id, after=after, limit=page_size)
            if not page.items:
                return
            yield from page.items
            after = page.items[-1].seq
            if after >= page.last_seq:
                return

    def stream_events(self, run_id: int, after: int | None = None) -> Iterator[Event]:
        """The run's events as they happen (Server-Sent Events), from after seq `after`.

        A dropped connection is opened again with `Last-Event-ID` (no gap, no duplicate), up to
        `max_reconnects` times in a row without an event; it ends when the server sends
        `event: end` (the run is over and every event was sent).
        """
        path = ops.stream_path(run_id)
        last_id: str | None = None
        failures = 0
        delay = self._settings.reconnect_delay
        while True:
            params, headers = stream_request(after, last_id)
            parser = SSEParser()
            try:
                with self._stream(path, params=params, headers=headers) as response:
                    for line in response.iter_lines():
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
            self._sleep(delay)

    # -- approvals -----------------------------------------------------------------------------

    def list_approvals(
        self, *, status: str | None = "pending", run: int | None = None, limit: int | None = None
    ) -> list[Approval]:
        return self._send(ops.list_approvals(status, run, limit))

    def get_approval(self, approval_id: int) -> Approval:
        return self._send(ops.get_approval(approval_id))

    def decide(
        self,
        approval_id: int,
        decision: ops.Decision,
        *,
        reason: str = "",
        input: Any = None,
        allow_similar: bool = False,
    ) -> Approval:
        """Approve, deny (with a reason) or edit (with the whole edited input). Scope `decide`."""
        return self._send(ops.decide(approval_id, decision, reason, input, allow_similar))

    # -- checkpoints, diffs, exports -----------------------------------------------------------

    def list_checkpoints(self, run_id: int) -> list[Checkpoint]:
        return self._send(ops.list_checkpoints(run_id))

    def create_checkpoint(self, run_id: int, label: str = "") -> Checkpoint:
        return self._send(ops.create_checkpoint(run_id, label))

    def diff(self, run_id: int, a: int, b: int | Literal["live"]) -> Diff:
        """What changed from checkpoint `a` to checkpoint `b` (or `"live"`)."""
        return self._send(ops.diff(run_id, a, b))

    def diff_patch(self, run_id: int, a: int, b: int | Literal["live"]) -> str:
        """The same as a patch for `git apply`."""
        return self._send(ops.diff_patch(run_id, a, b))

    def export_checkpoint(self, run_id: int, number: int, dest: Dest) -> int:
        """Stream the workspace at checkpoint N (.tar.gz) to a path (written whole or not at
        all) or a binary file; returns the bytes written."""
        with self._stream(ops.export_path(run_id, number), headers={"Accept": "*/*"}) as response:
            if isinstance(dest, str | os.PathLike):
                target = Path(dest)
                part = target.with_name(f".{target.name}.part-{os.getpid()}")
                try:
                    with part.open("wb") as out:
                        written = _copy(response.iter_bytes(), out)
                    part.replace(target)
                except BaseException:
                    part.unlink(missing_ok=True)
                    raise
                return written
            return _copy(response.iter_bytes(), dest)

    # -- artifacts -----------------------------------------------------------------------------

    def list_artifacts(self, run_id: int) -> list[Artifact]:
        return self._send(ops.list_artifacts(run_id))

    def get_artifact(self, artifact_id: int) -> Artifact:
        return self._send(ops.get_artifact(artifact_id))

    def artifact_content(self, artifact_id: int) -> bytes:
        return self._send(ops.artifact_content(artifact_id))

    # -- memory --------------------------------------------------------------------------------

    def read_memory(self, run_id: int) -> list[MemoryEntry]:
        """The run's memory and its project's, most useful first."""
        return self._send(ops.read_memory(run_id))

    def remember(
        self,
        run_id: int,
        key: str,
        text: str,
        *,
        pinned: bool | None = None,
        scope: Literal["run", "project"] = "run",
    ) -> list[MemoryEntry]:
        """Add or change an entry (`scope="project"`: every later run of the project has it)."""
        return self._send(ops.remember(run_id, key, text, pinned, scope))

    def forget(
        self, run_id: int, key: str, *, scope: Literal["run", "project"] = "run"
    ) -> list[MemoryEntry]:
        return self._send(ops.forget(run_id, key, scope))

    # -- external agents (ExternalRun wraps these) ---------------------------------------------

    def run_context(self, run_id: int) -> Context:
        return self._send(ops.run_context(run_id))

    def heartbeat(self, run_id: int) -> str:
        return self._send(ops.heartbeat(run_id))

    def record_turn(
        self,
        run_id: int,
        text: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> TurnResult:
        return self._send(
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

    def request_tool_call(
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
        return self._send(ops.request_tool_call(run_id, tool, input, call_id, root))

    def withdraw_tool_call(self, call_id: str) -> ToolDecision:
        """Take a call back before it runs (its approval leaves the inbox, withdrawn)."""
        return self._send(ops.withdraw_tool_call(call_id))

    def get_tool_call(self, call_id: str, *, wait: float | None = None) -> ToolDecision:
        """A tool call's decision; with `wait` (≤ 60 s) the server holds the answer until a
        person decides or the time is up."""
        return self._send(ops.get_tool_call(call_id, wait, self._settings.timeout))

    def report_tool_result(self, call_id: str, output: Any, is_error: bool = False) -> ResultAck:
        return self._send(ops.report_tool_result(call_id, output, is_error))

    def upload_workspace(self, run_id: int, folder: str | os.PathLike[str]) -> WorkspaceUpload:
        """Tar and gzip `folder` and make it the run's workspace (a checkpoint)."""
        archive, size = build_archive(folder)
        with archive:
            return self._send(ops.upload_workspace(run_id, lambda: archive, size))

    def upload_archive(self, run_id: int, archive: bytes | IO[bytes]) -> WorkspaceUpload:
        """Upload a ready .tar.gz (bytes, or a seekable binary file)."""
        stream = _seekable(archive)
        size = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        return self._send(ops.upload_workspace(run_id, lambda: stream, size))

    def handoff(
        self,
        run_id: int,
        summary: str,
        *,
        done: Iterable[str] = (),
        next_steps: Iterable[str] = (),
        open_questions: Iterable[str] = (),
    ) -> Context:
        return self._send(ops.handoff(run_id, summary, done, next_steps, open_questions))

    def finish(self, run_id: int, summary: str) -> FinishResult:
        """The agent says it is done; waits for the harness's checks and returns the verdict."""
        answer = self._send(ops.finish(run_id, summary))
        while answer.get("state") == "checking":
            answer = self._send(ops.finish_verdict(run_id, answer["id"], self._settings.timeout))
        return FinishResult.from_json(answer)


def _copy(chunks: Iterable[bytes], out: IO[bytes]) -> int:
    written = 0
    for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
    return written


def _seekable(archive: bytes | IO[bytes]) -> IO[bytes]:
    return io.BytesIO(archive) if isinstance(archive, bytes | bytearray) else archive
