"""What the API takes and gives, as pydantic models: the OpenAPI schema is made from these.

Inputs forbid unknown fields (a typo is a 422, not silently ignored); numbers and strings are
bounded so nothing out of range reaches the services.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from ninja import Path, Schema
from pydantic import ConfigDict, Field

from agents import events as event_kinds

# A row id in a path: a number a key can hold (anything else is a 422, never an overflow).
PathId = Annotated[int, Path(ge=1, le=2**53)]
Count = Annotated[int, Field(ge=1, le=2**53)]
Text = Annotated[str, Field(max_length=20_000)]
Line = Annotated[str, Field(max_length=2_000)]
# A turn's tokens: far above any model's context, far below what would overflow the run's cost.
Tokens = Annotated[int, Field(ge=0, le=10_000_000)]


class In(Schema):
    model_config = ConfigDict(extra="forbid")


class Problem(Schema):
    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None


# --- runs -----------------------------------------------------------------------------------
class Criterion(In):
    name: Line
    check: Line | None = None


class Limits(In):
    memory_mb: Count | None = None
    processes: Count | None = None
    cpu_seconds: Count | None = None
    workspace_mb: Count | None = None


class RunCreate(In):
    goal: Annotated[str, Field(min_length=1, max_length=20_000)]
    checks: Annotated[list[Line], Field(max_length=50)] = []
    provider: Literal["scripted", "anthropic", "external"] = "scripted"
    model: Annotated[str, Field(max_length=100)] | None = None
    script: dict[str, Any] | None = None
    rubric: Text = ""
    judge_model: Annotated[str, Field(max_length=100)] = ""
    max_sessions: Count | None = None
    max_tokens: Count | None = None
    max_cost_usd: Annotated[Decimal, Field(gt=0, le=10**6, decimal_places=6)] | None = None
    max_wall_seconds: Count | None = None
    max_turns_per_session: Count | None = None
    max_input_tokens_per_session: Count | None = None
    # Rules as the CLI and web take them (agents/policy.py checks each one).
    tool_policy: Annotated[list[dict[str, Any]], Field(max_length=200)] = []
    approval_timeout_seconds: Count | None = None
    webhook_urls: Annotated[list[Line], Field(max_length=20)] = []
    # Slack (agents/reach.py): the run's own channel (an id C… or #name; "" its project's), and
    # which run news it posts: some of ended, paused, budget; [] or ["off"] for none; null (not
    # given) for its project's switches.
    slack_channel: Annotated[str, Field(max_length=80)] = ""
    slack_news: (
        Annotated[list[Annotated[str, Field(max_length=20)]], Field(max_length=3)] | None
    ) = None
    protected_paths: Annotated[list[Line], Field(max_length=200)] = []
    protected_action: Literal["deny", "ask"] = "deny"
    acceptance: Annotated[list[Criterion], Field(max_length=50)] = []
    limits: Limits | None = None
    allowed_hosts: Annotated[list[Line], Field(max_length=100)] = []
    heartbeat_seconds: Count | None = None
    project: Annotated[str, Field(max_length=100)] = ""
    fleet_conflicts: Literal["agent", "person"] = "agent"
    # The environment the run's commands and checks run with, as `create_run --env` and
    # `--env-requirements` name it: a path on the server (an interpreter or a virtualenv), or a
    # requirements file on the server to build one from.
    environment: Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    requirements: Annotated[str, Field(min_length=1, max_length=1000)] | None = None


class RunSlack(In):
    """A run's own Slack settings, changed: a field left out stays as it is; slack_channel ""
    and slack_news null go back to the project's."""

    slack_channel: Annotated[str, Field(max_length=80)] | None = None
    slack_news: (
        Annotated[list[Annotated[str, Field(max_length=20)]], Field(max_length=3)] | None
    ) = None


class TokensOut(Schema):
    input: int
    output: int
    cache_read: int
    cache_write: int
    total: int


class BudgetsOut(Schema):
    max_sessions: int | None
    max_tokens: int | None
    max_cost_usd: str | None
    max_wall_seconds: int | None


