"""An external run in a real browser against a real `serve`, its agent played over real HTTP
through the API: created from the new-run form, marked as external, its last contact following
the agent's calls live; a run with a heartbeat of 2 s shown stalled once its agent goes quiet,
without a reload; the Overview counts it; axe finds nothing serious on it, light or dark."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from io import StringIO

import httpx
import pytest
from django.core.management import call_command

from agents.models import Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, wait_js
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


def token_for(name: str) -> str:
    out = StringIO()
    call_command("create_token", "--user", name, "--scopes", "read,write", stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def state_text(page) -> str:
    return page.inner_text("#run-state").replace("\xa0", " ")


def test_an_external_run_is_marked_followed_and_shown_stalled(pages, eve, tmp_path, shots):
    with serving(tmp_path) as base:
        agent = httpx.Client(
            base_url=f"{base}/api/v1",
            headers={"Authorization": f"Bearer {token_for('eve')}"},
            timeout=30,
        )
        page = pages()
        log_in(page, base)

        # Created from the web: the heartbeat field appears for the external agent alone.
        page.goto(f"{base}/runs/new/")
        assert page.locator("#field-heartbeat_seconds").is_hidden()
        page.fill("#id_goal", "Write done.txt, driven from outside")
        page.fill("#id_checks", "test -f done.txt")
        page.select_option("#id_provider", "external")
        assert page.locator("#field-heartbeat_seconds").is_visible()
        assert page.locator("#field-provider a[href='/api/v1/docs']").count() == 1
        page.fill("#id_heartbeat_seconds", "600")
        page.click("button:has-text('Start run')")
        page.wait_for_url(re.compile(r".*/runs/\d+/$"))
        run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        run = Run.objects.get(pk=run_id)
        assert run.is_external and run.heartbeat_seconds == 600
        page.wait_for_selector("#live-state.on")
        assert page.inner_text("#run-state .badge.external") == "external agent"
        assert "no contact yet" in state_text(page)

        # Its agent calls in over HTTP: session, a turn, a tool call and its result. The page
        # follows live (a turn pushes the state), with no reload.
        page.evaluate("window.__notReloaded = true")
        assert agent.get(f"/runs/{run_id}/context").status_code == 200
        turn = agent.post(
            f"/runs/{run_id}/turns",
            json={"text": "Looking around.", "model": "outside-model", "input_tokens": 120,
                  "output_tokens": 30},
        )  # fmt: skip
        assert turn.status_code == 201, turn.text
        call = agent.post(
            f"/runs/{run_id}/tool-calls", json={"tool": "bash", "input": {"command": "ls"}}
        ).json()
        assert call["decision"] == "allow", call
        done = agent.post(
            f"/tool-calls/{call['id']}/result", json={"output": "", "is_error": False}
        )
        assert done.status_code in (200, 201), done.text
        wait_js(page, "document.querySelector('#run-state time') !== null", timeout=15_000)
        wait_js(page, "document.querySelectorAll('#events [data-seq]').length >= 4")
        assert re.search(r"last contact \d+ s ago", state_text(page)), state_text(page)
        # As of the turn (pushed); the tool call's contact a moment later shows at the next
        # timed re-read.
        shown = datetime.fromisoformat(page.get_attribute("#run-state time", "datetime"))
        latest = Run.objects.get(pk=run_id).last_contact_at
        assert timedelta(0) <= latest - shown < timedelta(seconds=10), (shown, latest)
        assert page.locator("#run-state .badge.stalled").count() == 0
        assert page.evaluate("window.__notReloaded") is True
        page.screenshot(path=str(shots / "external-run.png"), full_page=True)

        # A run with a heartbeat of 2 s: its agent calls once, then goes quiet. The page shows
        # it stalled by itself (its state is re-read on a timer: nothing is pushed).
        made = agent.post(
            "/runs",
            json={"goal": "Quiet agent", "checks": ["test -f done.txt"], "provider": "external",
                  "heartbeat_seconds": 2},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        quiet = made.json()["id"]
        assert agent.post(f"/runs/{quiet}/heartbeat").status_code == 200
        page.goto(f"{base}/runs/{quiet}/")
        page.evaluate("window.__notReloaded = true")
        wait_js(page, "document.querySelector('#run-state .badge.stalled') !== null", 15_000)
        assert page.evaluate("window.__notReloaded") is True
        title = page.get_attribute("#run-state .badge.stalled", "title")
        assert "(2 s)" in title, title
        assert "last contact" in state_text(page)
        page.screenshot(path=str(shots / "external-stalled.png"), full_page=True)
        assert not violations(page)

        # The list and the Overview say so too; the first run, heard from, is not stalled.
        page.goto(f"{base}/?stalled=1")
        assert page.locator(f"#run-{quiet} .badge.stalled").count() == 1
        assert page.locator(f"#run-{run_id}").count() == 0
        assert not violations(page)
        page.goto(f"{base}/overview/")
        assert page.inner_text("#stalled-count b") == "1"
        assert re.search(r"silent for \d+ s", page.inner_text(f"#stalled-{quiet}"))
        page.screenshot(path=str(shots / "external-overview.png"), full_page=True)

        dark = pages(color_scheme="dark")
        log_in(dark, base)
        dark.goto(f"{base}/runs/{quiet}/")
        dark.wait_for_selector("#run-state .badge.stalled")
        dark.screenshot(path=str(shots / "external-stalled-dark.png"), full_page=True)
        assert not violations(dark)
        dark.goto(f"{base}/?provider=external")
        assert dark.locator("tr[id^=run-] .badge.external").count() == 2
        dark.screenshot(path=str(shots / "external-list-dark.png"), full_page=True)
        assert not violations(dark)
