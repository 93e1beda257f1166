"""The API's resources as typed, frozen dataclasses built from its JSON (docs/api.md).

Every model keeps the JSON it was built from in `raw`, so a field the server adds later is
still at hand. Fields the contract marks as possibly absent default to None or empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# A run in one of these states will not go on by itself.
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
STOPPED_STATUSES = FINAL_STATUSES | {"paused"}


def _time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _decimal(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal(0)
    except InvalidOperation:
        return Decimal(0)


def _int(value: Any, default: int = 0) -> int:
    return int(value) if value is not None else default


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items and the cursor of the next page (None on the last)."""

    items: list[T]
    next_cursor: str | None = None


@dataclass(frozen=True)
class Tokens:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Tokens:
        data = data or {}
        return cls(
            input=_int(data.get("input")),
            output=_int(data.get("output")),
            cache_read=_int(data.get("cache_read")),
            cache_write=_int(data.get("cache_write")),
            total=_int(data.get("total")),
        )


@dataclass(frozen=True)
class Run:
    id: int
    goal: str
    status: str
    status_reason: str = ""
    pause_cause: str = ""  # paused: why (person, budget, fleet, rewind, store_down, ...)
    provider: str = ""
    external: bool = False
    stalled: bool = False
    last_contact_at: datetime | None = None
    heartbeat_seconds: int | None = None
    model: str = ""
    checks: list[str] = field(default_factory=list)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    turns: int = 0
    tokens: Tokens = field(default_factory=Tokens)
    cost_usd: Decimal = Decimal(0)
    budgets: dict[str, Any] = field(default_factory=dict)
    sessions: int = 0
    last_seq: int = 0
    pending_approvals: int = 0
    url: str = ""
    forked_from: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True once the run has succeeded, failed or been cancelled."""
        return self.status in FINAL_STATUSES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=int(data["id"]),
            goal=data.get("goal") or "",
            status=data.get("status") or "",
            status_reason=data.get("status_reason") or "",
            pause_cause=data.get("pause_cause") or "",
            provider=data.get("provider") or "",
            external=bool(data.get("external")),
            stalled=bool(data.get("stalled")),
            last_contact_at=_time(data.get("last_contact_at")),
            heartbeat_seconds=_opt_int(data.get("heartbeat_seconds")),
            model=data.get("model") or "",
            checks=list(data.get("checks") or []),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            finished_at=_time(data.get("finished_at")),
            turns=_int(data.get("turns")),
            tokens=Tokens.from_json(data.get("tokens")),
            cost_usd=_decimal(data.get("cost_usd")),
            budgets=dict(data.get("budgets") or {}),
            sessions=_int(data.get("sessions")),
            last_seq=_int(data.get("last_seq")),
            pending_approvals=_int(data.get("pending_approvals")),
            url=data.get("url") or "",
            forked_from=data.get("forked_from"),
            raw=data,
        )


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    actor: str = ""
    session: int | None = None
    created_at: datetime | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        payload = data.get("payload")
        return cls(
            seq=int(data["seq"]),
            kind=data.get("kind") or "",
            actor=data.get("actor") or "",
            session=_opt_int(data.get("session")),
            created_at=_time(data.get("created_at")),
            payload=payload if isinstance(payload, dict) else {},
            summary=data.get("summary") or "",
            raw=data,
        )


@dataclass(frozen=True)
class EventPage:
    """`GET /runs/{id}/events`: events in seq order and the run's last seq."""

    items: list[Event]
    last_seq: int


@dataclass(frozen=True)
class Approval:
    id: int
    run: int
    status: str
    tool: str = ""
    input: Any = None
    reason: str = ""
    created_at: datetime | None = None
    expires_at: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    comment: str = ""
    edited_input: Any = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        decided_by = data.get("decided_by")
        return cls(
            id=int(data["id"]),
            run=int(data["run"]),
            status=data.get("status") or "",
            tool=data.get("tool") or "",
            input=data.get("input"),
            reason=data.get("reason") or "",
            created_at=_time(data.get("created_at")),
            expires_at=_time(data.get("expires_at")),
            decided_by=None if decided_by is None else str(decided_by),
            decided_at=_time(data.get("decided_at")),
            comment=data.get("comment") or "",
            edited_input=data.get("edited_input"),
            raw=data,
        )