class RunOut(Schema):
    id: int
    goal: str
    status: str
    status_reason: str
    # Paused: why, as a word (person, budget, fleet, rewind, store_down, ...); else "".
    pause_cause: str = ""
    provider: str
    external: bool
    stalled: bool
    last_contact_at: datetime | None
    heartbeat_seconds: int | None
    model: str
    checks: list[str]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    turns: int
    tokens: TokensOut
    cost_usd: str
    budgets: BudgetsOut
    sessions: int
    last_seq: int
    pending_approvals: int
    forked_from: dict[str, Any] | None
    url: str
    project: str = ""
    # The run's own Slack settings ("" / null: its project's; [] for no run news).
    slack_channel: str = ""
    slack_news: list[str] | None = None
    schedule: int | None = None
    trigger: int | None = None
    wake_at: datetime | None = None
    # Fleets: the run that spawned this one, this one's children (ids), and the spend of this
    # run and all below it.
    parent: int | None = None
    depth: int = 0
    children: list[int] = []
    rollup: dict[str, Any] = {}


class RunPage(Schema):
    items: list[RunOut]
    next_cursor: str | None


class Reason(In):
    reason: Annotated[str, Field(max_length=5_000)] = ""


class Resume(In):
    max_sessions: Count | None = None
    max_tokens: Count | None = None
    max_cost_usd: Annotated[Decimal, Field(gt=0, le=10**6, decimal_places=6)] | None = None
    max_wall_seconds: Count | None = None


class Note(In):
    text: Annotated[str, Field(min_length=1, max_length=20_000)]


class Seq(Schema):
    seq: int


class FromCheckpoint(In):
    checkpoint: Count
    note: Annotated[str, Field(max_length=5_000)] = ""
    dry_run: bool = False


class RewindOut(Schema):
    checkpoint: int
    dry_run: bool
    discarded: dict[str, Any]


class ForkPreview(Schema):
    checkpoint: int
    dry_run: bool
    would_copy: dict[str, Any]


# --- events ---------------------------------------------------------------------------------
# Each typed kind's payload, from the one registry (agents/events.py), shown in the document as
# `x-payload-of-kind` on `payload`. The payload itself is sent as it was stored (events written
# before a field existed lack it), so it is not validated against these on the way out.
PAYLOADS_BY_KIND = {
    kind: model.model_json_schema(by_alias=True)
    for kind, model in sorted(event_kinds.typed_kinds().items())
}


class EventOut(Schema):
    seq: int
    kind: str = Field(description="One of the kinds in `x-payload-of-kind`, or an untyped one.")
    actor: str
    session: int | None
    created_at: datetime
    payload: dict[str, Any] = Field(
        description="The event's payload; for a typed kind, as its schema in `x-payload-of-kind` "
        "(fields added later are missing from older events). Untyped kinds: "
        + ", ".join(event_kinds.untyped_kinds())
        + ".",
        json_schema_extra={"x-payload-of-kind": PAYLOADS_BY_KIND},
    )
    summary: str


class EventPage(Schema):
    items: list[EventOut]
    last_seq: int


# --- approvals ------------------------------------------------------------------------------
class ApprovalOut(Schema):
    id: int
    run: int
    status: str
    tool: str
    input: dict[str, Any]
    reason: str
    created_at: datetime
    expires_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    comment: str
    edited_input: dict[str, Any] | None


class ApprovalList(Schema):
    items: list[ApprovalOut]


class Decision(In):
    decision: Literal["approve", "deny", "edit"]
    reason: Annotated[str, Field(max_length=5_000)] = ""
    input: dict[str, Any] | Annotated[str, Field(max_length=200_000)] | None = None
    allow_similar: bool = False


# --- checkpoints and artifacts --------------------------------------------------------------
class CheckpointOut(Schema):
    number: int
    kind: str
    label: str
    seq: int
    session: int | None
    files: int
    bytes_total: int
    created_at: datetime


class CheckpointList(Schema):
    items: list[CheckpointOut]


class CheckpointCreate(In):
    label: Annotated[str, Field(max_length=200)] = ""


class ChangeOut(Schema):
    path: str
    change: str
    kind: str | None
    diff: str | None


class DiffOut(Schema):
    a: int
    b: int | Literal["live"]
    changes: list[ChangeOut]


