"""Triggers: a webhook URL per trigger that makes a run from a template run, its token (constant
time), its optional signature, replays, the payload's places in the goal, and bad bodies."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.test import Client

from agents.models import EventKind, Run, Trigger, TriggerDelivery
from agents.schedules import triggers
from tests.helpers import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def tpl(owner):
    return make_run(
        goal="Fix issue {payload.issue.number}: {payload.issue.title}", created_by=owner
    )


def post(token: str, body, *, headers=None, content_type="application/json"):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return Client().post(
        f"/hooks/{token}/", data=data, content_type=content_type, headers=headers or {}
    )


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


ISSUE = {"issue": {"number": 42, "title": "crash on empty input", "labels": ["bug", "p1"]}}


def test_a_good_token_makes_a_run_with_the_payload_in_its_goal(tpl, owner):
    trigger, token = triggers.create(tpl, created_by=owner)
    assert (
        Trigger.objects.get(pk=trigger.pk).token_hash == hashlib.sha256(token.encode()).hexdigest()
    )
    assert token not in str(Trigger.objects.filter(pk=trigger.pk).values().get())
    r = post(token, ISSUE)
    assert r.status_code == 201, r.content
    run = Run.objects.get(pk=r.json()["run"])
    assert run.goal == "Fix issue 42: crash on empty input"
    assert run.trigger == trigger and run.created_by == owner
    assert run.checks == tpl.checks
    created = run.events.get(kind=EventKind.RUN_CREATED)
    assert created.payload["origin"] == {"template": tpl.pk, "trigger": trigger.pk}
    assert r.json()["url"].endswith(f"/runs/{run.pk}/")


def test_a_bad_or_revoked_token_is_404_and_compared_in_constant_time(tpl, monkeypatch):
    trigger, token = triggers.create(tpl)
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(
        triggers.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b)
    )
    r = post("x" * 43, ISSUE)
    assert r.status_code == 404 and "no such trigger" in r.json()["message"]
    assert len(compared) == 1  # a miss is compared too (against a stand-in)
    assert post("y" * 500, ISSUE).status_code == 404
    triggers.revoke(trigger.pk)
    assert post(token, ISSUE).status_code == 404
    assert not Run.objects.filter(trigger=trigger).exists()
    assert Client().get(f"/hooks/{token}/").status_code == 405


def test_a_trigger_with_a_secret_needs_a_good_signature(tpl):
    secret = "s3cret-s3cret-s3cret"
    _, token = triggers.create(tpl, secret=secret)
    body = json.dumps(ISSUE).encode()
    assert post(token, body).status_code == 401  # none
    bad = post(token, body, headers={"X-Shiftlog-Signature": sign("wrong-secret-xxxxxx", body)})
    assert bad.status_code == 401 and "signature" in bad.json()["message"]
    tampered = json.dumps({**ISSUE, "x": 1}).encode()
    assert (
        post(token, tampered, headers={"X-Shiftlog-Signature": sign(secret, body)}).status_code
        == 401
    )
    assert Run.objects.count() == 1  # the template only
    ok = post(token, body, headers={"X-Shiftlog-Signature": sign(secret, body)})
    assert ok.status_code == 201
    github = post(token, body, headers={"X-Hub-Signature-256": sign(secret, body)})
    assert github.status_code == 201


def test_a_replayed_delivery_is_ignored(tpl):
    trigger, token = triggers.create(tpl)
    first = post(token, ISSUE, headers={"X-GitHub-Delivery": "abc-1"})
    assert first.status_code == 201
    again = post(token, ISSUE, headers={"X-GitHub-Delivery": "abc-1"})
    assert again.status_code == 200 and "already delivered" in again.json()["message"]
    assert Run.objects.filter(trigger=trigger).count() == 1
    assert TriggerDelivery.objects.get(trigger=trigger).run_id == first.json()["run"]
    # Another id, or Standard Webhooks' header: a new delivery.
    assert post(token, ISSUE, headers={"webhook-id": "msg_2"}).status_code == 201
    assert post(token, ISSUE, headers={"X-Delivery-Id": "abc-2"}).status_code == 201
    assert Run.objects.filter(trigger=trigger).count() == 3


def test_a_delivery_refused_for_its_payload_can_be_sent_again_fixed(tpl):
    _, token = triggers.create(tpl)
    r = post(token, {"issue": {"number": 1}}, headers={"X-Delivery-Id": "d1"})
    assert r.status_code == 422
    assert "payload.issue.title" in r.json()["message"]
    assert post(token, ISSUE, headers={"X-Delivery-Id": "d1"}).status_code == 201


def test_payload_places():
    payload = {"a": {"b": [10, {"c": "deep"}]}, "n": None, "s": "{payload.a}", "long": "x" * 5000}
    assert triggers.fill("{payload.a.b.1.c}/{payload.a.b.0}", payload) == "deep/10"
    assert triggers.fill("{payload.n} {payload.a.b.1}", payload) == 'null {"c": "deep"}'
    # A value's own braces are text, never a place read again.
    assert triggers.fill("v={payload.s}", payload) == "v={payload.a}"
    assert len(triggers.fill("{payload.long}", payload)) == triggers.MAX_VALUE_CHARS + 1
    assert triggers.fill("no places {here}", payload) == "no places {here}"
    assert triggers.fill("all: {payload}", {"k": [1]}) == 'all: {"k": [1]}'
    for missing in ["{payload.a.x}", "{payload.a.b.5}", "{payload.a.b.-1}", "{payload.s.0}"]:
        with pytest.raises(KeyError, match=missing.strip("{}").replace(".", r"\.")):
            triggers.fill(missing, payload)
    with pytest.raises(triggers.TriggerError, match="not a place"):
        triggers.check_places("{payload.__class__()}")


def test_bad_bodies_are_refused_clearly(tpl, settings):
    _, token = triggers.create(tpl)
    r = post(token, b"not json")
    assert r.status_code == 400 and "not JSON" in r.json()["message"]
    r = post(token, b"a=1", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415
    settings.SHIFTLOG = {**settings.SHIFTLOG, "HOOK_MAX_BODY_KB": 1}
    r = post(token, {"issue": {"number": 1, "title": "x" * 2000}})
    assert r.status_code == 413 and "1 KB" in r.json()["message"]
    assert Run.objects.count() == 1


def test_deliveries_are_rate_limited_per_trigger(tpl, settings):
    from django.core.cache import caches

    settings.SHIFTLOG = {**settings.SHIFTLOG, "HOOK_RATE_PER_MINUTE": 2}
    trigger, token = triggers.create(tpl)
    key = f"hook-rate:{trigger.token_hash[:32]}"
    try:
        codes = [post(token, ISSUE).status_code for _ in range(3)]
        assert codes == [201, 201, 429]
    finally:
        caches["api"].delete(key)


def test_a_trigger_goal_of_its_own_and_its_checks(tpl):
    _, token = triggers.create(tpl, goal="Label {payload.issue.labels.0}")
    run = Run.objects.get(pk=post(token, ISSUE).json()["run"])
    assert run.goal == "Label bug"
    with pytest.raises(triggers.TriggerError, match="at least 16"):
        triggers.create(tpl, secret="short")
    with pytest.raises(triggers.TriggerError, match="not a place"):
        triggers.create(tpl, goal="{payload..x}")
