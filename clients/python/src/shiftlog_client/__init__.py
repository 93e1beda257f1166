"""A typed client for Shiftlog's JSON API (`/api/v1/`), sync and async, with helpers for an
external agent: `ExternalRun(client, run_id)` asks before each tool, reports each result,
records usage, uploads the workspace and finishes."""

from __future__ import annotations

from ._archive import WorkspaceArchiveError, build_archive
from ._async_client import AsyncClient
from ._base import StreamDropped, __version__
from ._client import Client
from ._errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    RateLimited,
    Rewound,
    ShiftlogError,
    TooLarge,
    Unauthorized,
)
from ._external import AsyncExternalRun, ExternalRun, ToolOutcome, message_usage
from ._models import (
    FINAL_STATUSES,
    STOPPED_STATUSES,
    Approval,
    Artifact,
    Checkpoint,
    CheckResult,
    Context,
    Diff,
    Event,
    EventPage,
    FileChange,
    FinishResult,
    ForkPreview,
    MemoryEntry,
    Page,
    ResultAck,
    RewindResult,
    Run,
    Tokens,
    ToolDecision,
    TurnResult,
    WorkspaceUpload,
)
from ._ops import RunSpec

__all__ = [
    "FINAL_STATUSES",
    "STOPPED_STATUSES",
    "Approval",
    "Artifact",
    "AsyncClient",
    "AsyncExternalRun",
    "CheckResult",
    "Checkpoint",
    "Client",
    "Conflict",
    "Context",
    "Diff",
    "Event",
    "EventPage",
    "ExternalRun",
    "FileChange",
    "FinishResult",
    "Forbidden",
    "ForkPreview",
    "Invalid",
    "MemoryEntry",
    "NotFound",
    "Page",
    "RateLimited",
    "ResultAck",
    "RewindResult",
    "Rewound",
    "Run",
    "RunSpec",
    "ShiftlogError",
    "StreamDropped",
    "Tokens",
    "TooLarge",
    "ToolDecision",
    "ToolOutcome",
    "TurnResult",
    "Unauthorized",
    "WorkspaceArchiveError",
    "WorkspaceUpload",
    "__version__",
    "build_archive",
    "message_usage",
]
