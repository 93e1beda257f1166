"""A run as an OpenTelemetry trace, built from its event log and sent to a collector.

The log is the truth, so the trace is built from it after the fact, with each span's times taken
from the events (`created_at`): one root span per run (`invoke_agent`), a span per session, and in
each session its model turns (`chat`), tool calls (`execute_tool`), approvals and checks. The
attributes follow the GenAI semantic conventions (`gen_ai.*`) where they say something, ours
(`shiftlog.*`) elsewhere; every span names the agent (`gen_ai.agent.name`: an external run's own
agent, else "shiftlog"). By default no model text and no tool output goes in: sizes, and previews
of at most `PREVIEW_CHARS`; with SHIFTLOG_OTEL_CONTENT=1 the content goes in, cut and redacted
(agents/trace_content.py).

Ids are derived from the run and the events' seqs, so every build makes the same trace. With
OTEL_EXPORTER_OTLP_ENDPOINT set, `trace_parts.export_later` queues `export_due` at each
session's end and at the run's (agents/runtime/sessions.py, agents/rewinds, agents/lifecycle.py):
each session is sent once it ended, the run's own span once the run ended, all in one trace,
each part once (agents/trace_parts.py). `manage.py export_trace` sends a whole run on demand.
A collector that is down costs a warning in the log, never the run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from agents import eventlog, events, trace_parts
from agents import trace_content as content
from agents.branches import in_ranges
from agents.models import Event, EventKind, ExternalDriver, Run, RunStatus, Session

log = logging.getLogger(__name__)

PREVIEW_CHARS = 200
# Spans per export request (the SDK's batch processor sends at most this many at once too).
BATCH_SIZE = 512
TRACES_PATH = "v1/traces"
SERVICE_NAME = "shiftlog"
# Events that become span events (on their session's span, or the run's) rather than spans.
MARKS = frozenset(
    {
        EventKind.RUN_STATUS,
        EventKind.RUN_REWOUND,
        EventKind.RUN_FORKED,
        EventKind.BUDGET_WARNING,
        EventKind.BUDGET_EXCEEDED,
        EventKind.CHECK_REGRESSED,
        EventKind.CHECK_TAMPERED,
        EventKind.DRIFT_WARNING,
        EventKind.CHECKPOINT_CREATED,
    }
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (as OTEL_EXPORTER_OTLP_ENDPOINT
    names it); a URL already ending in /v1/traces is taken as it is."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/" + TRACES_PATH) else f"{endpoint}/{TRACES_PATH}"


def otlp_exporter(endpoint: str | None = None) -> SpanExporter:
    """The official OTLP/HTTP (protobuf) exporter, for `endpoint` or the configured collector.
    It reads OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION and the certificates itself,
    and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when no endpoint is given here; it retries a
    collector that is down with backoff, within its timeout (10 s unless configured)."""
    # Deferred: it brings requests and protobuf (a tenth of a second), needed only to send.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    if endpoint is None and os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return OTLPSpanExporter()
    return OTLPSpanExporter(endpoint=traces_url(endpoint or settings.SHIFTLOG["OTEL_ENDPOINT"]))


def export(
    run_id: int, exporter: SpanExporter | None = None, *, with_content: bool | None = None
) -> int | None:
    """Build run `run_id`'s whole trace and send it through `exporter` (the configured
    collector's by default), whatever was sent before (`export_trace` on demand). The number of
    spans sent, or None when the collector did not take them: logged as a warning, never
    raised, so whoever asked goes on."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        log.warning("the trace of run %s was not exported: there is no such run", run_id)
        return None
    spans = build(run, with_content=with_content)
    return len(spans) if _send(run_id, spans, exporter) else None


