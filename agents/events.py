"""Every event kind, once: its payload's fields and types, its label, its one-line summary and
whether it records a failure. One registry (`KINDS`) that the log's writer and every reader use.

- **Write**: `eventlog.append_many` calls `check(kind, payload)` for each event. A kind not in the
  registry is refused; a typed kind's payload is validated against its model (strict types, no
  field it does not name, every required field present): a typo at an emit site fails there, in
  the test that reaches it, not months later in a renderer.
- **Read**: `payload_of(event)` (or `read(kind, payload)`) gives the typed payload, tolerantly:
  events stored before a field existed read with the field's default (`None` for a required one),
  keys the model no longer names are left out. Untyped kinds read as their stored dict, so a
  template or a renderer reads `p.name` for both.
- **Summaries, labels, failures**: `summary(kind, payload)` (the CLI, the admin, the API, the
  run page), `label(kind)`, `failed(kind, payload)` (the run page's red rows, the trace's error
  status); `tests/test_events.py` keeps `failed` in step with `Event.objects.failures()`.

The payloads are pydantic models (frozen, `extra="forbid"`, strict) rather than dataclasses: the
API's schemas are pydantic already (django-ninja), so the same models give the OpenAPI document
its typed payloads, and pydantic validates them at write without code of our own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.models import Event, EventKind

log = logging.getLogger(__name__)

K = EventKind


class EventPayloadError(ValueError):
    """An event that may not be written: an unknown kind, or a payload its kind's model refuses."""


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


Obj = dict[str, Any]


# --- the typed payloads ---------------------------------------------------------------------
class RunStatusPayload(Payload):
    from_: str = Field(alias="from")
    to: str
    reason: str = ""
    cause: str = ""  # a paused run's PauseCause


class SessionStarted(Payload):
    index: int
    first_message: str = ""


class SessionEnded(Payload):
    index: int
    reason: str  # an EndReason: handoff, finished, ...


class ModelTurn(Payload):
    content: list[Obj]
    text: str = ""
    stop_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    cost_usd: str = "0"
    price: str = ""
    model: str = ""
    latency_ms: float | None = None
    context_seq: int | None = None
    meta: Obj | None = None

    @property
    def tool_names(self) -> list[str]:
        return [str(b.get("name")) for b in self.content if b.get("type") == "tool_use"]


class ToolCall(Payload):
    tool_use_id: str
    name: str
    input: Obj | None = None
    approval_id: int | None = None


class ToolResult(Payload):
    tool_use_id: str
    name: str
    output: str
    is_error: bool = False
    data: Obj | None = None
    # A changing call's workspace state as stored before its result (agents/runtime/slice.py).
    workspace: Obj | None = None


class HarnessMessage(Payload):
    text: str
    reason: str = ""  # handoff_requested, approval_flood, network_decision, fleet outcomes, ...
    approval_id: int | None = None


class HumanNote(Payload):
    text: str
    author: str = ""


class CheckResult(Payload):
    command: str
    passed: bool
    exit_code: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    output: str = ""
    duration_ms: float | None = None
    isolation: str = ""
    at: str = ""  # finish, session_end
    required: bool = True
    held_out: bool = False
    suite: Obj | None = None
    suite_problems: list[str] = Field(default_factory=list)


class CheckRegressed(Payload):
    command: str
    passed_at_seq: int
    at: str = "finish"


class CheckTampered(Payload):
    files: list[Obj]
    at: str = "finish"
    what: str = ""


class JudgeVerdict(Payload):
    passed: bool
    criteria: list[Any] = Field(default_factory=list)  # a judge may answer oddly
    model: str | None = None
    error: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    cost_usd: str = "0"


class DriftWarning(Payload):
    coverage: float
    threshold: float
    goal_words_missing: list[str] = Field(default_factory=list)
    summary: str = ""
    forced: bool = False


class AcceptanceUpdated(Payload):
    passing: int
    total: int
    changed: list[Any] = Field(default_factory=list)
    criteria: list[Any] = Field(default_factory=list)


class BudgetWarning(Payload):
    budget: str
    used: str
    limit: str


class BudgetExceeded(Payload):
    reason: str


class ErrorPayload(Payload):
    message: str
    source: str = ""  # provider, recovery, rewind, wake
    error: str = ""
    status_code: int | None = None


class ApprovalRequested(Payload):
    approval_id: int
    tool_use_id: str
    tool: str
    input: Obj | None = None
    reason: str = ""
    expires_at: str | None = None


