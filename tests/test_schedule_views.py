"""The Schedules and Triggers pages: login required, permissions checked in the view, clear form
errors (never a 500 on a bad cron or time zone), the token shown once, the wake-up on the run
page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from agents import services
from agents.models import Run, Schedule, Trigger
from agents.runspec import RunSpec
from agents.schedules import cron as schedules
from agents.schedules import triggers
from tests.helpers import client_for, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(owner):
    return make_run(goal="tidy the docs", created_by=owner)


def test_the_pages_need_a_login(run):
    for url in ["/schedules/", "/triggers/", f"/runs/{run.pk}/schedule/"]:
        r = Client().get(url)
        assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    assert Client().post(f"/runs/{run.pk}/wake/cancel").status_code == 302
    assert Client().post("/schedules/1/pause").status_code == 302


def test_schedule_this_run_makes_a_schedule_listed_with_its_next_tick(owner, run):
    c = client_for(owner)
    page = c.get(f"/runs/{run.pk}/").content.decode()
    assert "Schedule this run…" in page
    assert c.get(f"/runs/{run.pk}/schedule/").status_code == 200
    r = c.post(f"/runs/{run.pk}/schedule/",
               {"cron": "30 6 * * *", "timezone": "Europe/Paris", "overlap": "queue"})  # fmt: skip
    assert r.status_code == 302 and r["Location"] == "/schedules/"
    schedule = Schedule.objects.get()
    assert schedule.created_by == owner and schedule.overlap == "queue"
    listing = c.get("/schedules/").content.decode()
    local = schedule.next_at.astimezone(schedules.zone("Europe/Paris"))
    assert f"{local:%Y-%m-%d} 06:30 Europe/Paris" in listing
    assert "schedule.created" in listing


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cron": "every day", "timezone": "UTC", "overlap": "skip"}, "five fields"),
        ({"cron": "99 * * * *", "timezone": "UTC", "overlap": "skip"}, "bad minute"),
        (
            {"cron": "@daily", "timezone": "Nowhere/Atlantis", "overlap": "skip"},
            "unknown time zone",
        ),
        ({"cron": "@daily", "timezone": "UTC", "overlap": "sometimes"}, "valid choice"),
        ({"cron": "", "timezone": "UTC", "overlap": "skip"}, "required"),
    ],
)
def test_bad_schedule_forms_say_what_to_change(owner, run, data, message):
    r = client_for(owner).post(f"/runs/{run.pk}/schedule/", data)
    assert r.status_code == 400
    assert message in r.content.decode()
    assert not Schedule.objects.exists()


def test_only_who_may_control_the_run_may_schedule_it_or_change_its_schedule(
    owner, run, viewer, outsider, supervisor
):
    data = {"cron": "@daily", "timezone": "UTC", "overlap": "skip"}
    assert client_for(viewer).post(f"/runs/{run.pk}/schedule/", data).status_code == 403
    assert client_for(outsider).post(f"/runs/{run.pk}/schedule/", data).status_code == 404
    schedule = schedules.create(run, "@daily", actor="t", created_by=owner)
    # The viewer sees it but has no buttons and may not pause it; the outsider sees nothing.
    page = client_for(viewer).get("/schedules/").content.decode()
    assert f'id="schedule-{schedule.pk}"' in page and "schedule-pause" not in page
    assert f"/schedules/{schedule.pk}/pause" not in page
    assert client_for(viewer).post(f"/schedules/{schedule.pk}/pause").status_code == 403
    assert (
        f'id="schedule-{schedule.pk}"'
        not in client_for(outsider).get("/schedules/").content.decode()
    )
    assert client_for(outsider).post(f"/schedules/{schedule.pk}/delete").status_code == 404
    c = client_for(supervisor)
    assert c.post(f"/schedules/{schedule.pk}/pause").status_code == 302
    assert Schedule.objects.get().paused
    again = c.post(f"/schedules/{schedule.pk}/pause", follow=True).content.decode()
    assert "already paused" in again
    c.post(f"/schedules/{schedule.pk}/resume")
    assert not Schedule.objects.get().paused
    r = c.post(f"/schedules/{schedule.pk}/delete", headers={"HX-Request": "true"})
    assert r.status_code == 200 and r["HX-Redirect"] == "/schedules/"
    assert not Schedule.objects.exists()


def test_a_trigger_made_on_the_page_shows_its_url_once(owner, run):
    c = client_for(owner)
    assert f'value="{run.pk}"' in c.get(f"/triggers/?run={run.pk}").content.decode()
    r = c.post("/triggers/", {"run": run.pk, "signed": "on", "goal": "Fix {payload.title}"})
    assert r.status_code == 200
    page = r.content.decode()
    trigger = Trigger.objects.get()
    assert trigger.secret and trigger.secret in page and trigger.goal == "Fix {payload.title}"
    assert r["Cache-Control"] == "no-store"
    url = page.split('id="trigger-url">')[1].split("<")[0]
    assert url.startswith("http://testserver/hooks/")
    assert triggers.find(url.rstrip("/").rsplit("/", 1)[1]) == trigger
    listing = c.get("/triggers/").content.decode()
    assert trigger.secret not in listing and url not in listing
    assert f"/hooks/{trigger.token_prefix}…/" in listing
    r = c.post(f"/triggers/{trigger.pk}/revoke", follow=True)
    assert "revoked" in r.content.decode()
    assert Trigger.objects.get().revoked_at is not None


def test_trigger_form_errors_and_permissions(owner, run, viewer, outsider):
    c = client_for(owner)
    r = c.post("/triggers/", {"run": "abc"})
    assert r.status_code == 400 and "whole number" in r.content.decode()
    r = c.post("/triggers/", {"run": run.pk, "goal": "{payload.a..b}"})
    assert r.status_code == 400 and "not a place" in r.content.decode()
    assert client_for(viewer).post("/triggers/", {"run": run.pk}).status_code == 403
    assert client_for(outsider).post("/triggers/", {"run": run.pk}).status_code == 404
    assert not Trigger.objects.exists()
    trigger, _ = triggers.create(run, created_by=owner)
    assert client_for(viewer).post(f"/triggers/{trigger.pk}/revoke").status_code == 403
    assert client_for(outsider).post(f"/triggers/{trigger.pk}/revoke").status_code == 404


def test_the_run_page_shows_a_wake_up_that_can_be_cancelled(owner, run, viewer):
    services.pause_run(run.pk, actor="x")
    when = datetime.now(UTC) + timedelta(hours=3)
    services.wake_at(run.pk, when, actor="x")
    page = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "Wakes at" in page and "Cancel the wake-up" in page
    watcher = client_for(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert "Wakes at" in watcher and "Cancel the wake-up" not in watcher
    assert client_for(viewer).post(f"/runs/{run.pk}/wake/cancel").status_code == 403
    r = client_for(owner).post(f"/runs/{run.pk}/wake/cancel", follow=True)
    assert "will not wake" in r.content.decode()
    assert Run.objects.get(pk=run.pk).wake_at is None
    assert "Wakes at" not in client_for(owner).get(f"/runs/{run.pk}/").content.decode()


def test_a_run_made_by_a_schedule_says_so(owner, run):
    schedule = schedules.create(run, "@daily", actor="t", created_by=owner)
    made = schedules.run_from_template(run, actor="t", created_by=owner, schedule=schedule)
    page = client_for(owner).get(f"/runs/{made.pk}/").content.decode()
    assert f"schedule {schedule.pk}" in page


def test_a_person_sets_a_paused_runs_wake_up_from_its_page(owner):
    from datetime import timedelta

    from django.utils import timezone

    from agents import services
    from agents.models import Run
    from tests.helpers import client_for

    run = services.create_run(RunSpec(goal="later", checks=["true"]), created_by=owner)
    services.pause_run(run.pk, actor="t")
    c = client_for(owner)
    page = c.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="wake-form"' in page
    when = (timezone.now() + timedelta(days=1)).astimezone(timezone.get_fixed_timezone(60))
    c.post(
        f"/runs/{run.pk}/wake", {"at": when.strftime("%Y-%m-%dT%H:%M"), "timezone": "Europe/Paris"}
    )
    run.refresh_from_db()
    assert run.wake_at is not None
    assert abs((run.wake_at - when).total_seconds()) < 3700  # Paris is UTC+1 or +2
    page = c.get(f"/runs/{run.pk}/").content.decode()
    assert "Wakes at" in page and 'id="wake-form"' not in page
    # Bad input: a clear message, nothing set.
    services.cancel_wake(run.pk, actor="t")
    for at, tz in (
        ("tomorrow", "UTC"),
        ("2001-01-01T09:00", "UTC"),
        ("2099-01-01T09:00", "Mars/Base"),
    ):
        response = c.post(f"/runs/{run.pk}/wake", {"at": at, "timezone": tz}, follow=True)
        assert response.status_code == 200
        assert Run.objects.get(pk=run.pk).wake_at is None
        assert list(response.context["messages"])  # told why