def export_due(run_id: int, exporter: SpanExporter | None = None) -> int | None:
    """Send the parts of run `run_id`'s trace that are ready and not sent yet: each session
    that has ended (its span and everything under it), and, once the run has ended, the run's
    own span and the rest. All go in the run's one trace (the same trace id), so a collector
    shows it growing session by session. Each part is claimed (a TraceExport row) before it is
    sent, so a retried task, a second worker or a session's end processed again sends nothing
    twice. The number of spans sent (0: nothing was due), or None when the collector did not
    take them: the claims are given up, so the next export sends those parts."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        log.warning("the trace of run %s was not exported: there is no such run", run_id)
        return None
    spans, t = _build(run)
    by_part = trace_parts.parts(spans, t.session_spans)
    due = [pk for pk in by_part if pk is not None and (pk in t.ended or not run.is_live)]
    if not run.is_live:
        due.append(None)
    claimed = [pk for pk in due if trace_parts.claim(run.pk, pk)]
    if not claimed:
        return 0
    sending = [span for pk in claimed for span in by_part.get(pk, [])]
    if not _send(run_id, sending, exporter):
        trace_parts.give_up(run.pk, claimed)
        return None
    trace_parts.sent(run.pk, {pk: len(by_part.get(pk, [])) for pk in claimed})
    return len(sending)


def _send(run_id: int, spans: list[ReadableSpan], exporter: SpanExporter | None) -> bool:
    own = exporter is None
    if own:
        exporter = otlp_exporter()
    try:
        for start in range(0, len(spans), BATCH_SIZE):
            result = exporter.export(spans[start : start + BATCH_SIZE])
            if result is not SpanExportResult.SUCCESS:
                log.warning(
                    "the trace of run %s was not exported: the collector refused it or could "
                    "not be reached",
                    run_id,
                )
                return False
    except Exception:
        log.warning("the trace of run %s was not exported", run_id, exc_info=True)
        return False
    finally:
        if own:
            exporter.shutdown()
    return True


# --- ids ------------------------------------------------------------------------------------
def _digest(*parts: object) -> bytes:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()


def trace_id_of(run: Run) -> int:
    """The run's trace id: the same at every export, and (with the run's creation time in it)
    not the same as another installation's run of the same number."""
    return int.from_bytes(_digest("shiftlog", run.pk, run.created_at.isoformat())[:16]) or 1


class _Ids(IdGenerator):
    """Hands the SDK the ids we chose: the run's trace id, and the span id set before each
    span is started."""

    def __init__(self, trace_id: int) -> None:
        self.trace_id = trace_id
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


class _Collect(SpanProcessor):
    """Keeps the ended spans, to be exported together once the trace is built."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


# --- building -------------------------------------------------------------------------------
def ns(when: datetime) -> int:
    """Nanoseconds since the epoch, exactly (no float rounding)."""
    return (when - EPOCH) // timedelta(microseconds=1) * 1000


def preview(value: Any) -> str:
    """A short preview, with the secrets the log knows of redacted (one configured since the
    event was logged too)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    text = eventlog.redact(text)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def gen_ai(run: Run, operation: str) -> dict[str, str]:
    """The GenAI operation and provider (gen_ai.system: the older name, still widely read)."""
    provider = str(run.provider)
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
    }


def agent_name(run: Run) -> str:
    """Who the agent is: an external run's own agent (the id it gave, agents/runtime/
    external_driver.py), else Shiftlog, whose runtime drives the run."""
    if run.is_external:
        agent = ExternalDriver.objects.filter(run_id=run.pk).values_list("agent", flat=True)
        return agent.first() or "external"
    return SERVICE_NAME


def run_attributes(run: Run, *, sessions: int) -> dict[str, Any]:
    usage = {
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cache_read_input_tokens": run.cache_read_tokens,
        "cache_creation_input_tokens": run.cache_write_tokens,
    }
    return {
        **gen_ai(run, "invoke_agent"),
        **usage_attributes(usage),
        "gen_ai.agent.id": str(run.pk),
        "gen_ai.request.model": run.model,
        "shiftlog.run.goal": preview(run.goal),
        "shiftlog.run.status": run.status,
        "shiftlog.run.turns": run.turns,
        "shiftlog.run.cost_usd": str(run.cost_usd),
        "shiftlog.run.sessions": sessions,
        "shiftlog.run.forked_from_checkpoint": run.forked_from_id,
    }


