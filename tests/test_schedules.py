"""Schedules: ticks fired with an injected clock, the misfire and overlap rules, one firing per
tick however many processes look, pausing; and a paused run's wake-up."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from agents import services
from agents.models import EventKind, Overlap, Run, RunScript, RunStatus, Schedule
from agents.schedules import cron as schedules
from tests.helpers import make_run

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)  # a Monday


def template(owner=None, **kwargs) -> Run:
    run = make_run(
        goal="nightly: tidy the docs",
        checks=["true", "test -f x"],
        turns=[{"text": "hi", "tool_calls": []}],
        max_turns_per_session=7,
        budgets=services.Budgets(max_tokens=5000, max_cost_usd="1.5"),
        tool_policy=[{"tool": "bash", "action": "ask"}],
        created_by=owner,
        **kwargs,
    )
    return run


def ended(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)


def ticks(schedule: Schedule) -> list[tuple[str, dict]]:
    return [(e.kind, e.payload) for e in schedule.events.order_by("pk")]


def test_cron_and_time_zone_are_checked_clearly():
    assert schedules.clean_cron("  0 9   * * MON-FRI ") == "0 9 * * MON-FRI"
    assert schedules.clean_cron("@daily") == "@daily"
    for bad, words in [
        ("", "needs a cron"),
        ("* * *", "five fields"),
        ("0 0 0 * * *", "five fields"),
        ("61 * * * *", "bad minute"),
        ("0 0 30 2 *", "bad day-of-month"),
    ]:
        with pytest.raises(schedules.ScheduleError, match=words):
            schedules.clean_cron(bad)
    for bad in ["Mars/Olympus", "", "../../etc/passwd", "x" * 100]:
        with pytest.raises(schedules.ScheduleError, match="time zone"):
            schedules.zone(bad)


def test_next_tick_follows_the_time_zone():
    # 09:00 in Paris is 08:00 UTC in March (before the clocks change).
    at = schedules.next_tick("0 9 * * *", "Europe/Paris", T0)
    assert at == datetime(2026, 3, 3, 8, 0, tzinfo=UTC)
    assert schedules.next_tick("0 9 * * *", "UTC", T0) == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_a_daily_tick_keeps_its_local_hour_across_a_dst_change():
    # Paris moves its clocks on 2026-03-29: 09:00 local is 08:00 UTC before, 07:00 after.
    before = schedules.next_tick("0 9 * * *", "Europe/Paris", datetime(2026, 3, 28, 9, tzinfo=UTC))
    after = schedules.next_tick("0 9 * * *", "Europe/Paris", before)
    assert before == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    assert after == datetime(2026, 3, 30, 7, 0, tzinfo=UTC)
    earlier = schedules.next_tick("0 9 * * *", "Europe/Paris", datetime(2026, 3, 27, 9, tzinfo=UTC))
    assert earlier == datetime(2026, 3, 28, 8, 0, tzinfo=UTC)


def test_a_tick_makes_a_run_from_the_template(owner, tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "x").write_text("seeded")
    tpl = template(owner, workspace_from=seed, protected_paths=["x"])
    schedule = schedules.create(tpl, "0 9 * * *", created_by=owner, actor="user:olivia", now=T0)
    assert schedule.next_at == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert schedules.tick(T0 + timedelta(minutes=29)) == {"fired": [], "woken": []}
    assert schedules.tick(T0 + timedelta(minutes=30)) == {"fired": [schedule.pk], "woken": []}
    run = Run.objects.get(schedule=schedule)
    assert run.goal == tpl.goal and run.checks == tpl.checks
    assert run.max_tokens == 5000 and str(run.max_cost_usd) == "1.500000"
    assert run.max_turns_per_session == 7 and run.tool_policy == tpl.tool_policy
    assert run.created_by == owner and run.status == RunStatus.QUEUED
    assert RunScript.objects.get(run=run).script == RunScript.objects.get(run=tpl).script
    assert (run.workspace_path / "x").read_text() == "seeded"
    assert set(run.protected) == {"x"}
    created = run.events.get(kind=EventKind.RUN_CREATED)
    assert created.payload["origin"] == {"template": tpl.pk, "schedule": schedule.pk}
    assert created.actor == f"schedule:{schedule.pk}"
    assert created.payload["workspace_from"] == str(seed)
    schedule.refresh_from_db()
    assert schedule.next_at == datetime(2026, 3, 3, 9, 0, tzinfo=UTC)
    kinds = ticks(schedule)
    assert [k for k, _ in kinds] == ["schedule.created", "tick.fired"]
    assert kinds[1][1] == {"tick": "2026-03-02T09:00:00+00:00", "missed": 0, "run": run.pk}


def test_after_downtime_a_schedule_fires_once_for_the_latest_missed_tick(owner):
    tpl = template(owner)
    schedule = schedules.create(tpl, "0 * * * *", actor="t", now=T0)  # hourly
    later = T0 + timedelta(hours=5, minutes=10)  # 09:00 … 13:00 missed: five ticks
    assert schedules.tick(later)["fired"] == [schedule.pk]
    assert Run.objects.filter(schedule=schedule).count() == 1
    kind, payload = ticks(schedule)[-1]
    assert kind == "tick.fired"
    assert payload["tick"] == "2026-03-02T13:00:00+00:00" and payload["missed"] == 4
    schedule.refresh_from_db()
    assert schedule.next_at == datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    assert schedules.tick(later)["fired"] == []  # nothing more until 14:00


def test_a_very_long_downtime_still_fires_once():
    schedule = schedules.create(template(), "* * * * *", actor="t", now=T0)
    schedules.tick(T0 + timedelta(days=30))
    assert Run.objects.filter(schedule=schedule).count() == 1
    payload = ticks(schedule)[-1][1]
    assert payload["missed_at_least"] is True
    assert payload["tick"] == (T0 + timedelta(days=30)).isoformat()


def test_overlap_skip_records_a_skipped_tick_while_the_previous_run_is_live():
    schedule = schedules.create(template(), "0 * * * *", actor="t", now=T0)
    schedules.tick(T0 + timedelta(hours=1))
    first = Run.objects.get(schedule=schedule)
    schedules.tick(T0 + timedelta(hours=2))
    assert Run.objects.filter(schedule=schedule).count() == 1
    kind, payload = ticks(schedule)[-1]
    assert kind == "tick.skipped" and payload["run"] == first.pk
    assert "still live" in payload["reason"]
    ended(first)
    schedules.tick(T0 + timedelta(hours=3))
    assert Run.objects.filter(schedule=schedule).count() == 2


def test_overlap_queue_makes_a_run_anyway():
    schedule = schedules.create(template(), "0 * * * *", overlap=Overlap.QUEUE, actor="t", now=T0)
    schedules.tick(T0 + timedelta(hours=1))
    schedules.tick(T0 + timedelta(hours=2))
    assert Run.objects.filter(schedule=schedule, status=RunStatus.QUEUED).count() == 2


def test_a_claimed_tick_is_not_fired_again_by_a_second_process():
    schedule = schedules.create(template(), "0 * * * *", actor="t", now=T0)
    stale = Schedule.objects.get(pk=schedule.pk)  # what a second process read before the claim
    assert schedules.fire(schedule.pk, T0 + timedelta(hours=1)) is not None
    # The second process's conditional UPDATE names the next_at it read: it matches nothing.
    claimed = Schedule.objects.filter(pk=stale.pk, next_at=stale.next_at, paused=False).update(
        next_at=None
    )
    assert claimed == 0
    assert schedules.fire(schedule.pk, T0 + timedelta(hours=1)) is None
    assert Run.objects.filter(schedule=schedule).count() == 1
    assert schedules.fire(schedule.pk + 1, T0 + timedelta(hours=1)) is None  # deleted meanwhile


@pytest.mark.django_db(transaction=True)
def test_two_threads_firing_at_once_make_one_run():
    from django.db import connection

    schedule = schedules.create(template(), "0 * * * *", actor="t", now=T0)
    at = T0 + timedelta(hours=1)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def claimer():
        try:
            barrier.wait()
            for _ in range(20):  # SQLite may say "locked": a later pass would try again
                try:
                    results.append(schedules.fire(schedule.pk, at))
                    break
                except Exception as e:
                    if "locked" not in str(e):
                        raise
        except Exception as e:
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert Run.objects.filter(schedule=schedule).count() == 1
    assert [e.kind for e in schedule.events.all()].count("tick.fired") == 1


def test_a_paused_schedule_fires_nothing_and_resumes_from_now():
    schedule = schedules.create(template(), "0 * * * *", actor="t", now=T0)
    schedules.pause(schedule.pk, actor="user:x")
    with pytest.raises(schedules.ScheduleError, match="already paused"):
        schedules.pause(schedule.pk, actor="user:x")
    assert schedules.tick(T0 + timedelta(hours=3))["fired"] == []
    schedules.resume(schedule.pk, actor="user:x", now=T0 + timedelta(hours=3, minutes=5))
    schedule.refresh_from_db()
    assert schedule.next_at == datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # no making up
    with pytest.raises(schedules.ScheduleError, match="not paused"):
        schedules.resume(schedule.pk, actor="user:x")
    assert [k for k, _ in ticks(schedule)] == [
        "schedule.created",
        "schedule.paused",
        "schedule.resumed",
    ]


def test_a_failed_tick_is_recorded_and_the_schedule_moves_on(tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    schedule = schedules.create(template(workspace_from=seed), "0 * * * *", actor="t", now=T0)
    seed.rmdir()  # the template's workspace source is gone
    schedules.tick(T0 + timedelta(hours=1))
    kind, payload = ticks(schedule)[-1]
    assert kind == "tick.failed" and "is not a folder" in payload["error"]
    schedule.refresh_from_db()
    assert schedule.next_at == datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def test_schedule_events_are_append_only():
    from agents.models.schedules import ImmutableScheduleEvent

    schedule = schedules.create(template(), "0 * * * *", actor="t", now=T0)
    event = schedule.events.get()
    event.kind = "tick.fired"
    with pytest.raises(ImmutableScheduleEvent):
        event.save()


# --- wake at ---------------------------------------------------------------------------------
def paused_run() -> Run:
    run = template()
    return services.pause_run(run.pk, actor="user:x")


def test_a_paused_run_wakes_at_its_time():
    run = paused_run()
    when = datetime.now(UTC) + timedelta(hours=2)
    services.wake_at(run.pk, when, actor="user:x")
    run.refresh_from_db()
    assert run.wake_at == when
    assert schedules.tick(when - timedelta(seconds=1))["woken"] == []
    assert schedules.tick(when)["woken"] == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.wake_at is None
    assert run.events.filter(kind="run.status").last().actor == "scheduler:wake"


def test_wake_at_refuses_the_past_a_naive_time_and_a_run_not_paused():
    run = paused_run()
    with pytest.raises(services.RunError, match="in the past"):
        services.wake_at(run.pk, datetime.now(UTC) - timedelta(minutes=1), actor="x")
    with pytest.raises(services.RunError, match="time zone"):
        services.wake_at(run.pk, datetime(2099, 1, 1), actor="x")
    other = template()
    with pytest.raises(services.RunError, match="only a paused run"):
        services.wake_at(other.pk, datetime.now(UTC) + timedelta(hours=1), actor="x")


def test_a_wake_up_can_be_cancelled_and_a_manual_resume_clears_it():
    run = paused_run()
    when = datetime.now(UTC) + timedelta(hours=1)
    services.wake_at(run.pk, when, actor="x")
    services.cancel_wake(run.pk, actor="user:x")
    assert Run.objects.get(pk=run.pk).wake_at is None
    with pytest.raises(services.RunError, match="no wake-up"):
        services.cancel_wake(run.pk, actor="user:x")
    services.wake_at(run.pk, when, actor="x")
    services.resume_run(run.pk, actor="user:x")
    assert Run.objects.get(pk=run.pk).wake_at is None


def test_a_wake_up_of_a_run_no_longer_paused_does_nothing():
    run = paused_run()
    when = datetime.now(UTC) + timedelta(hours=1)
    services.wake_at(run.pk, when, actor="x")
    services.cancel_run(run.pk, actor="x")
    assert schedules.tick(when)["woken"] == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.wake_at is None
