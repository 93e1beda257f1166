"""Each API operation as a `Call`: the request to send and how to read its answer.

The sync and async clients send the same calls, so the protocol lives here once and the two
clients differ only in how they wait.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Generic, Literal, TypedDict, TypeVar
from urllib.parse import quote

import httpx

from ._models import (
    Approval,
    Artifact,
    Checkpoint,
    Context,
    Diff,
    Event,
    EventPage,
    ForkPreview,
    MemoryEntry,
    Page,
    ResultAck,
    RewindResult,
    Run,
    ToolDecision,
    TurnResult,
    WorkspaceUpload,
    memory_from_json,
)

T = TypeVar("T")
PREFIX = "/api/v1"
Decision = Literal["approve", "deny", "edit"]
MAX_WAIT = 60  # the server's cap on ?wait= for a tool call
# handoff and finish answer once the harness has run the run's checks (each may take minutes).
CHECKS_TIMEOUT = 900.0


class RunSpec(TypedDict, total=False):
    """What `POST /runs` takes besides the goal (docs/api.md, Runs)."""

    checks: list[str]
    provider: Literal["scripted", "anthropic", "external"]
    model: str
    script: dict[str, Any]
    rubric: str
    judge_model: str
    max_sessions: int
    max_tokens: int
    max_cost_usd: float | str
    max_wall_seconds: int
    max_turns_per_session: int
    max_input_tokens_per_session: int
    tool_policy: list[dict[str, Any]]
    approval_timeout_seconds: int
    webhook_urls: list[str]
    slack_channel: str  # a channel id (C…) or #name; "" for the project's
    slack_news: list[str] | None  # some of ended, paused, budget; [] for none; None: project's
    protected_paths: list[str]
    protected_action: Literal["deny", "ask"]
    acceptance: list[dict[str, Any]]
    limits: dict[str, int]
    allowed_hosts: list[str]
    heartbeat_seconds: int
    project: str
    fleet_conflicts: Literal["agent", "person"]
    environment: str  # a path on the server: an interpreter or virtualenv (create_run --env)
    requirements: str  # a requirements file on the server (create_run --env-requirements)


@dataclass
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    # A body sent as is, or (for one that streams) a function giving a fresh stream each attempt.
    content: bytes | Callable[[], IO[bytes]] | None = None
    headers: dict[str, str] | None = None
    # Seconds to wait for the answer, when the call itself waits on the server (long polls).
    read_timeout: float | None = None


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _json(response: httpx.Response) -> Any:
    return response.json()


def _items(response: httpx.Response) -> list[dict[str, Any]]:
    data = response.json()
    return list(data.get("items") or []) if isinstance(data, dict) else list(data)


# --- runs ----------------------------------------------------------------------------------


def list_runs(
    status: str | None, provider: str | None, q: str | None, limit: int | None, cursor: str | None
) -> Call[Page[Run]]:
    def parse(response: httpx.Response) -> Page[Run]:
        data = response.json()
        return Page([Run.from_json(r) for r in data.get("items") or []], data.get("next_cursor"))

    params = _params(status=status, provider=provider, q=q, limit=limit, cursor=cursor)
    return Call("GET", f"{PREFIX}/runs", parse, params=params)


def create_run(goal: str, spec: RunSpec) -> Call[Run]:
    body = {"goal": goal, **{k: v for k, v in spec.items() if v is not None}}
    return Call("POST", f"{PREFIX}/runs", lambda r: Run.from_json(r.json()), json=body)


def get_run(run_id: int) -> Call[Run]:
    return Call("GET", f"{PREFIX}/runs/{int(run_id)}", lambda r: Run.from_json(r.json()))


def set_run_slack(run_id: int, channel: str | None, news: list[str] | str | None) -> Call[Run]:
    """POST /runs/{id}/slack: a field left None stays; channel "" and news "project" go back to
    the project's."""
    body: dict[str, Any] = {}
    if channel is not None:
        body["slack_channel"] = channel
    if news is not None:
        body["slack_news"] = None if news == "project" else list(news)
    return run_action(run_id, "slack", body)


def run_action(run_id: int, action: str, body: dict[str, Any]) -> Call[Run]:
    path = f"{PREFIX}/runs/{int(run_id)}/{action}"
    return Call("POST", path, lambda r: Run.from_json(r.json()), json=body)


def note_run(run_id: int, text: str) -> Call[int]:
    path = f"{PREFIX}/runs/{int(run_id)}/note"
    return Call("POST", path, lambda r: int(r.json()["seq"]), json={"text": text})


def rewind_run(run_id: int, checkpoint: int, note: str, dry_run: bool) -> Call[RewindResult]:
    def parse(response: httpx.Response) -> RewindResult:
        return RewindResult.from_json(response.json(), queued=response.status_code == 202)

    body = {"checkpoint": checkpoint, "note": note, "dry_run": dry_run}
    return Call("POST", f"{PREFIX}/runs/{int(run_id)}/rewind", parse, json=body)