def usage_attributes(usage: dict[str, Any]) -> dict[str, int]:
    """GenAI usage attributes of a model.turn's usage. The conventions count cached input in
    gen_ai.usage.input_tokens (the Anthropic API counts it apart): the sum, and each part."""
    cached = int(usage.get("cache_read_input_tokens") or 0)
    created = int(usage.get("cache_creation_input_tokens") or 0)
    return {
        "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0) + cached + created,
        "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
        "gen_ai.usage.cache_read.input_tokens": cached,
        "gen_ai.usage.cache_creation.input_tokens": created,
    }


def check_attributes(p: events.CheckResult) -> dict[str, Any]:
    return {
        "shiftlog.check.command": preview(str(p.command or "")),
        "shiftlog.check.passed": bool(p.passed),
        "shiftlog.check.exit_code": p.exit_code,
        "shiftlog.check.timed_out": bool(p.timed_out),
        "shiftlog.check.required": p.required,
        "shiftlog.check.at": p.at or None,
        "shiftlog.check.output_chars": len(str(p.output or "")),
        "shiftlog.duration_ms": p.duration_ms,
    }


def scalars(payload: dict[str, Any], limit: int = 12) -> dict[str, Any]:
    """A payload's plain values as `shiftlog.*` attributes (strings as previews)."""
    found: dict[str, Any] = {}
    for key, value in list(payload.items())[:limit]:
        if isinstance(value, bool | int | float):
            found[f"shiftlog.{key}"] = value
        elif isinstance(value, str):
            found[f"shiftlog.{key}"] = preview(value)
    return found


@dataclass
class _Row:
    seq: int
    kind: str
    session_id: int | None
    actor: str
    payload: dict[str, Any]
    at: int  # ns

    @property
    def raw(self) -> dict[str, Any]:
        return self.payload if isinstance(self.payload, dict) else {}

    @functools.cached_property
    def p(self) -> Any:
        """The payload as its kind's type (agents/events.py)."""
        return events.read(self.kind, self.raw)

    @property
    def failed(self) -> bool:
        return events.failed(self.kind, self.raw)


@dataclass
class _Open:
    span: Span
    session_id: int | None
    seq: int