class ApprovalDecided(Payload):
    approval_id: int
    tool_use_id: str
    tool: str
    decision: str  # an ApprovalStatus: approved, denied, expired, discarded, withdrawn
    comment: str = ""
    edited_input: Obj | None = None
    diff: str | None = None
    # A config change approved: the files whose approved content the checks now use,
    # [{path, what, hash}] (agents/config_changes.apply).
    baseline: list[dict[str, str]] | None = None


class ArtifactSaved(Payload):
    artifact_id: int
    name: str
    kind: str
    size: int


class _Numbered:
    @property
    def shown_number(self) -> int:
        """A checkpoint's number in its run (events from before numbers had only the id)."""
        return self.number if self.number is not None else self.checkpoint_id


class CheckpointCreated(_Numbered, Payload):
    checkpoint_id: int
    kind: str
    number: int | None = None  # events from before checkpoints had numbers have only the id
    label: str = ""
    tree: str = ""
    files: int = 0
    bytes_added: int = 0
    ms: float | None = None


class RewindRequested(_Numbered, Payload):
    checkpoint_id: int
    to_seq: int
    number: int | None = None
    note: str = ""


class Rewound(_Numbered, Payload):
    checkpoint_id: int
    from_seq: int
    to_seq: int
    number: int | None = None
    events: int = 0
    by_kind: dict[str, int] = Field(default_factory=dict)
    sessions: list[int] = Field(default_factory=list)
    tokens: int = 0
    cost_usd: str = "0"
    artifacts: list[str] = Field(default_factory=list)
    files: list[Obj] = Field(default_factory=list)
    irreversible: list[Obj] = Field(default_factory=list)
    children: list[int] = Field(default_factory=list)
    note: str = ""


class Forked(_Numbered, Payload):
    checkpoint_id: int
    fork_run_id: int
    number: int | None = None


# --- the registry ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    kind: str
    label: str
    payload: type[Payload] | None  # None: untyped, the payload is read as its stored dict
    summary: Callable[[Any], str]
    failed: Callable[[Any], bool] = lambda p: False

    def read(self, payload: Obj) -> Any:
        """The stored payload as its type, tolerantly (see the module's docstring)."""
        model = self.payload
        if model is None:
            return payload
        if not isinstance(payload, dict):
            payload = {}
        fields = model.model_fields
        known = {}
        for name, f in fields.items():
            key = f.alias or name
            if key in payload:
                known[name] = payload[key]
        try:
            return model.model_validate(known, strict=False)
        except ValidationError:
            # Old or odd: take what is there; a missing required field reads as None.
            missing = {n: None for n, f in fields.items() if f.is_required()}
            return model.model_construct(**{**missing, **known})


def short(text: Any, limit: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


KINDS: dict[str, Kind] = {}


def register(kind: str, label: str, payload: type[Payload] | None = None, **how: Any):
    """Register a kind; used as a decorator on its summary function."""

    def add(summary: Callable[[Any], str]) -> Callable[[Any], str]:
        KINDS[kind] = Kind(kind, label, payload, summary, **how)
        return summary

    return add


def info(kind: str) -> Kind:
    try:
        return KINDS[kind]
    except KeyError:
        raise EventPayloadError(
            f"{kind!r} is not an event kind (agents/events.py KINDS names them all)"
        ) from None


def check(kind: str, payload: Obj) -> None:
    """Refuse an event its kind's model does not accept (at write: eventlog.append_many)."""
    entry = info(kind)
    if not isinstance(payload, dict):
        raise EventPayloadError(f"{kind}: a payload is a dict, not {type(payload).__name__}")
    if entry.payload is None:
        return
    try:
        entry.payload.model_validate(payload)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(payload)'}: {err['msg']}"
            for err in e.errors()
        )
        message = f"{kind}: payload refused by {entry.payload.__name__} ({problems})"
        if settings.SHIFTLOG.get("STRICT_EVENTS"):
            raise EventPayloadError(message) from None
        log.error("event written as given, though its kind's model refuses it: %s", message)


def as_written(obj: Payload) -> Obj:
    """A typed payload as it is written (by alias: `from`, not `from_`)."""
    return obj.model_dump(by_alias=True)


def read(kind: str, payload: Obj) -> Any:
    """A stored payload as its kind's type (its dict for an untyped or unknown kind)."""
    entry = KINDS.get(kind)
    return payload if entry is None else entry.read(payload)


