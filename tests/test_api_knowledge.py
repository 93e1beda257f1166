"""Sessions (with what each knew at wake-up) and memory through the API."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents import services
from agents.models import Event
from agents.runspec import RunSpec
from api.models import ApiToken

pytestmark = pytest.mark.django_db


def bearer(user, *scopes: str) -> Client:
    _, token = ApiToken.issue(user, list(scopes))
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def put(c, url, body):
    return c.put(url, json.dumps(body), content_type="application/json")


def test_sessions_carry_their_wake_up(owner, decider):
    from agents.models import Run
    from tests.helpers import demo_to_success

    run = demo_to_success(decider)
    Run.objects.filter(pk=run.pk).update(created_by=owner)
    items = bearer(owner, "read").get(f"/api/v1/runs/{run.pk}/sessions").json()["items"]
    assert [s["index"] for s in items] == [1, 2]
    assert "Write a small Python module" in items[0]["wake_up"]["goal"]["text"]
    assert items[1]["wake_up"]["handoff"]["tokens"] > 0
    assert items[0]["handoff"]["summary"]


def test_memory_written_read_promoted_and_forgotten_as_events(owner, outsider):
    first = services.create_run(
        RunSpec(goal="one", checks=["true"], project="shop"), created_by=owner
    )
    second = services.create_run(
        RunSpec(goal="two", checks=["true"], project="shop"), created_by=owner
    )
    c = bearer(owner, "read", "write")
    r = put(c, f"/api/v1/runs/{first.pk}/memory/setup", {"text": "tests need make deps first"})
    assert r.status_code == 200, r.content
    assert r.json()["items"][0] == {
        "scope": "run", "key": "setup", "text": "tests need make deps first",
        "pinned": False, "uses": 0, "by": f"user:{owner.username}",
    }  # fmt: skip
    assert c.get(f"/api/v1/runs/{second.pk}/memory").json()["items"] == []
    assert c.post(f"/api/v1/runs/{first.pk}/memory/setup/promote").status_code == 200
    shared = c.get(f"/api/v1/runs/{second.pk}/memory").json()["items"]
    assert [(e["scope"], e["key"]) for e in shared] == [("project", "setup")]
    assert put(c, f"/api/v1/runs/{first.pk}/memory/setup", {"pinned": True}).json()["items"][0][
        "pinned"
    ]
    assert c.delete(f"/api/v1/runs/{first.pk}/memory/setup").status_code == 200
    r = c.delete(f"/api/v1/runs/{first.pk}/memory/setup")
    assert r.status_code == 422 and r["Content-Type"] == "application/problem+json"
    kinds = list(
        Event.objects.filter(run=first, kind__startswith="memory.").values_list("actor", flat=True)
    )
    assert kinds and set(kinds) == {f"user:{owner.username}"}
    # Reading needs read; writing needs write and control; others see nothing.
    assert (
        bearer(owner, "read")
        .put(
            f"/api/v1/runs/{first.pk}/memory/x",
            json.dumps({"text": "t"}),
            content_type="application/json",
        )
        .status_code
        == 403
    )
    assert (
        bearer(outsider, "read", "write").get(f"/api/v1/runs/{first.pk}/memory").status_code == 404
    )


def test_bad_memory_requests_are_4xx(owner):
    run = services.create_run(RunSpec(goal="one", checks=["true"]), created_by=owner)
    c = bearer(owner, "read", "write")
    assert put(c, f"/api/v1/runs/{run.pk}/memory/k", {"text": ""}).status_code == 422
    assert (
        put(c, f"/api/v1/runs/{run.pk}/memory/k", {"text": "t", "scope": "galaxy"}).status_code
        == 422
    )
    assert put(c, f"/api/v1/runs/{run.pk}/memory/{'k' * 101}", {"text": "t"}).status_code == 422
    # No project: promoting is refused, clearly.
    put(c, f"/api/v1/runs/{run.pk}/memory/k", {"text": "t"})
    r = c.post(f"/api/v1/runs/{run.pk}/memory/k/promote")
    assert r.status_code == 422 and "project" in r.json()["detail"]


def test_a_run_created_through_the_api_has_its_project(owner):
    c = bearer(owner, "read", "write")
    r = c.post(
        "/api/v1/runs",
        json.dumps({"goal": "g", "checks": ["true"], "project": "shop"}),
        content_type="application/json",
    )
    assert r.status_code == 201 and r.json()["project"] == "shop"