@dataclass
class _Trace:
    """The spans of one run, built event by event in seq order."""

    run: Run
    tracer: trace_api.Tracer
    ids: _Ids
    ranges: list[tuple[int, int]]
    sessions: dict[int, _Open] = field(default_factory=dict)
    session_index: dict[int, int] = field(default_factory=dict)
    tools: dict[str, _Open] = field(default_factory=dict)
    asked_at: dict[str, int] = field(default_factory=dict)  # tool_use_id -> its turn's time
    approvals: dict[int, _Open] = field(default_factory=dict)
    approval_contexts: dict[int, SpanContext] = field(default_factory=dict)
    checks: list[tuple[_Row, Span | None]] = field(default_factory=list)
    previous_at: int = 0
    root: Span | None = None
    agent: str = SERVICE_NAME
    session_spans: dict[int, int] = field(default_factory=dict)  # span id -> session pk
    ended: set[int] = field(default_factory=set)  # sessions whose end is in the log
    given: dict[int | None, list[dict]] = field(default_factory=dict)  # content: model's input
    with_content: bool = False

    # -- spans --
    def start(
        self,
        name: str,
        key: object,
        at: int,
        *,
        parent: Span | None,
        attributes: dict[str, Any],
        links: list[Link] | None = None,
        seq: int | None = None,
    ) -> Span:
        self.ids.span_id = int.from_bytes(_digest(self.ids.trace_id, key)[:8]) or 1
        context = trace_api.set_span_in_context(parent) if parent is not None else None
        attrs = {
            "gen_ai.conversation.id": str(self.run.pk),
            "gen_ai.agent.name": self.agent,
            "shiftlog.run.id": self.run.pk,
        }
        if seq is not None:
            attrs["shiftlog.seq"] = seq
            if in_ranges(seq, self.ranges):
                attrs["shiftlog.abandoned"] = True
        attrs.update({k: v for k, v in attributes.items() if v is not None})
        return self.tracer.start_span(
            name, context=context, start_time=at, attributes=attrs, links=links or ()
        )

    def parent_of(self, row: _Row) -> Span | None:
        opened = self.sessions.get(row.session_id) if row.session_id else None
        return opened.span if opened else self.root

    def session_attrs(self, row: _Row) -> dict[str, Any]:
        index = self.session_index.get(row.session_id) if row.session_id else None
        return {"shiftlog.session.index": index}

    # -- the run --
    def begin(self, first_at: int) -> None:
        run = self.run
        self.root = self.start(
            f"invoke_agent run {run.pk}",
            "run",
            min(ns(run.created_at), first_at) if first_at else ns(run.created_at),
            parent=None,
            attributes=run_attributes(run, sessions=len(self.session_index)),
        )

    def finish(self, last_at: int) -> None:
        run = self.run
        end = max(ns(run.finished_at) if run.finished_at else last_at, last_at)
        self.flush_checks()
        for opened in [*self.tools.values(), *self.approvals.values(), *self.sessions.values()]:
            opened.span.set_attribute("shiftlog.unfinished", True)
            opened.span.end(end_time=end)
        if run.status == RunStatus.FAILED:
            self.root.set_status(Status(StatusCode.ERROR, preview(run.status_reason or "failed")))
        self.root.end(end_time=end)

    # -- events --
    def add(self, row: _Row) -> None:
        if row.kind != EventKind.CHECK_RESULT:
            self.flush_checks()
        handler = getattr(self, "on_" + row.kind.replace(".", "_"), None)
        if handler is not None:
            handler(row)
        elif row.kind in MARKS:
            self.mark(row)
        self.previous_at = row.at

    def mark(self, row: _Row) -> None:
        attributes = {"shiftlog.seq": row.seq, **scalars(row.raw)}
        if in_ranges(row.seq, self.ranges):
            attributes["shiftlog.abandoned"] = True
        self.parent_of(row).add_event(row.kind, attributes, timestamp=row.at)

    def on_error(self, row: _Row) -> None:
        self.parent_of(row).add_event(
            "exception",
            {
                "exception.type": str(row.p.error or "error"),
                "exception.message": preview(row.p.message or ""),
                "shiftlog.source": str(row.p.source or ""),
                "shiftlog.seq": row.seq,
            },
            timestamp=row.at,
        )

    def on_session_started(self, row: _Row) -> None:
        index = row.p.index
        self.session_index[row.session_id] = index
        span = self.start(
            f"session {index}",
            row.seq,
            row.at,
            parent=self.root,
            attributes={"shiftlog.session.index": index, "gen_ai.request.model": self.run.model},
            seq=row.seq,
        )
        self.sessions[row.session_id] = _Open(span, row.session_id, row.seq)
        self.session_spans[span.get_span_context().span_id] = row.session_id
        if row.p.first_message:
            self.give(row, content.text_message("user", row.p.first_message))

    # -- what the model is given (content only) --
    def give(self, row: _Row, message: dict[str, Any]) -> None:
        if self.with_content:
            self.given.setdefault(row.session_id, []).append(message)

    def on_human_note(self, row: _Row) -> None:
        self.give(row, content.text_message("user", str(row.p.text or "")))

    def on_harness_message(self, row: _Row) -> None:
        self.give(row, content.text_message("user", str(row.p.text or "")))

    def on_session_ended(self, row: _Row) -> None:
        opened = self.sessions.pop(row.session_id, None)
        if opened is None:
            return
        self.ended.add(row.session_id)
        reason = str(row.p.reason or "")
        opened.span.set_attribute("shiftlog.session.end_reason", reason)
        if reason == "failed":
            opened.span.set_status(Status(StatusCode.ERROR, "the session failed"))
        opened.span.end(end_time=row.at)

    def on_model_turn(self, row: _Row) -> None:
        p = row.p
        usage = p.usage or {}
        latency = p.latency_ms
        start = row.at - int(latency * 1_000_000) if latency else self.previous_at or row.at
        blocks = p.content or []
        tool_uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        for block in tool_uses:
            self.asked_at[str(block.get("id"))] = row.at
        model = p.model or self.run.model
        span = self.start(
            f"chat {model}",
            row.seq,
            start,
            parent=self.parent_of(row),
            attributes={
                **gen_ai(self.run, "chat"),
                **self.session_attrs(row),
                **usage_attributes(usage),
                "gen_ai.request.model": self.run.model,
                "gen_ai.response.model": model,
                "gen_ai.response.finish_reasons": [str(p.stop_reason or "")],
                "shiftlog.cost_usd": str(p.cost_usd or "0"),
                "shiftlog.turn.text_chars": len(p.text or ""),
                "shiftlog.turn.tool_calls": len(tool_uses),
                "shiftlog.latency_ms": latency,
                **content.turn_attributes(
                    self.with_content, self.given.pop(row.session_id, []), blocks, p.stop_reason
                ),
            },
            seq=row.seq,
        )
        span.end(end_time=row.at)

    def _tool_span(self, row: _Row, start: int, tool_input: Any = None) -> Span:
        p = row.p
        tool_use_id = str(p.tool_use_id or "")
        name = str(p.name or "")
        approval_id = getattr(p, "approval_id", None)  # a call's; a result has none
        context = self.approval_contexts.get(approval_id) if approval_id else None
        return self.start(
            f"execute_tool {name}",
            row.seq,
            start,
            parent=self.parent_of(row),
            attributes={
                **gen_ai(self.run, "execute_tool"),
                **self.session_attrs(row),
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": tool_use_id,
                "gen_ai.tool.type": "function",
                "shiftlog.tool.input_preview": None if tool_input is None else preview(tool_input),
                "shiftlog.approval.id": approval_id,
            },
            links=[Link(context)] if context else None,
            seq=row.seq,
        )

    def on_tool_call(self, row: _Row) -> None:
        span = self._tool_span(row, row.at, row.p.input)
        span.set_attributes(content.tool_arguments(self.with_content, row.p.input))
        tool_use_id = str(row.p.tool_use_id or "")
        self.tools[tool_use_id] = _Open(span, row.session_id, row.seq)

    def on_tool_result(self, row: _Row) -> None:
        p = row.p
        tool_use_id = str(p.tool_use_id or "")
        opened = self.tools.pop(tool_use_id, None)
        if opened is None:  # never called: denied, or refused before it ran
            span = self._tool_span(row, self.asked_at.get(tool_use_id, row.at))
            span.set_attribute("shiftlog.tool.ran", False)
        else:
            span = opened.span
        output = p.output if isinstance(p.output, str) else ""
        data = p.data if isinstance(p.data, dict) else {}
        span.set_attribute("shiftlog.result_seq", row.seq)
        span.set_attributes(content.tool_result(self.with_content, p.output))
        self.give(row, content.tool_response(tool_use_id, p.output))
        span.set_attribute("shiftlog.tool.output_chars", len(output))
        span.set_attribute("shiftlog.tool.is_error", row.failed)
        if isinstance(data.get("exit_code"), int):
            span.set_attribute("shiftlog.tool.exit_code", data["exit_code"])
        if row.failed:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, preview(output)))
        span.end(end_time=row.at)

    def on_approval_requested(self, row: _Row) -> None:
        p = row.p
        approval_id = p.approval_id
        if approval_id in self.approvals:
            return  # asked again (after a worker died): the first request's span goes on
        span = self.start(
            f"approval {p.tool or ''}".strip(),
            row.seq,
            row.at,
            parent=self.parent_of(row),
            attributes={
                **self.session_attrs(row),
                "gen_ai.tool.name": p.tool,
                "gen_ai.tool.call.id": p.tool_use_id,
                "shiftlog.approval.id": approval_id,
                "shiftlog.approval.reason": preview(p.reason or ""),
                "shiftlog.tool.input_preview": preview(p.input),
            },
            seq=row.seq,
        )
        self.approvals[approval_id] = _Open(span, row.session_id, row.seq)
        self.approval_contexts[approval_id] = span.get_span_context()

    def on_approval_decided(self, row: _Row) -> None:
        opened = self.approvals.pop(row.p.approval_id, None)
        if opened is None:
            return
        span = opened.span
        span.set_attribute("shiftlog.approval.status", str(row.p.decision or ""))
        span.set_attribute("shiftlog.approval.decided_by", row.actor)
        span.set_attribute("shiftlog.approval.edited", row.p.edited_input is not None)
        span.set_attribute("shiftlog.approval.comment", preview(row.p.comment or ""))
        span.set_attribute("shiftlog.result_seq", row.seq)
        span.end(end_time=row.at)

    def on_check_result(self, row: _Row) -> None:
        # The checks of one verification are appended together once all have run: their spans
        # are laid end to end, backwards from when they were recorded (flush_checks).
        self.checks.append((row, self._enclosing_tool(row)))

    def _enclosing_tool(self, row: _Row) -> Span | None:
        """The session's call that is running (finish, handoff): what the checks ran for."""
        calls = [o for o in self.tools.values() if o.session_id == row.session_id]
        return max(calls, key=lambda o: o.seq).span if calls else None

    def flush_checks(self) -> None:
        end = None
        for row, tool in reversed(self.checks):
            p = row.p
            end = row.at if end is None else min(end, row.at)
            start = end - int(float(p.duration_ms or 0) * 1_000_000)
            span = self.start(
                f"check {preview(str(p.command or ''))[:80]}",
                row.seq,
                start,
                parent=tool or self.parent_of(row),
                attributes={**self.session_attrs(row), **check_attributes(p)},
                seq=row.seq,
            )
            if not p.passed:
                state = "timed out" if p.timed_out else f"exit code {p.exit_code}"
                span.set_attribute("error.type", "check_failed")
                span.set_status(Status(StatusCode.ERROR, f"check failed ({state})"))
            span.end(end_time=end)
            end = start
        self.checks = []

    def on_judge_verdict(self, row: _Row) -> None:
        p = row.p
        usage = p.usage or {}
        model = p.model or self.run.judge_model or self.run.model
        span = self.start(
            "judge",
            row.seq,
            self.previous_at or row.at,
            parent=self._enclosing_tool(row) or self.parent_of(row),
            attributes={
                **gen_ai(self.run, "chat"),
                **self.session_attrs(row),
                "gen_ai.request.model": model,
                "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0),
                "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
                "shiftlog.judge.passed": bool(p.passed),
                "shiftlog.cost_usd": str(p.cost_usd or "0"),
            },
            seq=row.seq,
        )
        if p.error:
            span.set_status(Status(StatusCode.ERROR, preview(p.error)))
        span.end(end_time=row.at)