read_payload = read  # the name importers use beside their own `read`s


def payload_of(event: Event) -> Any:
    """The event's payload as its kind's type (its stored dict for an untyped kind)."""
    return read(event.kind, event.payload)


def label(kind: str) -> str:
    entry = KINDS.get(kind)
    return entry.label if entry else kind


def summary(kind: str, payload: Obj) -> str:
    """A one-line summary of an event, for the CLI, the admin, the API and the run page."""
    entry = KINDS.get(kind)
    if entry is None:
        return short(payload)
    return entry.summary(entry.read(payload))


def failed(kind: str, payload: Obj) -> bool:
    """Whether the event records something going wrong (as `Event.objects.failures()`)."""
    entry = KINDS.get(kind)
    return bool(entry and entry.failed(entry.read(payload)))


def keys(kind: str, *names: str) -> tuple[str, ...]:
    """Payload keys a reader asks the database for (dotted into a field: `usage.input_tokens`),
    checked against the kind's model: a reader cannot ask for a key no writer writes."""
    model = info(kind).payload
    if model is None:
        raise EventPayloadError(f"{kind} is untyped: its keys are not known")
    known = {f.alias or n for n, f in model.model_fields.items()}
    for name in names:
        if name.split(".")[0] not in known:
            raise EventPayloadError(f"{kind} has no payload field {name.split('.')[0]!r}")
    return names


def typed_kinds() -> dict[str, type[Payload]]:
    return {k: e.payload for k, e in KINDS.items() if e.payload is not None}


def untyped_kinds() -> list[str]:
    return sorted(k for k, e in KINDS.items() if e.payload is None)


# --- each kind: label, summary, failure -----------------------------------------------------
SESSION_ENDINGS = {
    "handoff": "ended with a handoff",
    "finished": "ended: the agent finished and the checks passed",
    "verification_failed": "ended: the checks failed",
    "budget": "ended: a budget ran out",
    "cancelled": "ended: the run was cancelled",
    "failed": "ended: the run failed",
    "crashed_recovered": "ended when its worker crashed (the run recovered)",
    "rewound": "was ended by a rewind",
}


@register(K.RUN_CREATED, "run created")
def _run_created(p: Obj) -> str:
    return f"goal: {short(p.get('goal'))}"


@register(K.RUN_STATUS, "status", RunStatusPayload, failed=lambda p: p.to == "failed")
def _run_status(p: RunStatusPayload) -> str:
    reason = f" ({short(p.reason)})" if p.reason else ""
    return f"{p.from_} → {p.to}{reason}"


@register(K.SESSION_STARTED, "session started", SessionStarted)
def _session_started(p: SessionStarted) -> str:
    return f"session {p.index} started"


@register(K.SESSION_ENDED, "session ended", SessionEnded)
def _session_ended(p: SessionEnded) -> str:
    return f"session {p.index} {SESSION_ENDINGS.get(p.reason, f'ended ({p.reason})')}"


@register(K.MODEL_TURN, "model turn", ModelTurn)
def _model_turn(p: ModelTurn) -> str:
    usage = p.usage or {}
    tools = p.tool_names if p.content else []
    calls = f" → {', '.join(tools)}" if tools else ""
    return (
        f"{short(p.text or '(no text)', 80)}{calls} "
        f"[{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out]"
    )


@register(K.TOOL_CALL, "tool call", ToolCall)
def _tool_call(p: ToolCall) -> str:
    args = p.input or {}
    main = args.get("command") or args.get("path") or args.get("summary") or ""
    return f"{p.name} {short(main, 80)}".rstrip()


@register(K.TOOL_RESULT, "tool result", ToolResult, failed=lambda p: bool(p.is_error))
def _tool_result(p: ToolResult) -> str:
    return f"{p.name} {'error' if p.is_error else 'ok'}: {short(p.output or '', 80)}"


@register(K.CHECK_RESULT, "check", CheckResult, failed=lambda p: p.passed is False)
def _check_result(p: CheckResult) -> str:
    state = "passed" if p.passed else f"failed (exit {p.exit_code})"
    return f"`{p.command}` {state}"


@register(K.CHECK_REGRESSED, "regression", CheckRegressed, failed=lambda p: True)
def _check_regressed(p: CheckRegressed) -> str:
    return (
        f"REGRESSION: `{p.command}` passed at #{p.passed_at_seq} and fails now "
        f"({p.at}); the run cannot succeed while it fails"
    )


