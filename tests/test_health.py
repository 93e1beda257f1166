from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.helpers import drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


def test_healthz_is_public_and_says_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok\n"


def test_readyz_and_metrics_need_staff_or_the_token(client, settings):
    assert client.get("/readyz").status_code == 403
    assert client.get("/metrics").status_code == 403
    settings.SHIFTLOG = {**settings.SHIFTLOG, "METRICS_TOKEN": "s3cret-token"}
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200


def test_readyz_checks_database_queue_and_channel_layer(client):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    response = client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    isolation = body.pop("isolation")
    assert body == {
        "ready": True,
        "database": "ok",
        "queue": "ok",
        "channels": "ok",
        "store": "ok",
    }
    # What runs' commands get here: bubblewrap on this machine, so runs may start.
    assert isolation["isolation"] == "bwrap" and isolation["runs_may_start"] is True
    assert isolation["limits"]["processes"] and "egress" in isolation


def test_readyz_says_when_runs_may_not_start_here(client, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ISOLATION": "subprocess", "ALLOW_UNISOLATED": False}
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    isolation = client.get("/readyz").json()["isolation"]
    assert isolation["isolation"] == "subprocess" and isolation["runs_may_start"] is False


def test_metrics_report_runs_events_approvals_leases_and_queue(client):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    done = drive_until_idle(make_run(turns=[finish_turn()]))
    waiting = drive_until_idle(
        make_run(turns=[{"tool_calls": [{"name": "bash", "input": {"command": "rm -rf x"}}]}])
    )
    text = client.get("/metrics").content.decode()
    assert 'shiftlog_runs{status="succeeded"} 1.0' in text
    assert 'shiftlog_runs{status="awaiting_approval"} 1.0' in text
    assert f"shiftlog_events_appended_total {float(done.last_seq + waiting.last_seq)}" in text
    assert "shiftlog_approvals_waiting 1.0" in text
    renewals = [
        line for line in text.splitlines() if line.startswith("shiftlog_lease_renewals_total")
    ]
    assert renewals and float(renewals[0].split()[1]) > 0
    assert "shiftlog_lease_expiries_total 0.0" in text
    assert "shiftlog_queue_depth" in text
