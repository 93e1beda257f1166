"""The new-run form in a real browser: the unavailable provider shown disabled, policy rows
added with a button, and "Run again with changes" filling the form from a run."""

from __future__ import annotations

import os
import re

import pytest

from agents.models import Run
from tests.e2e.helpers import CHROMIUM, log_in, serving

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_policy_rows_and_run_again_with_changes(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.5") as base:
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/new/?demo=1")
        anthropic = page.locator("#id_provider option[value=anthropic]")
        assert anthropic.is_disabled() and "ANTHROPIC_API_KEY" in anthropic.inner_text()
        before = page.locator("#rule-rows tr").count()
        page.click("button.add-rule")
        assert page.locator("#rule-rows tr").count() == before + 1
        last = page.locator("#rule-rows tr").last
        last.locator("input[name$='-tool']").fill("bash")
        last.locator("input[name$='-pattern']").fill("^curl ")
        last.locator("select[name$='-action']").select_option("deny")
        page.fill("#id_webhook_urls", "https://hooks.example.com/shiftlog")
        page.fill("#id_approval_timeout_seconds", "900")
        page.click("button:has-text('Start run')")
        page.wait_for_url(re.compile(r".*/runs/\d+/$"))
        run = Run.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
        assert {"tool": "bash", "action": "deny", "pattern": "^curl "} in run.tool_policy
        assert run.webhook_urls == ["https://hooks.example.com/shiftlog"]
        assert run.approval_timeout_seconds == 900

        page.click("a.again")
        page.wait_for_url(f"**/runs/new/?from={run.pk}")
        assert page.input_value("#id_goal") == run.goal
        assert page.input_value("#id_approval_timeout_seconds") == "900"
        patterns = page.eval_on_selector_all(
            "#rule-rows input[name$='-pattern']", "els => els.map(e => e.value)"
        )
        assert "^curl " in patterns
        page.fill("#id_goal", run.goal + " Keep it short.")
        page.click("button:has-text('Start run')")
        page.wait_for_url(re.compile(r".*/runs/\d+/$"))
        again = Run.objects.order_by("-pk").first()
        assert again.pk != run.pk and again.goal.endswith("Keep it short.")
        assert again.script_name == run.script_name  # the same script, played again
        assert {"tool": "bash", "action": "deny", "pattern": "^curl "} in again.tool_policy
        # (Last: a full-page screenshot resizes the page, and Chromium then drops the next click.)
        page.goto(f"{base}/runs/new/?from={again.pk}")
        page.screenshot(path=str(shots / "new-run-form.png"), full_page=True)