@register(K.CHECK_TAMPERED, "tampering", CheckTampered, failed=lambda p: True)
def _check_tampered(p: CheckTampered) -> str:
    files = p.files or []
    changes = ", ".join(f"{f.get('path')} ({f.get('change')})" for f in files)
    return (
        f"TAMPERED: {len(files)} protected file(s) changed, the checks ran against the "
        f"originals: {short(changes, 80)}"
    )


@register(K.DRIFT_WARNING, "drift", DriftWarning)
def _drift(p: DriftWarning) -> str:
    number = (int, float)
    share = f"{p.coverage:.0%}" if isinstance(p.coverage, number) else "?"
    below = f" (below {p.threshold:.0%})" if isinstance(p.threshold, number) else ""
    which = "forced handoff (the agent's last words)" if p.forced else "handoff"
    missing = ", ".join(str(w) for w in (p.goal_words_missing or [])[:8])
    return short(
        f"drift: the {which} speaks of {share} of the goal{below}; missing: {missing}", 160
    )


@register(K.JUDGE_VERDICT, "judge", JudgeVerdict, failed=lambda p: p.passed is False)
def _judge(p: JudgeVerdict) -> str:
    criteria = [c for c in p.criteria or [] if isinstance(c, dict)]
    met = sum(1 for c in criteria if c.get("passed") is True)
    marks = "; ".join(
        f"{'✔' if c.get('passed') is True else '✘'} {c.get('criterion')}: {c.get('reason', '')}"
        for c in criteria
    )
    error = f" ({p.error})" if p.error else ""
    verdict = "accepted" if p.passed else "rejected"
    return short(f"judge {verdict}, {met} of {len(criteria)} criteria met{error}: {marks}", 160)


@register(K.HUMAN_NOTE, "note", HumanNote)
@register(K.HARNESS_MESSAGE, "harness message", HarnessMessage)
def _text(p: HumanNote | HarnessMessage) -> str:
    return short(p.text or "")


@register(K.BUDGET_WARNING, "budget warning", BudgetWarning)
def _budget_warning(p: BudgetWarning) -> str:
    return f"{p.budget}: {p.used} of {p.limit}"


@register(K.BUDGET_EXCEEDED, "budget exceeded", BudgetExceeded)
def _budget_exceeded(p: BudgetExceeded) -> str:
    return short(p.reason or "")


@register(K.ERROR, "error", ErrorPayload)
def _error(p: ErrorPayload) -> str:
    return short(p.message or "")


@register(K.APPROVAL_REQUESTED, "approval asked", ApprovalRequested)
def _approval_requested(p: ApprovalRequested) -> str:
    args = p.input or {}
    return f"{p.tool} {short(args.get('command') or args.get('path') or args, 70)} ({p.reason})"


@register(K.APPROVAL_DECIDED, "approval decided", ApprovalDecided)
def _approval_decided(p: ApprovalDecided) -> str:
    comment = f": {short(p.comment, 60)}" if p.comment else ""
    edited = " with edits" if p.edited_input else ""
    return f"approval {p.approval_id} {p.decision}{edited}{comment}"


@register(K.RUN_UPDATED, "run updated")
def _run_updated(p: Obj) -> str:
    if "rule_added" in p:
        rule = p["rule_added"] or {}
        return f"tool policy: rule added ({rule.get('action')} {rule.get('tool')})"
    if "slack" in p:
        slack = p["slack"] or {}
        return f"Slack settings changed: {', '.join(f'{k}={v!r}' for k, v in slack.items())}"
    if "wake_at" in p:
        return f"wake-up at {p['wake_at']}" if p["wake_at"] else "wake-up cancelled"
    return "tool policy changed" if "tool_policy" in p else f"budgets raised: {p.get('budgets')}"


@register(K.CHECKPOINT_CREATED, "checkpoint", CheckpointCreated)
def _checkpoint(p: CheckpointCreated) -> str:
    label_ = f": {short(p.label, 60)}" if p.label else ""
    return (
        f"checkpoint {p.shown_number} ({p.kind}){label_}, {p.files} "
        f"files, the store grew by {p.bytes_added or 0} bytes"
    )


