"""`Idempotency-Key` on the API's POSTs (api/idempotency.py): the same user's same key within a
day gets the first answer again, never a second run or note; another body with the key is a 422;
answers that say nothing of the effect (401, 5xx) are not kept."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Event, EventKind, Run
from api.models import ApiToken, IdempotentRequest
from tests.helpers import user_with

pytestmark = pytest.mark.django_db

RUN = {"goal": "g", "checks": ["true"]}


def bearer(user) -> Client:
    _, token = ApiToken.issue(user, ["read", "write"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client, url, body, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(url, json.dumps(body), content_type="application/json", **headers)


def test_the_same_key_twice_creates_one_run_and_answers_the_same(owner):
    c = bearer(owner)
    first = post(c, "/api/v1/runs", RUN, key="k-1")
    again = post(c, "/api/v1/runs", RUN, key="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1
    # Another key (or none) is another request.
    assert post(c, "/api/v1/runs", RUN, key="k-2").json()["id"] != first.json()["id"]
    post(c, "/api/v1/runs", RUN)
    assert Run.objects.count() == 3


def test_a_retried_note_is_written_once(owner):
    c = bearer(owner)
    run_id = post(c, "/api/v1/runs", RUN).json()["id"]
    for _ in range(3):
        r = post(c, f"/api/v1/runs/{run_id}/note", {"text": "look at the tests"}, key="note-1")
        assert r.status_code == 201
    assert Event.objects.filter(run_id=run_id, kind=EventKind.HUMAN_NOTE).count() == 1


def test_the_same_key_with_another_body_is_a_422_and_changes_nothing(owner):
    c = bearer(owner)
    post(c, "/api/v1/runs", RUN, key="k")
    r = post(c, "/api/v1/runs", {**RUN, "goal": "another"}, key="k")
    assert r.status_code == 422 and "different request" in r.json()["detail"]
    r = post(c, "/api/v1/runs?x=1", RUN, key="k")  # the path and query count too
    assert r.status_code == 422
    assert Run.objects.count() == 1


def test_keys_are_per_user(owner):
    other = user_with("bob", "add_run")
    post(bearer(owner), "/api/v1/runs", RUN, key="shared")
    r = post(bearer(other), "/api/v1/runs", RUN, key="shared")
    assert r.status_code == 201 and "Idempotent-Replayed" not in r
    assert Run.objects.count() == 2


def test_a_key_is_kept_for_a_day(owner):
    c = bearer(owner)
    post(c, "/api/v1/runs", RUN, key="day")
    IdempotentRequest.objects.update(created_at=timezone.now() - timedelta(hours=25))
    assert "Idempotent-Replayed" not in post(c, "/api/v1/runs", RUN, key="day")
    assert Run.objects.count() == 2


def test_a_request_still_being_answered_is_a_409_with_retry_after(owner):
    c = bearer(owner)
    token_user = owner
    from types import SimpleNamespace

    from api.idempotency import _fingerprint

    # The fingerprint of the POST below, as the first request stored it.
    req = SimpleNamespace(
        method="POST", path="/api/v1/runs", body=json.dumps(RUN).encode(), META={}
    )
    IdempotentRequest.objects.create(user=token_user, key="busy", fingerprint=_fingerprint(req))
    r = post(c, "/api/v1/runs", RUN, key="busy")
    assert r.status_code == 409 and r["Retry-After"] == "1"
    assert Run.objects.count() == 0
    # One that died with its process frees its key after a while.
    IdempotentRequest.objects.update(created_at=timezone.now() - timedelta(minutes=11))
    assert post(c, "/api/v1/runs", RUN, key="busy").status_code == 201


def test_answers_that_say_nothing_of_the_effect_are_not_kept(owner):
    r = post(Client(HTTP_AUTHORIZATION="Bearer nope"), "/api/v1/runs", RUN, key="k")
    assert r.status_code == 401
    _, token = ApiToken.issue(owner, ["read"])  # no write scope: 403
    r = post(Client(HTTP_AUTHORIZATION=f"Bearer {token}"), "/api/v1/runs", RUN, key="k")
    assert r.status_code == 403
    assert not IdempotentRequest.objects.exists()
    # A validation error is an answer about the request: kept, and the same again.
    c = bearer(owner)
    bad = post(c, "/api/v1/runs", {"goal": ""}, key="bad")
    assert bad.status_code == 422 and post(c, "/api/v1/runs", {"goal": ""}, key="bad").json() == (
        bad.json()
    )


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "a\x01b"])
def test_a_bad_key_is_a_422(owner, key):
    r = post(bearer(owner), "/api/v1/runs", RUN, key=key)
    assert r.status_code == 422 and "Idempotency-Key" in r.json()["detail"]
    assert Run.objects.count() == 0