@dataclass(frozen=True)
class Checkpoint:
    number: int
    kind: str = ""
    label: str = ""
    seq: int | None = None
    session: int | None = None
    files: int = 0
    bytes_total: int = 0
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        return cls(
            number=int(data["number"]),
            kind=data.get("kind") or "",
            label=data.get("label") or "",
            seq=_opt_int(data.get("seq")),
            session=_opt_int(data.get("session")),
            files=_int(data.get("files")),
            bytes_total=_int(data.get("bytes_total")),
            created_at=_time(data.get("created_at")),
            raw=data,
        )


@dataclass(frozen=True)
class MemoryEntry:
    """One entry of a run's memory (`scope` "run"), or of its project's (`scope` "project"),
    which every later run of the project wakes up with."""

    key: str
    text: str
    scope: str = "run"
    pinned: bool = False
    uses: int = 0
    by: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryEntry:
        return cls(
            key=str(data["key"]),
            text=data.get("text") or "",
            scope=data.get("scope") or "run",
            pinned=bool(data.get("pinned")),
            uses=_int(data.get("uses")),
            by=data.get("by") or "",
        )


def memory_from_json(data: dict[str, Any]) -> list[MemoryEntry]:
    """`GET /runs/{id}/memory` (and the answer to a change): its entries, most useful first."""
    return [MemoryEntry.from_json(e) for e in data.get("items") or []]


@dataclass(frozen=True)
class FileChange:
    path: str
    change: str
    kind: str = ""
    diff: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileChange:
        return cls(
            path=data.get("path") or "",
            change=data.get("change") or "",
            kind=data.get("kind") or "",
            diff=data.get("diff") or "",
        )


@dataclass(frozen=True)
class Diff:
    a: int | str
    b: int | str
    changes: list[FileChange]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Diff:
        return cls(
            a=data.get("a", ""),
            b=data.get("b", ""),
            changes=[FileChange.from_json(c) for c in data.get("changes") or []],
            raw=data,
        )


@dataclass(frozen=True)
class Artifact:
    id: int
    name: str
    run: int | None = None
    kind: str = ""
    size: int = 0
    mime_type: str = ""
    session: int | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Artifact:
        return cls(
            id=int(data["id"]),
            name=data.get("name") or "",
            run=_opt_int(data.get("run")),
            kind=data.get("kind") or "",
            size=_int(data.get("size")),
            mime_type=data.get("mime_type") or "",
            session=_opt_int(data.get("session")),
            created_at=_time(data.get("created_at")),
            raw=data,
        )


@dataclass(frozen=True)
class RewindResult:
    """What a rewind discards; `queued` is True when a real rewind was accepted (202)."""

    checkpoint: int
    dry_run: bool
    discarded: dict[str, Any]
    queued: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, queued: bool = False) -> RewindResult:
        return cls(
            checkpoint=_int(data.get("checkpoint")),
            dry_run=bool(data.get("dry_run")),
            discarded=dict(data.get("discarded") or {}),
            queued=queued,
            raw=data,
        )


@dataclass(frozen=True)
class ForkPreview:
    """A fork's dry run: what the new run would copy."""

    checkpoint: int
    would_copy: dict[str, Any]
    dry_run: bool = True
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForkPreview:
        return cls(
            checkpoint=_int(data.get("checkpoint")),
            would_copy=dict(data.get("would_copy") or {}),
            raw=data,
        )


