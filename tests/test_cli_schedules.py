"""The schedule, trigger and wake-up commands: what they print, and clear errors (exit 2)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents import services
from agents.models import Run, Schedule, Trigger
from tests.helpers import make_run

pytestmark = pytest.mark.django_db


def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def refused(*args: str, match: str) -> None:
    with pytest.raises(CommandError, match=match) as e:
        cli(*args)
    assert e.value.returncode == 2


def test_schedule_run_prints_the_id_last_and_schedules_lists_it(owner):
    tpl = make_run(created_by=owner)
    out = cli("schedule_run", "--from-run", str(tpl.pk), "--cron", "0 9 * * MON-FRI",
              "--timezone", "Europe/Paris", "--overlap", "queue")  # fmt: skip
    schedule = Schedule.objects.get(pk=int(out.strip().splitlines()[-1]))
    assert schedule.template == tpl and schedule.overlap == "queue"
    assert schedule.created_by == owner
    assert "next tick: " in out and "(Europe/Paris)" in out
    listed = json.loads(cli("schedules", "--json"))
    assert listed[0]["id"] == schedule.pk
    assert listed[0]["next_at"] == schedule.next_at.isoformat()
    assert "0 9 * * MON-FRI" in cli("schedules")
    cli("pause_schedule", str(schedule.pk))
    assert json.loads(cli("schedules", "--json"))[0]["paused"] is True
    assert "paused" in cli("schedules")
    assert "next tick" in cli("resume_schedule", str(schedule.pk))
    cli("delete_schedule", str(schedule.pk))
    assert cli("schedules").strip() == "no schedules"
    assert Run.objects.filter(pk=tpl.pk).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedule_run", "--from-run", "999", "--cron", "* * * * *"], "no run with id 999"),
        (["schedule_run", "--from-run", "{tpl}", "--cron", "61 * * * *"], "bad minute"),
        (["schedule_run", "--from-run", "{tpl}", "--cron", "* *"], "five fields"),
        (
            ["schedule_run", "--from-run", "{tpl}", "--cron", "@daily", "--timezone", "Mars/X"],
            "unknown time zone",
        ),
        (["schedule_run", "--from-run", "{tpl}", "--cron", "@daily", "--user", "no"], "no user"),
        (["pause_schedule", "999"], "no schedule with id 999"),
        (["resume_schedule", "999"], "no schedule with id 999"),
        (["delete_schedule", "999"], "no schedule with id 999"),
        (["revoke_trigger", "999"], "no trigger with id 999"),
        (["create_trigger", "--from-run", "999"], "no run with id 999"),
        (["create_trigger", "--from-run", "{tpl}", "--base-url", "ftp://x"], "must start with"),
        (["create_trigger", "--from-run", "{tpl}", "--goal", "{payload.}"], "not a place"),
    ],
)
def test_bad_schedule_and_trigger_commands_exit_2(args, message):
    tpl = make_run()
    refused(*[a.replace("{tpl}", str(tpl.pk)) for a in args], match=message)


def test_schedule_run_refuses_a_user_who_may_not_control_the_run(owner, outsider):
    tpl = make_run(created_by=owner)
    refused("schedule_run", "--from-run", str(tpl.pk), "--cron", "@daily", "--user", "otto",
            match="may not control")  # fmt: skip
    refused("create_trigger", "--from-run", str(tpl.pk), "--user", "otto", match="may not control")


def test_create_trigger_prints_the_url_last_and_triggers_lists_it():
    tpl = make_run()
    out = cli("create_trigger", "--from-run", str(tpl.pk), "--secret",
              "--base-url", "https://shiftlog.example")  # fmt: skip
    url = out.strip().splitlines()[-1]
    assert url.startswith("https://shiftlog.example/hooks/") and url.endswith("/")
    trigger = Trigger.objects.get()
    assert trigger.secret and f"secret: {trigger.secret}" in out
    token = url.rstrip("/").rsplit("/", 1)[-1]
    assert trigger.token_prefix == token[:6] and token not in cli("triggers")
    assert json.loads(cli("triggers", "--json"))[0]["signed"] is True
    cli("revoke_trigger", str(trigger.pk))
    assert "revoked" in cli("triggers")
    refused("revoke_trigger", str(trigger.pk), match="already revoked")


def test_resume_run_at_a_time_and_its_errors():
    run = make_run()
    refused("resume_run", str(run.pk), "--at", "2099-01-01T00:00:00Z", match="only a paused run")
    services.pause_run(run.pk, actor="x")
    refused("resume_run", str(run.pk), "--at", "tomorrow", match="not an ISO 8601")
    refused("resume_run", str(run.pk), "--at", "2001-01-01T00:00:00Z", match="in the past")
    refused("resume_run", str(run.pk), "--at", "2099-01-01T00:00:00", match="needs a time zone")
    refused("resume_run", str(run.pk), "--cancel-wake", match="no wake-up")
    when = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    out = cli("resume_run", str(run.pk), "--at", when.isoformat().replace("+00:00", "Z"))
    assert f"wakes at {when.isoformat()}" in out
    assert Run.objects.get(pk=run.pk).wake_at == when
    assert "no wake-up" in cli("resume_run", str(run.pk), "--cancel-wake")
    assert Run.objects.get(pk=run.pk).wake_at is None