def build(run: Run, *, with_content: bool | None = None) -> list[ReadableSpan]:
    """Run `run`'s trace, from its log: the finished spans, ready for any exporter. With
    content when asked for (`with_content`, else SHIFTLOG_OTEL_CONTENT)."""
    return _build(run, with_content)[0]


def _build(run: Run, with_content: bool | None = None) -> tuple[list[ReadableSpan], _Trace]:
    ids = _Ids(trace_id_of(run))
    collect = _Collect()
    # Our own provider, never the global one; one per export, so no shutdown at exit either.
    provider = TracerProvider(
        resource=Resource.create({"service.name": SERVICE_NAME}),
        id_generator=ids,
        shutdown_on_exit=False,
    )
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("shiftlog.telemetry")
    t = _Trace(run, tracer, ids, Event.objects.abandoned_ranges(run.pk), agent=agent_name(run))
    t.with_content = content.enabled() if with_content is None else with_content
    t.session_index = dict(Session.objects.filter(run=run).values_list("pk", "index"))
    rows = (
        Event.objects.filter(run=run)
        .order_by("seq")
        .values_list("seq", "kind", "session_id", "actor", "payload", "created_at")
    )
    first = Event.objects.filter(run=run).order_by("seq").values_list("created_at", flat=True)
    first_at = first.first()
    t.begin(ns(first_at) if first_at else 0)
    last_at = ns(first_at) if first_at else ns(run.created_at)
    for seq, kind, session_id, actor, payload, created_at in rows.iterator(chunk_size=500):
        row = _Row(seq, kind, session_id, actor, payload, ns(created_at))
        t.add(row)
        last_at = max(last_at, row.at)
    t.finish(last_at)
    provider.shutdown()
    return collect.spans, t