def fork_run(run_id: int, checkpoint: int, note: str, dry_run: bool) -> Call[Run | ForkPreview]:
    def parse(response: httpx.Response) -> Run | ForkPreview:
        data = response.json()
        return ForkPreview.from_json(data) if data.get("dry_run") else Run.from_json(data)

    body = {"checkpoint": checkpoint, "note": note, "dry_run": dry_run}
    return Call("POST", f"{PREFIX}/runs/{int(run_id)}/fork", parse, json=body)


# --- events --------------------------------------------------------------------------------


def list_events(run_id: int, after: int | None, limit: int | None) -> Call[EventPage]:
    def parse(response: httpx.Response) -> EventPage:
        data = response.json()
        items = [Event.from_json(e) for e in data.get("items") or []]
        last = data.get("last_seq")
        return EventPage(items, int(last) if last is not None else (items[-1].seq if items else 0))

    params = _params(after=after, limit=limit)
    return Call("GET", f"{PREFIX}/runs/{int(run_id)}/events", parse, params=params)


def stream_path(run_id: int) -> str:
    return f"{PREFIX}/runs/{int(run_id)}/events/stream"


# --- approvals -----------------------------------------------------------------------------


def list_approvals(status: str | None, run: int | None, limit: int | None) -> Call[list[Approval]]:
    return Call(
        "GET",
        f"{PREFIX}/approvals",
        lambda r: [Approval.from_json(a) for a in _items(r)],
        params=_params(status=status, run=run, limit=limit),
    )


def get_approval(approval_id: int) -> Call[Approval]:
    path = f"{PREFIX}/approvals/{int(approval_id)}"
    return Call("GET", path, lambda r: Approval.from_json(r.json()))


def decide(
    approval_id: int, decision: Decision, reason: str, input: Any, allow_similar: bool
) -> Call[Approval]:
    if decision not in ("approve", "deny", "edit"):
        raise ValueError(f"decision must be approve, deny or edit, not {decision!r}")
    if decision == "deny" and not reason:
        raise ValueError("a denial needs a reason (the agent reads it)")
    if decision == "edit" and input is None:
        raise ValueError("an edit needs the whole edited input")
    body: dict[str, Any] = {"decision": decision, "reason": reason, "allow_similar": allow_similar}
    if input is not None:
        body["input"] = input
    path = f"{PREFIX}/approvals/{int(approval_id)}/decision"
    return Call("POST", path, lambda r: Approval.from_json(r.json()), json=body)


# --- checkpoints and artifacts -------------------------------------------------------------


def list_checkpoints(run_id: int) -> Call[list[Checkpoint]]:
    path = f"{PREFIX}/runs/{int(run_id)}/checkpoints"
    return Call("GET", path, lambda r: [Checkpoint.from_json(c) for c in _items(r)])


def create_checkpoint(run_id: int, label: str) -> Call[Checkpoint]:
    path = f"{PREFIX}/runs/{int(run_id)}/checkpoints"
    return Call("POST", path, lambda r: Checkpoint.from_json(r.json()), json={"label": label})


# --- memory ---------------------------------------------------------------------------------


def read_memory(run_id: int) -> Call[list[MemoryEntry]]:
    path = f"{PREFIX}/runs/{int(run_id)}/memory"
    return Call("GET", path, lambda r: memory_from_json(r.json()))


def remember(
    run_id: int, key: str, text: str, pinned: bool | None, scope: str
) -> Call[list[MemoryEntry]]:
    path = f"{PREFIX}/runs/{int(run_id)}/memory/{quote(key, safe='')}"
    body: dict[str, Any] = {"text": text, "scope": scope}
    if pinned is not None:
        body["pinned"] = pinned
    return Call("PUT", path, lambda r: memory_from_json(r.json()), json=body)


def forget(run_id: int, key: str, scope: str) -> Call[list[MemoryEntry]]:
    path = f"{PREFIX}/runs/{int(run_id)}/memory/{quote(key, safe='')}"
    return Call("DELETE", path, lambda r: memory_from_json(r.json()), params={"scope": scope})


def _cp(value: int | str) -> str:
    if value == "live":
        return "live"
    return str(int(value))


def diff(run_id: int, a: int, b: int | Literal["live"]) -> Call[Diff]:
    path = f"{PREFIX}/runs/{int(run_id)}/diff"
    params = {"a": _cp(a), "b": _cp(b)}
    return Call("GET", path, lambda r: Diff.from_json(r.json()), params=params)


def diff_patch(run_id: int, a: int, b: int | Literal["live"]) -> Call[str]:
    path = f"{PREFIX}/runs/{int(run_id)}/diff.patch"
    params = {"a": _cp(a), "b": _cp(b)}
    return Call("GET", path, lambda r: r.text, params=params, headers={"Accept": "text/x-diff"})


def export_path(run_id: int, number: int) -> str:
    return f"{PREFIX}/runs/{int(run_id)}/checkpoints/{int(number)}/export.tar.gz"


def list_artifacts(run_id: int) -> Call[list[Artifact]]:
    path = f"{PREFIX}/runs/{int(run_id)}/artifacts"
    return Call("GET", path, lambda r: [Artifact.from_json(a) for a in _items(r)])


