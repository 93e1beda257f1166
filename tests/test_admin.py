from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from agents.models import Event, RunScript, RunStatus
from tests.helpers import drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser("root", password="pw-root-123")
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "model",
    [
        "run",
        "runscript",
        "session",
        "event",
        "checkpoint",
        "artifact",
        "approval",
        "schedule",
        "scheduleevent",
        "trigger",
        "traceexport",
    ],
)
def test_every_model_has_an_admin_page(admin_client, model):
    from agents.schedules import cron as schedules
    from agents.schedules import triggers

    run = drive_until_idle(
        make_run(turns=[{"tool_calls": [{"name": "finish", "input": {"summary": "x"}}]}])
    )
    schedules.create(run, "@daily", actor="t")
    trigger, _ = triggers.create(run, secret="a-secret-of-20-chars")
    assert admin_client.get(f"/admin/agents/{model}/").status_code == 200
    if model in ("schedule", "trigger"):
        page = admin_client.get(f"/admin/agents/{model}/1/change/").content.decode()
        assert "a-secret-of-20-chars" not in page and trigger.token_hash not in page


def test_a_runs_script_is_shown_read_only_in_the_admin(admin_client):
    run = make_run(turns=[{"text": "a turn only the script knows"}])
    listing = admin_client.get("/admin/agents/runscript/")
    assert f"Run {run.pk}".encode() in listing.content
    page = admin_client.get(f"/admin/agents/runscript/{run.pk}/change/")
    assert page.status_code == 200
    assert b"a turn only the script knows" in page.content
    assert b'name="_save"' not in page.content
    post = admin_client.post(f"/admin/agents/runscript/{run.pk}/change/", {"script": "{}"})
    assert post.status_code == 403
    delete = admin_client.post(f"/admin/agents/runscript/{run.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 403
    assert RunScript.objects.get(run=run).script["turns"] == [
        {"text": "a turn only the script knows"}
    ]


def test_events_are_read_only_in_the_admin(admin_client):
    run = make_run(turns=[{"text": "x"}])
    event = Event.objects.filter(run=run).first()
    page = admin_client.get(f"/admin/agents/event/{event.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    response = admin_client.post(f"/admin/agents/event/{event.pk}/change/", {"kind": "error"})
    assert response.status_code == 403
    assert (
        admin_client.post(f"/admin/agents/event/{event.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )


def test_model_output_is_escaped_in_the_admin(admin_client):
    from agents import eventlog

    run = make_run(turns=[{"text": "x"}])
    eventlog.append(run.pk, "human.note", {"text": "<script>alert(1)</script>"})
    page = admin_client.get("/admin/agents/event/")
    assert b"<script>alert(1)</script>" not in page.content
    assert b"&lt;script&gt;" in page.content


def test_admin_actions_pause_and_cancel_runs_naming_the_user(admin_client):
    run = make_run(turns=[{"text": "x"}])
    admin_client.post("/admin/agents/run/", {"action": "pause_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    assert Event.objects.filter(run=run, kind="run.status").latest("seq").actor == "user:root"
    admin_client.post("/admin/agents/run/", {"action": "cancel_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_staff_without_the_control_permission_get_no_run_actions(client):
    user = get_user_model().objects.create_user("sam", password="pw-sam-12345", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(user)
    run = make_run(turns=[{"text": "x"}])
    page = client.get("/admin/agents/run/")
    assert page.status_code == 200
    assert b"pause_runs" not in page.content
    client.post("/admin/agents/run/", {"action": "pause_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_a_runs_history_cannot_be_deleted_in_the_admin(admin_client):
    from agents import checkpoints
    from agents.models import Checkpoint, Session

    run = make_run(turns=[{"text": "x"}])
    checkpoint = checkpoints.create(run.pk, kind="manual")
    session = Session.objects.create(run=run, index=1)
    for model, pk in (("checkpoint", checkpoint.pk), ("session", session.pk)):
        response = admin_client.post(f"/admin/agents/{model}/{pk}/delete/", {"post": "yes"})
        assert response.status_code == 403, model
    assert Checkpoint.objects.filter(pk=checkpoint.pk).exists()
    assert Session.objects.filter(pk=session.pk).exists()


# What a browser posts with the change form: the (read-only) sessions inline's management form.
INLINE = {"sessions-TOTAL_FORMS": "0", "sessions-INITIAL_FORMS": "0"}


def test_the_admin_cannot_change_a_runs_done_conditions_or_the_harnesss_fields(admin_client):
    run = make_run(turns=[{"text": "x"}], checks=["pytest -q"])
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    for field in ("checks", "goal", "resume_state", "branch_seq", "lease_renewals"):
        assert f'name="{field}"' not in page, field  # shown, not editable
    before = Event.objects.filter(run=run).count()
    admin_client.post(
        f"/admin/agents/run/{run.pk}/change/",
        {"checks": "true", "goal": "cheat", "branch_seq": "99", "tool_policy": "[]", **INLINE},
    )
    run.refresh_from_db()
    assert run.checks == ["pytest -q"] and run.goal != "cheat" and run.branch_seq == 0
    assert Event.objects.filter(run=run).count() == before  # nothing changed: nothing logged


def test_a_policy_changed_in_the_admin_goes_through_the_service_and_is_an_event(admin_client):
    run = make_run(turns=[{"text": "x"}])
    rules = '[{"tool": "bash", "pattern": "^make", "action": "allow"}]'
    response = admin_client.post(
        f"/admin/agents/run/{run.pk}/change/", {"tool_policy": rules, **INLINE}
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.tool_policy == [{"tool": "bash", "pattern": "^make", "action": "allow"}]
    change = Event.objects.get(run=run, kind="run.updated")
    assert change.actor == "user:root" and change.payload["because"] == "changed in the admin"
    bad = admin_client.post(
        f"/admin/agents/run/{run.pk}/change/", {"tool_policy": '[{"tool": "bash"}]', **INLINE}
    )
    assert bad.status_code == 200 and b"action must be one of" in bad.content


def test_runs_are_not_deleted_in_the_admin_and_actions_read_plainly(admin_client):
    run = make_run(turns=[{"text": "x"}])
    listing = admin_client.get("/admin/agents/run/").content.decode()
    assert "Pause the selected runs" in listing and "delete_selected" not in listing
    assert (
        admin_client.post(f"/admin/agents/run/{run.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    done = admin_client.post(
        "/admin/agents/run/",
        {"action": "pause_runs", "_selected_action": [run.pk]},
        follow=True,
    ).content.decode()
    assert f"Run {run.pk} paused." in done
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED


def test_webhook_deliveries_are_shown_read_only_by_state(admin_client):
    from agents.models import WebhookDelivery

    run = make_run(turns=[finish_turn()])
    for n, fields in enumerate(
        [
            {},
            {"delivered_at": timezone.now()},
            {"failed_at": timezone.now(), "last_error": "HTTP 500"},
        ]
    ):
        WebhookDelivery.objects.create(
            run=run,
            url=f"https://hooks.example/{n}",
            payload={"event": "<b>run.paused</b>"},
            **fields,
        )
    page = admin_client.get("/admin/agents/webhookdelivery/").content.decode()
    assert "3 webhook deliveries" in page and "&lt;b&gt;run.paused&lt;/b&gt;" in page
    for state, url in (("pending", "/0"), ("delivered", "/1"), ("failed", "/2")):
        shown = admin_client.get(f"/admin/agents/webhookdelivery/?state={state}").content.decode()
        assert f"hooks.example{url}" in shown and "1 webhook delivery" in shown, state
    assert admin_client.get("/admin/agents/webhookdelivery/add/").status_code == 403
    one = WebhookDelivery.objects.first()
    assert admin_client.post(f"/admin/agents/webhookdelivery/{one.pk}/delete/").status_code == 403
