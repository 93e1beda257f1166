"""What people do with a run, in a real browser: an edit before approving (JSON, shown as what
was asked against what ran), the admin that cannot bend the audit trail, and getting back in
after logging out."""

from __future__ import annotations

import os
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings

from agents import services
from agents.models import Approval, Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, wait_js
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def waiting_demo(eve) -> tuple[Run, Approval]:
    run = services.create_demo_run(created_by=eve)
    wait_for(lambda: run.approvals.filter(status="pending").exists(), timeout=90, what="approval")
    return run, run.approvals.get(status="pending")


def test_an_edit_is_json_and_the_card_shows_asked_against_ran(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run, approval = waiting_demo(eve)
        asked = approval.tool_input["command"]
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")
        card = page.locator(f"#approval-{approval.pk}")
        card.locator("details.edit summary").click()
        # The README's old habit: a bare command, not JSON. Refused, clearly; nothing ran.
        card.locator("textarea[name=input]").fill("rm -rf build")
        card.locator("button[value=edit]").click()
        wait_js(page, f"document.querySelector('#approval-{approval.pk} .error') !== null")
        assert "JSON" in page.inner_text(f"#approval-{approval.pk} .error")
        assert Approval.objects.get(pk=approval.pk).status == "pending"
        # JSON, as the CLI takes it: approved as edited.
        card = page.locator(f"#approval-{approval.pk}")
        if not card.locator("details.edit").get_attribute("open"):
            card.locator("details.edit summary").click()
        card.locator("textarea[name=input]").fill('{"command": "rm -rf build"}')
        card.locator("button[value=edit]").click()
        wait_js(page, f"document.querySelector('#approval-{approval.pk}.a-approved') !== null")
        decided = Approval.objects.get(pk=approval.pk)
        assert decided.edited_input == {"command": "rm -rf build"}
        text = page.inner_text(f"#approval-{approval.pk}")
        assert "rm -rf build" in text and asked.split()[-1] in text  # what was asked, too
        assert page.locator(f"#approval-{approval.pk} .del").count() >= 1
        assert page.locator(f"#approval-{approval.pk} .add").count() >= 1
        page.screenshot(path=str(shots / "approval-edited.png"))


def test_the_admin_keeps_to_the_audit_trail(pages, eve, tmp_path):
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.PBKDF2PasswordHasher"]):
        get_user_model().objects.create_superuser("ada", password="pw-ada-12345")
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run, _ = waiting_demo(eve)
        page = pages()
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", "pw-ada-12345")
        page.click("input[type=submit]")
        page.goto(f"{base}/admin/agents/run/{run.pk}/change/")
        # Done-conditions and the harness's own fields are shown, not editable.
        assert page.locator("textarea[name=checks], input[name=checks]").count() == 0
        assert page.locator("[name=resume_state], [name=branch_seq]").count() == 0
        assert page.locator("a.deletelink").count() == 0
        page.goto(f"{base}/admin/agents/run/")
        options = page.eval_on_selector_all(
            "select[name=action] option", "els => els.map(e => e.textContent.trim())"
        )
        assert "Delete selected runs" not in " ".join(options)
        assert "Pause the selected runs" in options
        page.check(f"input[name=_selected_action][value='{run.pk}']")
        page.select_option("select[name=action]", label="Pause the selected runs")
        page.click("button[name=index]")
        assert f"Run {run.pk} paused." in page.inner_text(".messagelist")
        assert Run.objects.get(pk=run.pk).status == "paused"
        assert run.events.filter(kind="run.status", actor="user:ada").exists()  # on the record


def test_after_logging_out_a_login_link_gets_back_in(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        page = pages()
        log_in(page, base)
        page.click("button:has-text('Log out')")
        page.goto(f"{base}/accounts/login/")
        assert "manage.py login_link" in page.inner_text("main")
        out = StringIO()
        call_command("login_link", "--user", "eve", "--base-url", base, stdout=out)
        link = out.getvalue().strip().splitlines()[-1]
        assert link.startswith(f"{base}/login/")
        page.goto(link)
        assert "Log in as eve?" in page.inner_text("main")  # a click, not the GET, logs in
        page.click("button:has-text('Log in')")
        page.wait_for_url(f"{base}/overview/")
        assert "eve" in page.inner_text(".who")