# --- external agents -----------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a session starts from (`GET /runs/{id}/context`, and the answer to a handoff):
    its first message, and what people and the harness said since (`messages`, each a dict of
    `seq`, `kind`, `text`). `session` is None when the run is in no state to go on."""

    session: int | None
    first_message: str
    run_status: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    handoff_requested: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Context:
        return cls(
            session=_opt_int(data.get("session")),
            first_message=data.get("first_message") or "",
            run_status=data.get("run_status") or "",
            messages=list(data.get("messages") or []),
            handoff_requested=bool(data.get("handoff_requested")),
            raw=data,
        )


@dataclass(frozen=True)
class TurnResult:
    """A recorded turn: its seq, the run's status and cost so far, and whether the harness
    asks the agent to hand off now (the session is at its limit)."""

    seq: int
    run_status: str
    cost_usd: Decimal = Decimal(0)
    handoff_requested: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnResult:
        return cls(
            seq=_int(data.get("seq")),
            run_status=data.get("run_status") or "",
            cost_usd=_decimal(data.get("cost_usd")),
            handoff_requested=bool(data.get("handoff_requested")),
            raw=data,
        )


# A tool call may run once its decision is one of these.
RUNNABLE_DECISIONS = frozenset({"allow", "approved"})


@dataclass(frozen=True)
class ToolDecision:
    """Shiftlog's word on a tool call: `allow`/`approved` (run `input`), `deny`/`denied` (don't;
    `reason` says why), `ask`/`pending` (a person has not decided yet)."""

    id: str | None  # None when the call was refused without being recorded (run paused)
    decision: str
    input: Any = None
    reason: str = ""
    approval: int | None = None
    run_status: str = ""
    note: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def allowed(self) -> bool:
        """The call may run (with `input`, which a person may have edited)."""
        return self.decision in RUNNABLE_DECISIONS

    @property
    def pending(self) -> bool:
        """A person has not decided yet."""
        return self.decision in ("ask", "pending")

    @property
    def denied(self) -> bool:
        return self.decision in ("deny", "denied")

    @property
    def rewound(self) -> dict[str, Any] | None:
        """A rewind the agent has not taken in yet ({"checkpoint": number, "by", "note"}):
        restore the workspace from that checkpoint and read the context again."""
        return self.raw.get("rewound")

    @classmethod
    def from_json(cls, data: dict[str, Any], *, fallback_input: Any = None) -> ToolDecision:
        return cls(
            id=None if data.get("id") is None else str(data["id"]),
            decision=data.get("decision") or "",
            input=data.get("input", fallback_input),
            reason=data.get("reason") or "",
            approval=_opt_int(data.get("approval")),
            run_status=data.get("run_status") or "",
            note=data.get("note") or "",
            raw=data,
        )


@dataclass(frozen=True)
class ResultAck:
    """The answer to a tool result: the `tool.result` event's seq and the run's status."""

    seq: int
    run_status: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResultAck:
        return cls(seq=_int(data.get("seq")), run_status=data.get("run_status") or "", raw=data)


@dataclass(frozen=True)
class WorkspaceUpload:
    checkpoint: int
    files: int
    bytes_total: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkspaceUpload:
        return cls(
            checkpoint=_int(data.get("checkpoint")),
            files=_int(data.get("files")),
            bytes_total=_int(data.get("bytes_total")),
            raw=data,
        )


@dataclass(frozen=True)
class CheckResult:
    command: str
    passed: bool
    exit_code: int | None = None
    output: str = ""
    timed_out: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        return cls(
            command=data.get("command") or "",
            passed=bool(data.get("passed")),
            exit_code=_opt_int(data.get("exit_code")),
            output=data.get("output") or "",
            timed_out=bool(data.get("timed_out")),
        )


@dataclass(frozen=True)
class FinishResult:
    """The harness's verdict on `finish`: the run's checks, run by Shiftlog itself, and
    `summary`, what the harness tells the agent about them."""

    passed: bool
    run_status: str
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def report(self, limit: int = 4000) -> str:
        """A plain-text account of the verdict for a model to read: what failed and its output."""
        if self.passed:
            return f"The checks passed; the run is {self.run_status}."
        lines = [f"Not done yet: the harness ran the checks and the run is {self.run_status}."]
        if self.summary:
            lines.append(self.summary if len(self.summary) <= limit else self.summary[-limit:])
        for check in self.checks:
            if check.passed:
                lines.append(f"PASSED: {check.command}")
            else:
                out = check.output if len(check.output) <= limit else check.output[-limit:]
                how = "timed out" if check.timed_out else f"exit {check.exit_code}"
                lines.append(f"FAILED ({how}): {check.command}\n{out}".rstrip())
        lines.extend(f"Note: {note}" for note in self.notes)
        return "\n".join(lines)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FinishResult:
        return cls(
            passed=bool(data.get("passed")),
            run_status=data.get("run_status") or "",
            checks=[CheckResult.from_json(c) for c in data.get("checks") or []],
            notes=[n if isinstance(n, str) else str(n) for n in data.get("notes") or []],
            summary=data.get("summary") or "",
            raw=data,
        )