def get_artifact(artifact_id: int) -> Call[Artifact]:
    path = f"{PREFIX}/artifacts/{int(artifact_id)}"
    return Call("GET", path, lambda r: Artifact.from_json(r.json()))


def artifact_content(artifact_id: int) -> Call[bytes]:
    path = f"{PREFIX}/artifacts/{int(artifact_id)}/content"
    return Call("GET", path, lambda r: r.content, headers={"Accept": "*/*"})


# --- external agents -----------------------------------------------------------------------


def run_context(run_id: int) -> Call[Context]:
    path = f"{PREFIX}/runs/{int(run_id)}/context"
    return Call("GET", path, lambda r: Context.from_json(r.json()))


def heartbeat(run_id: int) -> Call[str]:
    path = f"{PREFIX}/runs/{int(run_id)}/heartbeat"
    return Call("POST", path, lambda r: str(r.json().get("run_status") or ""), json={})


def record_turn(
    run_id: int,
    text: str,
    model: str,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
) -> Call[TurnResult]:
    body = {
        "text": text,
        "model": model,
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "cache_read_tokens": int(cache_read_tokens),
        "cache_write_tokens": int(cache_write_tokens),
    }
    path = f"{PREFIX}/runs/{int(run_id)}/turns"
    return Call("POST", path, lambda r: TurnResult.from_json(r.json()), json=body)


def request_tool_call(
    run_id: int, tool: str, input: Any, call_id: str | None = None, root: str | None = None
) -> Call[ToolDecision]:
    path = f"{PREFIX}/runs/{int(run_id)}/tool-calls"
    body: dict[str, Any] = {"tool": tool, "input": input}
    if call_id is not None:
        body["call_id"] = call_id
    if root is not None:
        body["root"] = root
    return Call(
        "POST",
        path,
        lambda r: ToolDecision.from_json(r.json(), fallback_input=input),
        json=body,
    )


def withdraw_tool_call(call_id: str) -> Call[ToolDecision]:
    path = f"{PREFIX}/tool-calls/{call_id}/withdraw"
    return Call("POST", path, lambda r: ToolDecision.from_json(r.json()), json={})


def get_tool_call(call_id: str, wait: float | None, timeout: float) -> Call[ToolDecision]:
    params: dict[str, Any] = {}
    read_timeout = None
    if wait:
        seconds = max(1, min(MAX_WAIT, int(wait)))
        params["wait"] = seconds
        read_timeout = seconds + timeout
    return Call(
        "GET",
        f"{PREFIX}/tool-calls/{call_id}",
        lambda r: ToolDecision.from_json(r.json()),
        params=params,
        read_timeout=read_timeout,
    )


def report_tool_result(call_id: str, output: Any, is_error: bool) -> Call[ResultAck]:
    if not isinstance(output, str):
        output = jsonlib.dumps(output) if isinstance(output, dict | list) else str(output)
    return Call(
        "POST",
        f"{PREFIX}/tool-calls/{call_id}/result",
        lambda r: ResultAck.from_json(r.json()),
        json={"output": output, "is_error": bool(is_error)},
    )


def upload_workspace(
    run_id: int, opener: Callable[[], IO[bytes]], size: int
) -> Call[WorkspaceUpload]:
    return Call(
        "PUT",
        f"{PREFIX}/runs/{int(run_id)}/workspace",
        lambda r: WorkspaceUpload.from_json(r.json()),
        content=opener,
        headers={"Content-Type": "application/gzip", "Content-Length": str(size)},
    )


def handoff(
    run_id: int,
    summary: str,
    done: Iterable[str],
    next_steps: Iterable[str],
    open_questions: Iterable[str],
) -> Call[Context]:
    body = {
        "summary": summary,
        "done": list(done),
        "next_steps": list(next_steps),
        "open_questions": list(open_questions),
    }
    path = f"{PREFIX}/runs/{int(run_id)}/handoff"
    parse = lambda r: Context.from_json(r.json())  # noqa: E731
    return Call("POST", path, parse, json=body, read_timeout=CHECKS_TIMEOUT)


def finish(run_id: int, summary: str) -> Call[dict[str, Any]]:
    """The agent says it is done. A current server answers at once (202, `state: checking`: the
    checks run in a worker; `finish_verdict` waits for them); an older one held the request
    for the checks and answered the verdict."""
    path = f"{PREFIX}/runs/{int(run_id)}/finish"
    return Call(
        "POST", path, lambda r: r.json(), json={"summary": summary}, read_timeout=CHECKS_TIMEOUT
    )


def finish_verdict(run_id: int, finish_id: str, timeout: float) -> Call[dict[str, Any]]:
    path = f"{PREFIX}/runs/{int(run_id)}/finish/{finish_id}"
    return Call(
        "GET", path, lambda r: r.json(), params={"wait": MAX_WAIT}, read_timeout=MAX_WAIT + timeout
    )


def file_chunks(stream: IO[bytes], size: int = 64 * 1024) -> Iterator[bytes]:
    while chunk := stream.read(size):
        yield chunk