class ArtifactOut(Schema):
    id: int
    run: int
    name: str
    kind: str
    size: int
    mime_type: str
    session: int | None
    created_at: datetime


class ArtifactList(Schema):
    items: list[ArtifactOut]


# --- external agents ------------------------------------------------------------------------
class SaidOut(Schema):
    seq: int
    kind: str
    text: str


class RewoundOut(Schema):
    """A rewind the agent has not taken in yet: it restores the workspace from the checkpoint
    (by its number) and reads its context again."""

    checkpoint: int | None
    by: str
    note: str = ""


class ContextOut(Schema):
    session: int | None
    first_message: str
    messages: list[SaidOut]
    handoff_requested: bool = False
    run_status: str
    rewound: RewoundOut | None = None


class StatusOut(Schema):
    run_status: str
    rewound: RewoundOut | None = None


class TurnIn(In):
    text: Annotated[str, Field(max_length=200_000)] = ""
    model: Annotated[str, Field(max_length=100)] = ""
    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cache_read_tokens: Tokens = 0
    cache_write_tokens: Tokens = 0


class TurnOut(Schema):
    seq: int
    run_status: str
    cost_usd: str
    handoff_requested: bool
    rewound: RewoundOut | None = None


class SpawnChild(In):
    goal: Annotated[str, Field(min_length=1, max_length=20_000)]
    checks: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=2_000)]], Field(min_length=1)
    ]
    from_: Annotated[str, Field(alias="from", max_length=1_000)] = "."
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    budget_cost_usd: Annotated[float, Field(gt=0)] | None = None
    provider: Literal["scripted", "anthropic"] | None = None
    model: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    script: dict[str, Any] | None = None


class SpawnIn(In):
    children: Annotated[list[SpawnChild], Field(min_length=1)]
    wait: Literal["all", "any"] = "all"
    call_id: Annotated[str, Field(min_length=1, max_length=100)] = Field(
        default_factory=lambda: f"api-{uuid.uuid4().hex}",
        description="the same id again returns the same children (a retry makes no duplicate)",
    )


class MergeIn(In):
    runs: Annotated[list[Annotated[int, Field(ge=1)]], Field(max_length=100)] | None = None


class MergeOut(Schema):
    output: str
    merges: list[dict[str, Any]]
    run_status: str


class SpawnOut(Schema):
    children: list[int]
    run_status: str


class ToolCallIn(In):
    tool: Annotated[str, Field(min_length=1, max_length=100)]
    input: dict[str, Any] = {}
    # The agent's own id of the call (Claude Code's tool_use_id): asked again, the same answer.
    call_id: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    # The agent's folder as it sees it: absolute paths under it are paths in the workspace.
    root: Annotated[str, Field(min_length=1, max_length=1_000)] | None = None


class ToolCallOut(Schema):
    id: str | None
    decision: Literal["allow", "ask", "deny", "pending", "approved", "denied"]
    reason: str
    input: dict[str, Any]
    approval: int | None
    note: str = ""
    run_status: str
    rewound: RewoundOut | None = None


class ResultIn(In):
    output: Annotated[str, Field(max_length=5_000_000)]
    is_error: bool = False


class ResultOut(Schema):
    seq: int
    run_status: str
    rewound: RewoundOut | None = None


class HandoffIn(In):
    summary: Annotated[str, Field(min_length=1, max_length=50_000)]
    done: Annotated[list[Line], Field(max_length=200)] = []
    next_steps: Annotated[list[Line], Field(max_length=200)] = []
    open_questions: Annotated[list[Line], Field(max_length=200)] = []


class FinishIn(In):
    summary: Annotated[str, Field(min_length=1, max_length=50_000)]


class CheckOut(Schema):
    command: str
    passed: bool
    exit_code: int | None
    output: str
    timed_out: bool | None = None


class FinishOut(Schema):
    id: str | None = None
    state: Literal["checking", "done"] = "done"
    passed: bool
    run_status: str
    checks: list[CheckOut]
    summary: str


class FinishQueuedOut(Schema):
    id: str
    state: Literal["checking"]
    run_status: str


class UploadOut(Schema):
    checkpoint: int
    files: int
    bytes_total: int
