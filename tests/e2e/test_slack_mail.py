"""Deciding away from the dashboard, end to end (issue 33): a real `serve` (daphne and a huey
worker) posts the approvals to a fake Slack Web API and mails them to a real SMTP server on
loopback (aiosmtpd); one call is approved by a signed Slack callback sent over HTTP, and the
inbox open in Chromium turns its card to "approved by eve" live; the other is denied in the
browser from the mailed link."""

from __future__ import annotations

import email
import os
import re
import urllib.request
from email import policy

import pytest

from agents.models import Approval, Reach, Run, SlackMessage
from tests.e2e.helpers import CHROMIUM, free_port, log_in, serving, wait_js
from tests.fake_slack import FakeSlack, signed
from tests.helpers import call, finish_turn, make_run
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]

SECRET = "e2e-signing-secret-0123456789abcdef"


class Inbox:
    """An SMTP server on loopback keeping what it receives."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's name
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


def test_approved_from_slack_live_on_the_dashboard_and_denied_from_the_mail(pages, eve, tmp_path):
    from aiosmtpd.controller import Controller

    eve.email = "eve@example.com"
    eve.save()
    Reach.objects.create(user=eve, slack_user_id="U0EVE", mail_approvals=True)
    inbox = Inbox()
    smtp_port = free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    try:
        with (
            FakeSlack() as slack,
            serving(
                tmp_path,
                SHIFTLOG_DEMO_TURN_DELAY="0",
                SHIFTLOG_SLACK_BOT_TOKEN="xoxb-e2e",
                SHIFTLOG_SLACK_SIGNING_SECRET=SECRET,
                SHIFTLOG_SLACK_CHANNEL="C0OPS",
                SHIFTLOG_SLACK_API_URL=slack.base_url,
                SHIFTLOG_EMAIL_HOST="127.0.0.1",
                SHIFTLOG_EMAIL_PORT=str(smtp_port),
            ) as base,
        ):
            commands = ["echo a >> a.txt; rm -rf build", "echo b >> b.txt; rm -rf dist"]
            run = make_run(
                created_by=eve,
                turns=[{"tool_calls": [call("bash", command=c) for c in commands]}, finish_turn()],
            )
            wait_for(
                lambda: (
                    Approval.objects.filter(run=run, status="pending").count() == 2
                    and SlackMessage.objects.filter(run=run).exclude(ts="").count() == 2
                    and len(inbox.messages) == 2
                ),
                timeout=120,
                what="both approvals posted to Slack and mailed",
                interval=0.2,
            )
            by_slack, by_mail = Approval.objects.filter(run=run).order_by("pk")
            page = pages()
            log_in(page, base)
            page.goto(f"{base}/approvals/")
            wait_js(page, "document.querySelector('#live-state.on') !== null")
            assert page.locator(f"#approval-{by_slack.pk} form.decide").count() == 1

            # The click Slack would send for the message's Approve button, signed, over HTTP.
            click = {
                "type": "block_actions",
                "user": {"id": "U0EVE"},
                "channel": {"id": "C0OPS"},
                "actions": [{"action_id": "shiftlog_approve", "value": str(by_slack.pk)}],
            }
            request = signed(click, SECRET)
            answer = urllib.request.urlopen(
                urllib.request.Request(
                    f"{base}/slack/interactive",
                    data=request["data"].encode(),
                    headers={"Content-Type": request["content_type"], **request["headers"]},
                ),
                timeout=30,
            )
            assert answer.status == 200
            wait_js(
                page,
                f"(document.querySelector('#approval-{by_slack.pk} .decided') || {{}})"
                ".textContent?.startsWith('Approved by eve')",
            )
            wait_for(
                lambda: any(
                    "Approved* by eve" in str(u["blocks"]) for u in slack.of("chat.update")
                ),
                timeout=60,
                what="the Slack message updated to say who approved",
            )

            # The mail of the other call: its link, followed in the browser, denies it.
            mailed = next(
                m for m in inbox.messages if "rm -rf dist" in m.get_body(("plain",)).get_content()
            )
            path = re.search(r"(/approvals/mail/\S+/)", mailed.get_body(("plain",)).get_content())[
                1
            ]
            assert mailed.get_body(("html",)) is not None
            page.goto(f"{base}{path}")
            page.fill("input[name=reason]", "keep dist")
            page.click("button[value=deny]")
            page.wait_for_selector("#decided")
            assert page.text_content("#decided").startswith("Denied by eve")
            by_mail.refresh_from_db()
            assert (by_mail.status, by_mail.comment) == ("denied", "keep dist")
            page.goto(f"{base}{path}")
            assert "already used" in page.text_content("#link-refused")
            wait_for(
                lambda: Run.objects.get(pk=run.pk).status not in ("awaiting_approval",),
                timeout=60,
                what="the run to go on",
            )
    finally:
        smtp.stop()
