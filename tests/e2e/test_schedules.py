"""Schedules in a real browser against a real `serve`: a schedule made from a run's page
("Schedule this run…") is listed on the Schedules page with its next tick in its own zone."""

from __future__ import annotations

import os

import pytest

from agents import services
from agents.models import Schedule
from agents.runspec import RunSpec
from agents.schedules import cron as schedules
from tests.e2e.helpers import CHROMIUM, log_in, serving
from tests.e2e.test_accessibility import violations

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_a_schedule_made_from_a_run_page_is_listed_with_its_next_tick(pages, eve, tmp_path):
    # An external run: no worker drives it, so nothing moves while the page is used.
    run = services.create_run(
        RunSpec(goal="Nightly: tidy the docs", checks=["true"], provider="external"), created_by=eve
    )
    with serving(tmp_path) as base:
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")
        page.click("a.schedule-this")
        page.wait_for_url(f"{base}/runs/{run.pk}/schedule/")
        # A bad time zone is said plainly, on the form.
        page.fill("#id_cron", "0 9 * * MON-FRI")
        page.fill("#id_timezone", "Mars/Olympus")
        page.click("button:has-text('Make the schedule')")
        assert "unknown time zone" in page.inner_text("#field-timezone .error")
        page.fill("#id_timezone", "Europe/Paris")
        page.select_option("#id_overlap", "queue")
        page.click("button:has-text('Make the schedule')")
        page.wait_for_url(f"{base}/schedules/")
        schedule = Schedule.objects.get()
        assert schedule.template_id == run.pk and schedule.overlap == "queue"
        row = page.inner_text(f"#schedule-{schedule.pk}")
        local = schedule.next_at.astimezone(schedules.zone("Europe/Paris"))
        assert f"{local:%Y-%m-%d} 09:00 Europe/Paris" in row
        assert "0 9 * * MON-FRI" in row and "queue" in row
        assert page.locator("nav a[aria-current=page]").inner_text() == "Schedules"
        assert violations(page) == []
        page.click(f"#schedule-{schedule.pk} button:has-text('Pause')")
        page.wait_for_selector(f"#schedule-{schedule.pk} .s-paused")
        assert Schedule.objects.get().paused
        page.goto(f"{base}/triggers/?run={run.pk}")
        page.check("#id_signed")
        page.click("button:has-text('Make the trigger')")
        assert page.inner_text("#trigger-url").startswith(f"{base}/hooks/")
        assert violations(page) == []
