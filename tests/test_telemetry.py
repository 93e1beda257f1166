"""Runs as OpenTelemetry traces (agents/telemetry.py): built from real runs' event logs and
exported through the SDK to an in-memory exporter, and once over real OTLP/HTTP to a local
collector stand-in."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agents import lifecycle, rewinds, services, telemetry, trace_parts
from agents.branches import in_ranges
from agents.models import Event, EventKind, RunStatus
from tests.helpers import (
    approve_pending,
    call,
    demo_to_success,
    drive_until_idle,
    finish_turn,
    make_run,
    run_queued,
)

pytestmark = pytest.mark.django_db


def exported(run) -> list:
    mem = InMemorySpanExporter()
    assert telemetry.export(run.pk, mem) == len(mem.get_finished_spans())
    return list(mem.get_finished_spans())


def named(spans, operation: str) -> list:
    return [s for s in spans if s.attributes.get("gen_ai.operation.name") == operation]


def starting_with(spans, prefix: str) -> list:
    return [s for s in spans if s.name.startswith(prefix)]


def payloads(run, kind: str) -> list[dict]:
    return list(
        Event.objects.filter(run=run, kind=kind).order_by("seq").values_list("payload", flat=True)
    )


@pytest.fixture
def memory_collector(monkeypatch):
    """The configured collector, swapped for an in-memory exporter."""
    mem = InMemorySpanExporter()
    monkeypatch.setattr(telemetry, "otlp_exporter", lambda endpoint=None: mem)
    return mem


@pytest.fixture
def collector():
    """A collector stand-in over real HTTP: it keeps every POST it receives."""
    received: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "type": self.headers["Content-Type"], "body": body})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.received = received
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def a_closed_port() -> str:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}"


# --- the trace of a run -----------------------------------------------------------------------
def test_a_finished_run_is_one_trace_of_sessions_turns_tools_approvals_and_checks(decider):
    run = demo_to_success(decider)
    spans = exported(run)
    by_id = {s.context.span_id: s for s in spans}
    assert len(by_id) == len(spans)  # no span id twice
    assert {s.context.trace_id for s in spans} == {spans[0].context.trace_id}

    # One root, the run; sessions under it; everything else under a session (checks under
    # the finish call that ran them, or under the session at a handoff).
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == f"invoke_agent run {run.pk}"
    assert root.resource.attributes["service.name"] == "shiftlog"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == str(run.pk)
    assert root.attributes["shiftlog.run.status"] == "succeeded"
    assert root.status.status_code == StatusCode.UNSET
    sessions = sorted(starting_with(spans, "session "), key=lambda s: s.start_time)
    assert [s.name for s in sessions] == ["session 1", "session 2"]
    assert {s.parent.span_id for s in sessions} == {root.context.span_id}
    assert [s.attributes["shiftlog.session.end_reason"] for s in sessions] == [
        "handoff",
        "finished",
    ]
    assert sessions[0].end_time <= sessions[1].start_time
    session_ids = {s.context.span_id for s in sessions}
    for span in spans:
        if span is root or span in sessions:
            continue
        parent = by_id[span.parent.span_id]
        assert parent.context.span_id in session_ids or (
            span.name.startswith("check ") and parent.name == "execute_tool finish"
        ), (span.name, parent.name)

    # Times: every span ends after it starts, inside its parent, and the root spans the run.
    for span in spans:
        assert span.start_time <= span.end_time, span.name
        if span.parent is not None:
            parent = by_id[span.parent.span_id]
            assert parent.start_time <= span.start_time, (span.name, parent.name)
            assert span.end_time <= parent.end_time, (span.name, parent.name)
    assert root.start_time <= telemetry.ns(run.created_at)
    last = run.events.order_by("-seq").first()
    assert root.end_time == telemetry.ns(last.created_at) >= telemetry.ns(run.finished_at)

    # Model turns: one chat span per turn, their tokens the run's counters.
    chats = named(spans, "chat")
    assert len(chats) == run.turns
    for chat in chats:
        assert chat.name == f"chat {run.model}"
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        assert chat.attributes["gen_ai.system"] == "scripted"
        assert chat.attributes["gen_ai.request.model"] == run.model
        assert chat.end_time - chat.start_time > 0  # the turn's latency
    inputs = run.input_tokens + run.cache_read_tokens + run.cache_write_tokens
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == inputs > 0
    assert sum(c.attributes["gen_ai.usage.output_tokens"] for c in chats) == run.output_tokens
    assert root.attributes["gen_ai.usage.input_tokens"] == inputs
    assert root.attributes["gen_ai.usage.output_tokens"] == run.output_tokens

    # Tool calls: a span per call, matched by its id, in error when its result was.
    results = payloads(run, EventKind.TOOL_RESULT)
    tools = named(spans, "execute_tool")
    assert sorted(t.attributes["gen_ai.tool.call.id"] for t in tools) == sorted(
        r["tool_use_id"] for r in results
    )
    errored = {r["tool_use_id"] for r in results if r["is_error"]}
    assert errored  # the demo's failing tests and its refused first finish
    for tool in tools:
        call_id = tool.attributes["gen_ai.tool.call.id"]
        assert tool.name == f"execute_tool {tool.attributes['gen_ai.tool.name']}"
        wanted = StatusCode.ERROR if call_id in errored else StatusCode.UNSET
        assert tool.status.status_code == wanted, tool.name

    # The approval the run waited for: its span, decided by the person, linked from the call.
    (approval,) = starting_with(spans, "approval ")
    (asked,) = payloads(run, EventKind.APPROVAL_REQUESTED)
    assert approval.name == f"approval {asked['tool']}"
    assert approval.attributes["shiftlog.approval.id"] == asked["approval_id"]
    assert approval.attributes["shiftlog.approval.status"] == "approved"
    assert approval.attributes["shiftlog.approval.decided_by"] == "user:dana"
    (approved_call,) = [
        t for t in tools if t.attributes["gen_ai.tool.call.id"] == asked["tool_use_id"]
    ]
    assert [link.context.span_id for link in approved_call.links] == [approval.context.span_id]
    assert approved_call.start_time >= approval.end_time

    # Checks: a span each, failed ones in error, laid end to end with their durations.
    checks = starting_with(spans, "check ")
    recorded = payloads(run, EventKind.CHECK_RESULT)
    assert len(checks) == len(recorded) and any(not r["passed"] for r in recorded)
    for check in checks:
        assert check.attributes["shiftlog.check.command"] == "python3 -m unittest -q"
        passed = check.attributes["shiftlog.check.passed"]
        assert check.status.status_code == (StatusCode.UNSET if passed else StatusCode.ERROR)
        duration_ms = (check.end_time - check.start_time) / 1e6
        assert duration_ms == pytest.approx(check.attributes["shiftlog.duration_ms"], abs=0.01)


def test_the_trace_holds_no_model_text_and_no_tool_output_only_sizes_and_short_previews(
    decider,
):
    run = demo_to_success(decider)
    spans = exported(run)
    texts = [p["text"] for p in payloads(run, EventKind.MODEL_TURN) if p["text"]]
    outputs = [p["output"] for p in payloads(run, EventKind.TOOL_RESULT) if len(p["output"]) > 200]
    assert texts and outputs
    values = []
    for span in spans:
        values += [v for v in span.attributes.values() if isinstance(v, str)]
        values += [v for e in span.events for v in e.attributes.values() if isinstance(v, str)]
        values.append(span.status.description or "")
    assert max(len(v) for v in values) <= telemetry.PREVIEW_CHARS
    assert not any(text in value for text in texts for value in values)
    bash = [s for s in named(spans, "execute_tool") if s.attributes["gen_ai.tool.name"] == "bash"]
    assert all(s.attributes["shiftlog.tool.output_chars"] > 0 for s in bash)


def test_exporting_a_run_again_makes_the_same_trace(decider):
    run = demo_to_success(decider)
    first, again = exported(run), exported(run)
    assert [(s.context.trace_id, s.context.span_id, s.name) for s in first] == [
        (s.context.trace_id, s.context.span_id, s.name) for s in again
    ]
    other = exported(drive_until_idle(make_run(turns=[finish_turn()])))
    assert other[0].context.trace_id != first[0].context.trace_id


def test_a_rewound_runs_abandoned_branch_is_marked(
    decider, settings, memory_collector, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": "http://collector:4318"}
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(services.create_demo_run())
        target = run.checkpoints.get(kind="session_end")
        rewinds.rewind(run.pk, target.pk, actor="user:dana")
        run = drive_until_idle(run)
        approve_pending(run, decider)
        run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    run_queued("export_trace")
    # Sent as sessions ended (the rewound one too) and the run ended: each span once, all of it.
    sent = memory_collector.get_finished_spans()
    assert sorted(s.context.span_id for s in sent) == sorted(
        s.context.span_id for s in exported(run)
    )
    assert run.trace_exports.filter(sent=True).count() == 4  # three sessions and the run
    ranges = Event.objects.abandoned_ranges(run.pk)
    spans = exported(run)
    sessions = {s.attributes["shiftlog.session.index"]: s for s in starting_with(spans, "session ")}
    assert sessions[2].attributes.get("shiftlog.abandoned") is True
    assert sessions[2].attributes["shiftlog.session.end_reason"] == "rewound"
    assert "shiftlog.abandoned" not in sessions[1].attributes
    assert "shiftlog.abandoned" not in sessions[3].attributes
    for span in spans:
        if "shiftlog.seq" in span.attributes:
            abandoned = in_ranges(span.attributes["shiftlog.seq"], ranges)
            assert span.attributes.get("shiftlog.abandoned", False) is abandoned, span.name
    # The approval the rewind left behind was discarded; the one on the live branch, approved.
    approvals = starting_with(spans, "approval ")
    assert sorted(a.attributes["shiftlog.approval.status"] for a in approvals) == [
        "approved",
        "discarded",
    ]
    (root,) = [s for s in spans if s.parent is None]
    assert [e.name for e in root.events].count("run.rewound") == 1


def test_a_denied_call_and_a_failed_run_are_errors_in_the_trace(db):
    run = drive_until_idle(
        make_run(
            turns=[
                {"text": "Cleaning up.", "tool_calls": [call("bash", command="rm -rf build")]},
                finish_turn(),
            ],
            tool_policy=[{"tool": "bash", "pattern": "rm -rf", "action": "deny"}],
            checks=["false"],
            max_turns_per_session=3,
        )
    )
    if run.status != RunStatus.FAILED:
        run = lifecycle.transition(run.pk, RunStatus.FAILED, actor="test", reason="gave up")
    spans = exported(run)
    (denied,) = [
        s for s in named(spans, "execute_tool") if s.attributes["gen_ai.tool.name"] == "bash"
    ]
    assert denied.attributes["shiftlog.tool.ran"] is False
    assert denied.status.status_code == StatusCode.ERROR
    assert denied.status.description.startswith("Denied by the tool policy")
    (root,) = [s for s in spans if s.parent is None]
    assert root.status.status_code == StatusCode.ERROR
    assert root.attributes["shiftlog.run.status"] == "failed"


# --- when runs are exported -------------------------------------------------------------------
def test_a_run_reaching_its_end_is_exported_once_when_a_collector_is_set(
    settings, memory_collector, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": "http://collector:4318"}
    run = make_run(turns=[finish_turn()])
    run_queued("export_trace")  # nothing else queued: empty the queue of the creation's slice
    with django_capture_on_commit_callbacks(execute=True):
        services.pause_run(run.pk, actor="user:dana")
    assert run_queued("export_trace") == []  # paused is not the end
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_run(run.pk, actor="user:dana")
    assert len(run_queued("export_trace")) == 1
    spans = memory_collector.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes["shiftlog.run.id"] == run.pk
    assert root.attributes["shiftlog.run.status"] == "cancelled"


def test_a_driven_run_is_exported_when_it_succeeds(
    settings, memory_collector, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": "http://collector:4318"}
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert run.status == RunStatus.SUCCEEDED
    # Queued at the session's end and at the run's: the first sends all, the second nothing.
    assert len(run_queued("export_trace")) == 2
    spans = memory_collector.get_finished_spans()
    assert len({s.context.span_id for s in spans}) == len(spans) == len(exported(run))
    assert [s.name for s in spans][-1] == f"invoke_agent run {run.pk}"


def test_without_a_collector_nothing_is_queued(
    settings, memory_collector, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": ""}
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert run.status == RunStatus.SUCCEEDED
    assert run_queued("export_trace") == []
    assert memory_collector.get_finished_spans() == ()


def test_a_collector_that_is_down_costs_a_warning_not_the_task(
    settings, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # a second of retries at most
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": a_closed_port()}
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert run.status == RunStatus.SUCCEEDED
    with caplog.at_level(logging.WARNING, logger="agents.telemetry"):
        # The session's end and the run's: both ran and raised nothing; nothing is marked sent.
        assert len(run_queued("export_trace")) == 2
    assert not run.trace_exports.exists()
    assert f"the trace of run {run.pk} was not exported" in caplog.text
    assert telemetry.export(run.pk + 1000) is None  # a run deleted meanwhile: a warning too


# --- over the wire ----------------------------------------------------------------------------
def test_the_otlp_http_exporter_posts_the_trace_as_protobuf(collector, settings, decider):
    run = demo_to_success(decider)
    expected = len(exported(run))
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": collector.url}
    assert telemetry.export(run.pk) == expected
    (post,) = collector.received
    assert post["path"] == "/v1/traces"
    assert post["type"] == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(post["body"])
    (resource_spans,) = request.resource_spans
    names = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert names["service.name"] == "shiftlog"
    sent = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert len(sent) == expected
    roots = [s for s in sent if not s.parent_span_id]
    assert [s.name for s in roots] == [f"invoke_agent run {run.pk}"]


# --- the command ------------------------------------------------------------------------------
def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_export_trace_sends_a_run_to_the_endpoint_it_is_given(collector):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    out = cli("export_trace", str(run.pk), "--endpoint", collector.url)
    (post,) = collector.received
    sent = ExportTraceServiceRequest.FromString(post["body"])
    count = sum(len(scope.spans) for r in sent.resource_spans for scope in r.scope_spans)
    assert out.strip() == f"exported run {run.pk} to {collector.url}/v1/traces: {count} spans"


def test_export_trace_prints_the_spans_with_console(db):
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    out = cli("export_trace", str(run.pk), "--console")
    decoder, names, at = json.JSONDecoder(), [], 0
    while out[at:].strip():  # one JSON object per span, one after another
        span, end = decoder.raw_decode(out, out.index("{", at))
        names.append(span["name"])
        at = end
    assert f"invoke_agent run {run.pk}" in names and "session 1" in names
    assert "gen_ai.output.messages" not in out  # content only when asked for
    assert '"gen_ai.output.messages"' in cli("export_trace", str(run.pk), "--console", "--content")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["999999"], "no run with id 999999"),
        (["{run}"], "no collector to send to"),
        (["{run}", "--endpoint", "ftp://collector"], "must be an http:// or https:// URL"),
    ],
)
def test_export_trace_refuses_bad_arguments_clearly_with_exit_2(settings, args, message):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": ""}
    run = make_run(turns=[finish_turn()])
    with pytest.raises(CommandError, match=message) as info:
        cli("export_trace", *[a.format(run=run.pk) for a in args])
    assert info.value.returncode == 2


def test_a_bad_id_exits_2_from_a_real_process():
    proc = subprocess.run(
        [sys.executable, "manage.py", "export_trace", "not-a-number"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "an id must be a whole number" in proc.stderr


def test_export_trace_fails_when_the_collector_does_not_take_the_trace(monkeypatch, db):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    run = make_run(turns=[finish_turn()])
    url = a_closed_port()
    with pytest.raises(CommandError, match=f"the collector at {url}/v1/traces did not take"):
        cli("export_trace", str(run.pk), "--endpoint", url)


def test_a_collector_url_that_is_not_http_stops_start_up(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318",
    }
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in proc.stderr and "http://" in proc.stderr


@pytest.mark.no_services
def test_traces_url_follows_the_otlp_endpoint_convention():
    assert telemetry.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert telemetry.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert telemetry.traces_url("http://c/otel/v1/traces") == "http://c/otel/v1/traces"
    assert telemetry.preview("x" * 500) == "x" * 199 + "…"
    assert telemetry.preview({"a": 1}) == '{"a": 1}'


# --- in time: a session's spans when it ends ------------------------------------------------
def sent_spans(post) -> list:
    request = ExportTraceServiceRequest.FromString(post["body"])
    return [s for r in request.resource_spans for scope in r.scope_spans for s in scope.spans]


def test_each_session_is_sent_when_it_ends_and_the_run_when_it_ends_in_one_trace_once(
    collector, settings, decider, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_ENDPOINT": collector.url}
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(services.create_demo_run())
    # Session 1 handed off; session 2 waits for a person: the run is far from over.
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert len(run_queued("export_trace")) == 1
    (first,) = collector.received
    assert first["path"] == "/v1/traces"
    early = sent_spans(first)
    trace_id = early[0].trace_id
    (session_1,) = [s for s in early if s.name == "session 1"]
    assert {s.trace_id for s in early} == {trace_id}
    assert not [s for s in early if not s.parent_span_id]  # no root yet: the run goes on
    assert "session 2" not in {s.name for s in early}
    # Everything sent is session 1's: its span, and what lies under it.
    under = {session_1.span_id}
    for span in sorted(early, key=lambda s: s.start_time_unix_nano):
        if span.parent_span_id in under:
            under.add(span.span_id)
    assert under == {s.span_id for s in early}
    assert any(s.name.startswith("chat ") for s in early)
    assert any(s.name.startswith("execute_tool ") for s in early)
    assert not {a.key for s in early for a in s.attributes} & CONTENT_KEYS  # off by default

    approve_pending(run, decider)
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    run_queued("export_trace")
    later = [span for post in collector.received[1:] for span in sent_spans(post)]
    assert {s.trace_id for s in later} == {trace_id}  # the same trace, growing
    assert {"session 2", f"invoke_agent run {run.pk}"} <= {s.name for s in later}
    sent = [s.span_id for s in early + later]
    assert len(sent) == len(set(sent))  # no span twice
    # Together: the whole trace, the same ids as a whole export's.
    assert set(sent) == set(exported_ids(run))
    # Sent again (a retried task, a session's end processed again): nothing more goes out.
    posts = len(collector.received)
    assert telemetry.export_due(run.pk) == 0
    with django_capture_on_commit_callbacks(execute=True):
        trace_parts.export_later(run.pk)
    run_queued("export_trace")
    assert len(collector.received) == posts
    assert sorted(run.trace_exports.values_list("sent", flat=True)) == [True, True, True]


def exported_ids(run) -> list[bytes]:
    return [s.context.span_id.to_bytes(8, "big") for s in exported(run)]


def test_a_part_the_collector_did_not_take_goes_with_the_next_export(settings, db):
    refusing = InMemorySpanExporter()
    refusing.shutdown()  # a shut exporter answers FAILURE, as a collector that is down
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert telemetry.export_due(run.pk, refusing) is None
    assert not run.trace_exports.exists()  # the claims were given up
    mem = InMemorySpanExporter()
    assert telemetry.export_due(run.pk, mem) == len(exported(run))
    assert telemetry.export_due(run.pk, mem) == 0


def test_a_claim_a_dead_worker_left_is_taken_over_and_a_live_one_is_not(db):
    from datetime import timedelta

    from django.utils import timezone

    from agents.models import TraceExport

    run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert trace_parts.claim(run.pk, None)
    assert not trace_parts.claim(run.pk, None)  # another export is sending it
    long_ago = timezone.now() - timedelta(seconds=trace_parts.CLAIM_SECONDS + 1)
    TraceExport.objects.filter(run=run).update(claimed_at=long_ago)
    assert trace_parts.claim(run.pk, None)  # its worker died: taken over
    trace_parts.sent(run.pk, {None: 3})
    TraceExport.objects.filter(run=run).update(claimed_at=long_ago)
    assert not trace_parts.claim(run.pk, None)  # sent is sent


# --- content, when asked for ------------------------------------------------------------------
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}


def bash_run(command: str):
    return drive_until_idle(
        make_run(
            turns=[
                {"text": "Counting first.", "tool_calls": [call("bash", command=command)]},
                finish_turn(),
            ]
        )
    )


def test_content_is_absent_by_default(settings, db):
    assert settings.SHIFTLOG["OTEL_CONTENT"] is False
    spans = exported(bash_run("seq 1 50"))
    assert not [s.name for s in spans if CONTENT_KEYS & set(s.attributes)]


def test_content_when_enabled_is_cut_to_its_size_and_names_the_model_and_agent(settings, db):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_CONTENT": True, "OTEL_CONTENT_CHARS": 40}
    run = bash_run("seq 1 300")
    spans = exported(run)
    (tool,) = [
        s for s in named(spans, "execute_tool") if s.attributes["gen_ai.tool.name"] == "bash"
    ]
    (result,) = [p for p in payloads(run, EventKind.TOOL_RESULT) if p["name"] == "bash"]
    output = result["output"]
    assert len(output) > 40
    assert tool.attributes["gen_ai.tool.call.result"] == (
        f"{output[:40]}…[{len(output) - 40} more characters]"
    )
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"command": "seq 1 300"}
    first, second = sorted(named(spans, "chat"), key=lambda s: s.start_time)
    (said,) = json.loads(first.attributes["gen_ai.output.messages"])
    assert said["role"] == "assistant" and said["finish_reason"]
    assert said["parts"][0] == {"type": "text", "content": "Counting first."}
    assert said["parts"][1]["type"] == "tool_call" and said["parts"][1]["name"] == "bash"
    (given,) = json.loads(first.attributes["gen_ai.input.messages"])
    assert given["role"] == "user"  # the session's first message, cut
    assert given["parts"][0]["content"].endswith("more characters]")
    # The next turn was given the tool's result.
    (answer,) = json.loads(second.attributes["gen_ai.input.messages"])
    assert answer["role"] == "tool"
    assert answer["parts"][0]["id"] == tool.attributes["gen_ai.tool.call.id"]
    assert answer["parts"][0]["result"] == tool.attributes["gen_ai.tool.call.result"]
    for span in spans:
        assert span.attributes["gen_ai.agent.name"] == "shiftlog", span.name
    assert first.attributes["gen_ai.request.model"] == run.model


def test_a_secret_in_a_tool_output_never_reaches_the_trace(settings, db):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "OTEL_CONTENT": True}
    leaked = "tok-" + "k3y" * 6
    run = bash_run(f"echo leaked {leaked}")
    # A secret configured after the run logged it: the log holds it, the trace does not.
    (result,) = [p for p in payloads(run, EventKind.TOOL_RESULT) if p["name"] == "bash"]
    assert leaked in result["output"]
    settings.SHIFTLOG = {**settings.SHIFTLOG, "METRICS_TOKEN": leaked}
    spans = exported(run)
    (tool,) = [
        s for s in named(spans, "execute_tool") if s.attributes["gen_ai.tool.name"] == "bash"
    ]
    assert "leaked [redacted]" in tool.attributes["gen_ai.tool.call.result"]
    for span in spans:
        for value in span.attributes.values():
            assert leaked not in str(value), span.name


def test_an_external_runs_spans_name_its_own_agent(db):
    from agents.runtime import external

    run = make_run(provider="external")
    external.context(run.pk, actor="token-1", agent="billing-bot")
    spans = exported(run)
    assert spans and {s.attributes["gen_ai.agent.name"] for s in spans} == {"billing-bot"}