@register(K.RUN_REWOUND, "rewound", Rewound)
def _rewound(p: Rewound) -> str:
    note = f"; note: {short(p.note, 60)}" if p.note else ""
    return (
        f"rewound to checkpoint {p.shown_number} (#{p.to_seq}): events "
        f"#{(p.to_seq or 0) + 1}-#{p.from_seq} abandoned ({p.events} "
        f"events, {p.tokens} tokens, ${p.cost_usd}){note}"
    )


@register(K.RUN_REWIND_REQUESTED, "rewind requested", RewindRequested)
def _rewind_requested(p: RewindRequested) -> str:
    note = f"; note: {short(p.note, 60)}" if p.note else ""
    return f"rewind to checkpoint {p.shown_number} (#{p.to_seq}) requested{note}"


@register(K.RUN_FORKED, "forked", Forked)
def _forked(p: Forked) -> str:
    return f"forked from checkpoint {p.shown_number} into run {p.fork_run_id}"


@register(K.ACCEPTANCE_UPDATED, "acceptance", AcceptanceUpdated)
def _acceptance(p: AcceptanceUpdated) -> str:
    changed = ", ".join(str(c) for c in p.changed or [])
    return f"acceptance {p.passing}/{p.total} passing" + (
        f" (changed: {short(changed, 80)})" if changed else ""
    )


@register(K.NOTIFICATION_FAILED, "webhook failed")
def _notification_failed(p: Obj) -> str:
    return (
        f"webhook {p.get('event')} to {p.get('url')} failed after {p.get('attempts')} "
        f"attempt(s): {short(p.get('error', ''), 80)}"
    )


MEMORY_VERBS = {K.MEMORY_SAVED: "saved", K.MEMORY_CHANGED: "changed", K.MEMORY_DELETED: "deleted"}


def _memory(verb: str) -> Callable[[Obj], str]:
    def summary_(p: Obj) -> str:
        where = f"project {p.get('project_name')!r}" if p.get("scope") == "project" else "run"
        text = f": {short(p['text'], 80)}" if "text" in p else ""
        pin = {True: " (pinned)", False: " (unpinned)"}.get(p.get("pinned"), "")
        shared = " (and for the project)" if p.get("project") else ""
        return f"{where} memory {verb} {p.get('key')}{pin}{shared}{text}"

    return summary_


for _kind, _verb in MEMORY_VERBS.items():
    register(_kind, f"memory {_verb}")(_memory(_verb))


@register(K.ARTIFACT_SAVED, "artifact", ArtifactSaved)
def _artifact(p: ArtifactSaved) -> str:
    return f"{p.name} ({p.kind}, {p.size} bytes)"


@register(K.WORKSPACE_RESTORED, "workspace restored")
def _workspace_restored(p: Obj) -> str:
    at = f"checkpoint {p['checkpoint']}" if p.get("checkpoint") else "its last committed state"
    return (
        f"workspace restored on {p.get('host')} from {at}: {p.get('files')} files, "
        f"{p.get('bytes')} bytes, {p.get('written')} written, in {p.get('milliseconds')} ms"
    )


@register(K.RUN_ISOLATION, "isolation")
@register(K.NETWORK_CONNECTION, "network")
def _plain(p: Obj) -> str:
    return short(p)


# Fleets (agents/fleets/spawn.py, agents/fleets/parent.py, agents/fleets/cascade.py).
@register(K.FLEET_SPAWNED, "children spawned")
def _fleet_spawned(p: Obj) -> str:
    ids = ", ".join(str(c.get("run_id")) for c in p.get("children") or [])
    return f"spawned child runs {ids} (wait {p.get('wait', 'all')})"


@register(K.FLEET_CHILD_ENDED, "child ended")
def _fleet_child_ended(p: Obj) -> str:
    return f"child run {p.get('run_id')} {p.get('status')}"


@register(K.FLEET_WOKE, "woke")
def _fleet_woke(p: Obj) -> str:
    return f"woke: {short(p.get('reason', ''), 80)}"


@register(K.FLEET_MERGE, "merge")
def _fleet_merge(p: Obj) -> str:
    files = ", ".join(p.get("conflicts") or []) if p.get("result") == "conflict" else ""
    return short(
        f"merge of child run {p.get('run_id')}: {p.get('result')}"
        + (f" in {files}" if files else f", {len(p.get('files') or [])} file(s)"),
        120,
    )


@register(K.FLEET_CASCADE, "fleet cascade")
def _fleet_cascade(p: Obj) -> str:
    return f"{p.get('action')} with its parent: {short(p.get('cause', ''), 80)}"
