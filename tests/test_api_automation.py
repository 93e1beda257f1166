"""Schedules, triggers and wake-ups through the API: the same services as the web and CLI."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents import services
from agents.models.schedules import Schedule, Trigger
from agents.runspec import RunSpec
from api.models import ApiToken

pytestmark = pytest.mark.django_db


def bearer(user, *scopes: str) -> Client:
    _, token = ApiToken.issue(user, list(scopes))
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(c, url, body=None):
    return c.post(url, json.dumps(body or {}), content_type="application/json")


def test_schedule_create_list_pause_resume_delete(owner, outsider):
    run = services.create_run(RunSpec(goal="nightly", checks=["true"]), created_by=owner)
    c = bearer(owner, "read", "write")
    made = post(
        c,
        "/api/v1/schedules",
        {"from_run": run.pk, "cron": "0 3 * * *", "timezone": "Europe/Paris"},
    )
    assert made.status_code == 201, made.content
    s = made.json()
    assert s["template"] == run.pk and s["next_at"] and not s["paused"]
    assert [x["id"] for x in c.get("/api/v1/schedules").json()["items"]] == [s["id"]]
    assert post(c, f"/api/v1/schedules/{s['id']}/pause").json()["paused"] is True
    assert post(c, f"/api/v1/schedules/{s['id']}/pause").status_code == 409
    assert post(c, f"/api/v1/schedules/{s['id']}/resume").json()["paused"] is False
    # Someone who may not see the template sees no schedule.
    other = bearer(outsider, "read", "write")
    assert other.get(f"/api/v1/schedules/{s['id']}").status_code == 404
    assert other.get("/api/v1/schedules").json()["items"] == []
    assert c.delete(f"/api/v1/schedules/{s['id']}").status_code == 204
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"cron": "not cron"},
        {"cron": "0 3 * * *", "timezone": "Mars/Olympus"},
        {"cron": "0 3 * * *", "overlap": "sometimes"},
        {"cron": "0 3 * * *", "colour": "blue"},
    ],
)
def test_bad_schedules_are_422_and_make_nothing(owner, body):
    run = services.create_run(RunSpec(goal="nightly", checks=["true"]), created_by=owner)
    r = post(bearer(owner, "read", "write"), "/api/v1/schedules", {"from_run": run.pk, **body})
    assert r.status_code == 422 and r["Content-Type"] == "application/problem+json", r.content
    assert not Schedule.objects.exists()


def test_a_trigger_is_shown_once_and_starts_runs(owner):
    run = services.create_run(RunSpec(goal="on push", checks=["true"]), created_by=owner)
    c = bearer(owner, "read", "write")
    made = post(c, "/api/v1/triggers", {"from_run": run.pk, "goal": "build {payload.ref}"})
    assert made.status_code == 201, made.content
    t = made.json()
    assert "/hooks/" in t["url"] and t["secret"] == ""
    listed = c.get("/api/v1/triggers").json()["items"]
    assert listed[0]["id"] == t["id"] and "url" not in listed[0]
    path = t["url"].split("://", 1)[1].split("/", 1)[1]
    hit = Client().post(f"/{path}", json.dumps({"ref": "main"}), content_type="application/json")
    assert hit.status_code in (200, 201, 202), hit.content
    assert c.delete(f"/api/v1/triggers/{t['id']}").json()["revoked_at"]
    assert Trigger.objects.get().revoked_at is not None


def test_wake_a_paused_run_and_cancel_it(owner):
    run = services.create_run(RunSpec(goal="later", checks=["true"]), created_by=owner)
    services.pause_run(run.pk, actor="t")
    c = bearer(owner, "read", "write")
    at = (timezone.now() + timedelta(hours=2)).isoformat()
    r = c.put(
        f"/api/v1/runs/{run.pk}/wake", json.dumps({"at": at}), content_type="application/json"
    )
    assert r.status_code == 200 and r.json()["wake_at"], r.content
    past = (timezone.now() - timedelta(hours=2)).isoformat()
    r = c.put(
        f"/api/v1/runs/{run.pk}/wake", json.dumps({"at": past}), content_type="application/json"
    )
    assert r.status_code == 422
    assert c.delete(f"/api/v1/runs/{run.pk}/wake").json()["wake_at"] is None
    assert c.delete(f"/api/v1/runs/{run.pk}/wake").status_code == 409


def test_the_schedule_list_makes_no_query_per_schedule(owner, django_assert_max_num_queries):
    from agents.schedules import cron as schedules

    run = services.create_run(RunSpec(goal="nightly", checks=["true"]), created_by=owner)
    for hour in range(6):
        schedules.create(run, f"0 {hour} * * *", actor="t")
    c = bearer(owner, "read")
    with django_assert_max_num_queries(6):
        items = c.get("/api/v1/schedules").json()["items"]
    assert len(items) == 6 and all(s["runs"] == [] for s in items)
