"""The event registry (agents/events.py): every kind written anywhere is registered, each typed
kind's payload round-trips, a wrong field is refused at write, old payloads still read, and the
readers (summary, failures, the API, the timeline's keys) agree with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agents import eventlog, events
from agents.events import EventPayloadError
from agents.models import Event, EventKind, Run
from api.models import ApiToken
from tests.helpers import make_run

ROOT = Path(__file__).resolve().parent.parent

# One payload of each typed kind, as its emit site writes it.
SAMPLES = {
    "run.status": {"from": "running", "to": "paused", "reason": "by alice", "cause": "person"},
    "session.started": {"index": 1, "first_message": "# Goal\nfix it"},
    "session.ended": {"index": 1, "reason": "handoff"},
    "model.turn": {
        "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
        ],
        "text": "Looking.",
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "cost_usd": "0.0001",
        "price": "table",
        "model": "claude-x",
        "latency_ms": 12.5,
        "context_seq": 4,
        "meta": {},
    },
    "tool.call": {
        "tool_use_id": "t1",
        "name": "bash",
        "input": {"command": "ls"},
        "approval_id": 3,
    },
    "tool.result": {
        "tool_use_id": "t1",
        "name": "bash",
        "output": "a.txt",
        "is_error": False,
        "data": {"exit_code": 0},
    },
    "harness.message": {"text": "Hand off now.", "reason": "handoff_requested"},
    "human.note": {"text": "use the v2 API", "author": "alice"},
    "check.result": {
        "command": "pytest -q",
        "exit_code": 1,
        "passed": False,
        "timed_out": False,
        "cancelled": False,
        "output": "1 failed",
        "duration_ms": 840.2,
        "isolation": "bwrap",
        "at": "finish",
        "required": True,
    },
    "check.regressed": {"command": "pytest -q", "passed_at_seq": 7, "at": "finish"},
    "check.tampered": {"files": [{"path": "tests/t.py", "change": "modified"}], "at": "finish"},
    "judge.verdict": {
        "criteria": [{"criterion": "documented", "passed": True, "reason": "ok"}],
        "passed": True,
        "model": "claude-x",
        "error": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
        "cost_usd": "0",
    },
    "drift.warning": {
        "coverage": 0.1,
        "threshold": 0.2,
        "goal_words_missing": ["invoices"],
        "summary": "did things",
        "forced": False,
    },
    "acceptance.updated": {"changed": ["a"], "passing": 1, "total": 2, "criteria": ["a", "b"]},
    "budget.warning": {"budget": "tokens", "used": "800", "limit": "1000"},
    "budget.exceeded": {"reason": "tokens: 1000 of 1000"},
    "error": {"source": "provider", "error": "APIError", "message": "boom", "status_code": 529},
    "approval.requested": {
        "approval_id": 3,
        "tool_use_id": "t1",
        "tool": "bash",
        "input": {"command": "rm -rf build"},
        "reason": "deletes files",
        "expires_at": None,
    },
    "approval.decided": {
        "approval_id": 3,
        "tool_use_id": "t1",
        "tool": "bash",
        "decision": "approved",
        "comment": "fine",
        "edited_input": {"command": "rm -rf build/x"},
        "diff": "- build\n+ build/x",
    },
    "artifact.saved": {"artifact_id": 1, "name": "report.md", "kind": "report", "size": 10},
    "checkpoint.created": {
        "checkpoint_id": 9,
        "number": 2,
        "kind": "manual",
        "label": "before",
        "tree": "ab" * 32,
        "files": 3,
        "bytes_added": 40,
        "ms": 1.5,
    },
    "run.rewind_requested": {"checkpoint_id": 9, "number": 2, "to_seq": 5, "note": ""},
    "run.rewound": {
        "checkpoint_id": 9,
        "number": 2,
        "from_seq": 20,
        "to_seq": 5,
        "events": 15,
        "by_kind": {"model.turn": 5},
        "sessions": [1],
        "tokens": 100,
        "cost_usd": "0.01",
        "artifacts": [],
        "files": [],
        "irreversible": [],
        "children": [],
        "note": "try again",
    },
    "run.forked": {"checkpoint_id": 9, "number": 2, "fork_run_id": 44},
}


def test_every_typed_kind_has_a_sample_and_round_trips():
    assert set(SAMPLES) == set(events.typed_kinds())
    for kind, payload in SAMPLES.items():
        events.check(kind, payload)
        typed = events.read(kind, payload)
        assert isinstance(typed, events.typed_kinds()[kind])
        written = events.as_written(typed)
        assert {k: written[k] for k in payload} == payload, kind  # the fields as written
        assert events.read(kind, written) == typed, kind
        assert events.summary(kind, payload), kind


def test_every_event_kind_is_registered_and_nothing_else():
    assert set(events.KINDS) == set(EventKind.values)
    assert events.untyped_kinds() == sorted(set(EventKind.values) - set(events.typed_kinds()))


# --- every kind written anywhere in the code is registered ---------------------------------
WRITERS = {"append", "NewEvent", "event"}  # eventlog.append, NewEvent(...), Slice.event(...)


def emitted_kinds(source: str) -> set[str]:
    """The kinds a module's source writes: the kind argument (a string, or EventKind.NAME) of
    eventlog.append(run, kind, ...), NewEvent(kind, ...) and Slice.event(kind, ...)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        if name not in WRITERS:
            continue
        args = list(node.args)
        if name == "append":  # eventlog.append(run_id, kind, ...), not a list's append(x)
            args = args[1:2] if len(args) >= 2 else []
        args = args[:1] + [k.value for k in node.keywords if k.arg == "kind"]
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", arg.value):
                    found.add(arg.value)
            elif (
                isinstance(arg, ast.Attribute)
                and isinstance(arg.value, ast.Name)
                and arg.value.id == "EventKind"
            ):
                found.add(getattr(EventKind, arg.attr, f"EventKind.{arg.attr}"))
    return found


