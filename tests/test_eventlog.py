from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from agents import eventlog, leases
from agents.eventlog import LeaseLost, NewEvent
from agents.models import Event, ImmutableEvent, Run
from tests.helpers import make_run


@pytest.fixture
def run(db):
    return make_run(turns=[{"text": "hi"}])


def test_seq_is_gap_free_and_ordered(run):
    for i in range(5):
        eventlog.append(run.pk, "human.note", {"text": str(i)})
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    run.refresh_from_db()
    assert run.last_seq == seqs[-1]


def test_append_many_keeps_order_in_one_transaction(run):
    appended = eventlog.append_many(
        run.pk, [NewEvent("human.note", {"text": "a"}), NewEvent("human.note", {"text": "b"})]
    )
    assert [e.payload["text"] for e in appended.events] == ["a", "b"]
    assert appended.events[1].seq == appended.events[0].seq + 1
    assert appended.status == "queued"


def test_seqs_are_per_run(db):
    a, b = make_run(turns=[{"text": "a"}]), make_run(turns=[{"text": "b"}])
    assert eventlog.append(a.pk, "human.note", {"text": "x"}).seq == 2
    assert eventlog.append(b.pk, "human.note", {"text": "y"}).seq == 2


def test_an_event_cannot_be_updated_through_the_model(run):
    event = Event.objects.filter(run=run).first()
    event.payload = {"forged": True}
    with pytest.raises(ImmutableEvent):
        event.save()


def test_an_event_cannot_be_deleted(run):
    with pytest.raises(ImmutableEvent):
        Event.objects.filter(run=run).first().delete()
    with pytest.raises(ImmutableEvent):
        Event.objects.filter(run=run).delete()
    with pytest.raises(ImmutableEvent):
        Event.objects.filter(run=run).update(kind="error")


def test_the_database_refuses_an_update_even_in_raw_sql(run):
    with (
        pytest.raises(Exception, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE agents_event SET kind = 'error' WHERE run_id = %s", [run.pk])


def test_a_duplicate_seq_is_refused_by_the_database(run):
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.bulk_create([Event(run=run, seq=1, kind="human.note", payload={})])


def test_an_append_with_a_lost_lease_writes_nothing(run):
    assert leases.claim(run.pk, "worker:a")
    Run.objects.filter(pk=run.pk).update(lease_owner="worker:b")
    before = Event.objects.filter(run=run).count()
    with pytest.raises(LeaseLost):
        eventlog.append(run.pk, "human.note", {"text": "late"}, lease_owner="worker:a")
    assert Event.objects.filter(run=run).count() == before


def test_appending_to_a_missing_run_raises(db):
    with pytest.raises(Run.DoesNotExist):
        eventlog.append(999_999, "human.note", {"text": "x"})


def test_secrets_are_redacted_from_payloads(run, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ANTHROPIC_API_KEY": "sk-ant-very-secret-123"}
    event = eventlog.append(
        run.pk,
        "tool.result",
        {
            "tool_use_id": "t1",
            "name": "bash",
            "output": "key is sk-ant-very-secret-123 ok",
            "data": {"nested": ["sk-ant-very-secret-123"]},
        },
    )
    stored = Event.objects.get(pk=event.pk).payload
    assert "sk-ant-very-secret-123" not in str(stored)
    assert stored["output"] == "key is [redacted] ok"


def test_unknown_counters_are_refused(run):
    with pytest.raises(ValueError, match="not a run counter"):
        eventlog.append_many(run.pk, [NewEvent("human.note")], increments={"last_seq": 5})


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        (
            "checkpoint.created",
            {"checkpoint_id": 3, "kind": "manual", "label": "before refactor", "files": 12,
             "bytes_added": 420},
            "checkpoint 3 (manual): before refactor, 12 files, the store grew by 420 bytes",
        ),
        (
            "run.rewound",
            {"checkpoint_id": 2, "to_seq": 28, "from_seq": 45, "events": 17, "tokens": 7091,
             "cost_usd": "0.0100", "note": "go carefully"},
            "rewound to checkpoint 2 (#28): events #29-#45 abandoned (17 events, 7091 tokens, "
            "$0.0100); note: go carefully",
        ),
        ("run.forked", {"checkpoint_id": 2, "fork_run_id": 9},
         "forked from checkpoint 2 into run 9"),
        ("acceptance.updated", {"changed": ["login works"], "passing": 1, "total": 3},
         "acceptance 1/3 passing (changed: login works)"),
        ("notification.failed",
         {"url": "http://hooks.example/x", "event": "run.paused", "attempts": 5,
          "error": "HTTP 500"},
         "webhook run.paused to http://hooks.example/x failed after 5 attempt(s): HTTP 500"),
    ],
)  # fmt: skip
def test_every_kind_reads_as_one_plain_line(kind, payload, expected):
    from agents.eventlog import describe

    assert describe(kind, payload) == expected


def test_a_nul_byte_in_a_payload_is_stored_visibly_on_every_database(db):
    from agents import eventlog
    from tests.helpers import make_run

    run = make_run(turns=[{"text": "x"}])
    # An untyped kind: a key of any name (a typed kind's keys are its fields).
    event = eventlog.append(run.pk, "run.isolation", {"output": "a\x00b", "k\x00": ["\x00"]})
    event.refresh_from_db()
    assert event.payload == {"output": "a\u2400b", "k\u2400": ["\u2400"]}