def test_the_scanner_finds_a_kind_nobody_registered():
    """Positive control: an emit site of an unregistered kind is seen, in each form."""
    source = (
        "eventlog.append(run_id, 'made.up', {})\n"
        "NewEvent(EventKind.NO_SUCH_KIND, {})\n"
        "s.event('also.made_up', {})\n"
        "items.append('list.item')\n"  # a list's append: not an event
    )
    found = emitted_kinds(source)
    assert found == {"made.up", "EventKind.NO_SUCH_KIND", "also.made_up"}
    assert found - set(events.KINDS) == found


def test_every_kind_emitted_in_the_code_is_registered():
    emitted: dict[str, set[str]] = {}
    for folder in ("agents", "api", "dashboard", "bench", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for kind in emitted_kinds(path.read_text()):
                emitted.setdefault(kind, set()).add(str(path.relative_to(ROOT)))
    # The schedules' own log (ScheduleEvent) is not the run's event log.
    emitted = {k: v for k, v in emitted.items() if not k.startswith("tick.")}
    unknown = {k: sorted(v) for k, v in emitted.items() if k not in events.KINDS}
    assert not unknown, f"emitted but not registered in agents/events.py: {unknown}"
    assert len(emitted) >= 30, sorted(emitted)  # the scan sees the emit sites


# --- at write ---------------------------------------------------------------------------------
@pytest.fixture
def run(db) -> Run:
    return make_run(turns=[{"text": "x"}])


@pytest.mark.parametrize(
    ("kind", "payload", "says"),
    [
        ("tool.called", {"tool_use_id": "t1"}, "not an event kind"),
        (
            "tool.result",
            {"tool_use_id": "t", "name": "bash", "output": "", "is_eror": 1},
            "is_eror",
        ),
        ("session.started", {"index": "1"}, "index"),
        ("session.ended", {"index": 1}, "reason: Field required"),
        ("human.note", {"text": "hi", "writer": "bob"}, "writer"),
        ("check.result", {"command": "pytest", "passed": "yes"}, "passed"),
        ("run.status", {"to": "paused"}, "from"),
    ],
)
def test_a_wrong_kind_or_field_is_refused_at_write_and_nothing_is_written(run, kind, payload, says):
    run.refresh_from_db()
    before = run.last_seq
    with pytest.raises(EventPayloadError, match=says):
        eventlog.append(run.pk, kind, payload)
    with pytest.raises(EventPayloadError):  # one bad event refuses the whole batch
        eventlog.append_many(
            run.pk,
            [eventlog.NewEvent("human.note", {"text": "ok"}), eventlog.NewEvent(kind, payload)],
        )
    run.refresh_from_db()
    assert run.last_seq == before
    assert not Event.objects.filter(run=run, seq__gt=before).exists()


def test_a_right_payload_is_written_as_given(run):
    event = eventlog.append(run.pk, "run.status", SAMPLES["run.status"])
    event.refresh_from_db()
    assert event.payload == SAMPLES["run.status"]
    typed = events.payload_of(event)
    assert (typed.from_, typed.to, typed.cause) == ("running", "paused", "person")


# --- old payloads -----------------------------------------------------------------------------
def test_old_payloads_with_missing_and_extra_keys_still_read(run):
    """Rows stored before the registry (written here past it, as a migration would have left
    them): a checkpoint with only its id, a result without a name and with a key since dropped."""
    old = [
        Event.objects.create(run=run, seq=100, kind="checkpoint.created",
                             payload={"checkpoint_id": 3, "kind": "manual", "files": 2}),
        Event.objects.create(run=run, seq=101, kind="tool.result",
                             payload={"tool_use_id": "t9", "output": "x", "is_error": True,
                                      "legacy": {"a": 1}}),
        Event.objects.create(run=run, seq=102, kind="session.started", payload={"index": "2"}),
        Event.objects.create(run=run, seq=103, kind="approval.requested", payload={}),
    ]  # fmt: skip
    checkpoint, result, started, asked = (events.payload_of(e) for e in old)
    assert (checkpoint.shown_number, checkpoint.label, checkpoint.files) == (3, "", 2)
    assert (result.tool_use_id, result.name, result.is_error) == ("t9", None, True)
    assert not hasattr(result, "legacy")
    assert started.index == 2  # read leniently: "2" as stored by an old writer
    assert (asked.approval_id, asked.reason) == (None, "")
    assert events.summary("checkpoint.created", old[0].payload).startswith("checkpoint 3 (manual)")
    assert events.failed("tool.result", old[1].payload)
    # The API sends an old payload as it was stored, with its summary.
    owner = get_user_model().objects.get(pk=run.created_by_id) if run.created_by_id else None
    if owner is None:
        owner = get_user_model().objects.create_user("olga", password="pw-olga-12345")
        Run.objects.filter(pk=run.pk).update(created_by=owner)
    _, token = ApiToken.issue(owner, ["read"])
    page = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(
        f"/api/v1/runs/{run.pk}/events?after=99"
    )
    assert page.status_code == 200, page.content
    items = {i["seq"]: i for i in page.json()["items"]}
    assert items[101]["payload"]["legacy"] == {"a": 1}
    assert items[100]["summary"].startswith("checkpoint 3 (manual)")


# --- readers agree with the registry ----------------------------------------------------------
def test_failed_agrees_with_the_failures_query(run):
    rows = [
        ("tool.result", SAMPLES["tool.result"]),
        ("tool.result", {**SAMPLES["tool.result"], "is_error": True}),
        ("check.result", SAMPLES["check.result"]),
        ("check.result", {**SAMPLES["check.result"], "passed": True}),
        ("judge.verdict", SAMPLES["judge.verdict"]),
        ("judge.verdict", {**SAMPLES["judge.verdict"], "passed": False}),
        ("check.regressed", SAMPLES["check.regressed"]),
        ("check.tampered", SAMPLES["check.tampered"]),
        ("run.status", {"from": "running", "to": "failed", "reason": "x"}),
        ("run.status", SAMPLES["run.status"]),
        ("human.note", SAMPLES["human.note"]),
    ]
    written = eventlog.append_many(run.pk, [eventlog.NewEvent(k, p) for k, p in rows]).events
    by_query = set(Event.objects.filter(run=run).failures().values_list("seq", flat=True))
    by_registry = {e.seq for e in written if events.failed(e.kind, e.payload)}
    assert by_registry == by_query
    assert len(by_query) == 6


def test_a_reader_cannot_ask_for_a_key_no_writer_writes():
    assert events.keys("tool.call", "tool_use_id", "name") == ("tool_use_id", "name")
    assert events.keys("model.turn", "usage.input_tokens") == ("usage.input_tokens",)
    with pytest.raises(EventPayloadError, match="nmae"):
        events.keys("tool.call", "nmae")
    with pytest.raises(EventPayloadError, match="untyped"):
        events.keys("fleet.merge", "run_id")


def test_the_run_pages_panels_name_registered_kinds():
    from dashboard.panels import PANELS_BY_KIND

    assert set(PANELS_BY_KIND) <= set(events.KINDS)


def test_the_openapi_document_shows_the_typed_payloads(run):
    owner = get_user_model().objects.create_user("otto", password="pw-otto-12345")
    _, token = ApiToken.issue(owner, ["read"])
    schema = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/openapi.json").json()
    payload = schema["components"]["schemas"]["EventOut"]["properties"]["payload"]
    by_kind = payload["x-payload-of-kind"]
    assert set(by_kind) == set(events.typed_kinds())
    turn = by_kind["model.turn"]
    assert "content" in turn["required"] and turn["additionalProperties"] is False
    assert set(by_kind["run.status"]["required"]) == {"from", "to"}
    assert "fleet.merge" in payload["description"]  # the untyped kinds are named


def test_the_run_page_renders_each_typed_kinds_fields_and_marks_failures(run):
    """The event-row partial reads `row.p.<field>`: each typed kind shows what its model holds."""
    from django.template.loader import render_to_string

    from dashboard import stream

    written = eventlog.append_many(
        run.pk, [eventlog.NewEvent(k, p) for k, p in SAMPLES.items()]
    ).events
    rows = [stream.Row(**{k: getattr(e, k) for k in stream.EVENT_FIELDS}) for e in written]
    html = {
        r.kind: render_to_string("runs/detail.html#event-row", {"row": r, "rights": None})
        for r in rows
    }
    expected = {
        "check.result": "✘ failed (exit 1)",
        "check.regressed": "passed at #7",
        "check.tampered": "tests/t.py",
        "drift.warning": "invoices",
        "judge.verdict": "documented",
        "human.note": "use the v2 API",
        "run.rewound": "try again",
        "model.turn": "10 in · 5 out",
        "tool.call": "$ ls",
        "approval.requested": "deletes files",
    }
    for kind, text in expected.items():
        assert text in html[kind], (kind, html[kind])
    assert 'data-abandons="5-20"' in html["run.rewound"]
    assert {r.kind for r in rows if r.failed} == {
        "check.result",
        "check.regressed",
        "check.tampered",
    }
    assert all(r.summary for r in rows)


def test_a_served_product_keeps_an_event_its_model_refuses_and_logs_it(run, settings, caplog):
    """Strict at write only where asked (the tests): served, a payload its kind's model refuses
    (a field a new code path added, say) is kept as given and logged, so a run never fails over
    the shape of its own record; an unknown kind is refused either way."""
    settings.SHIFTLOG = {**settings.SHIFTLOG, "STRICT_EVENTS": False}
    run.refresh_from_db()
    before = run.last_seq
    with caplog.at_level("ERROR", logger="agents.events"):
        eventlog.append(run.pk, "human.note", {"text": "hi", "mood": "odd"})
    kept = Event.objects.get(run=run, seq=before + 1)
    assert kept.payload == {"text": "hi", "mood": "odd"}
    assert "human.note: payload refused by HumanNote (mood: Extra inputs" in caplog.text
    with pytest.raises(EventPayloadError, match="is not an event kind"):
        eventlog.append(run.pk, "no.such.kind", {})
