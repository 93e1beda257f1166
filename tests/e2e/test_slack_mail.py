"""Deciding away from the dashboard, end to end (issue 33): a real `serve` (daphne and a huey
worker) talks to a fake Slack Web API and mails a real SMTP server on loopback (aiosmtpd).

Eve links her own Slack account in Chromium (Your notifications: the bot DMs her a "Link to eve"
button, whose signed click over HTTP makes the link) and opts in to approval mails there. Then a
run asks three calls: one is approved by a signed Slack callback as her, and the inbox open in
Chromium turns its card to "approved by eve" live; one is denied from its mailed link, and one
approved with an edited input from its mailed link."""

from __future__ import annotations

import json
import re

from agents.models import Approval, Reach, Run, SlackMessage
from tests.e2e.helpers import (
    BROWSER_TEST,
    log_in,
    mail_env,
    serving,
    slack_callback,
    slack_env,
    smtp_server,
    wait_js,
)
from tests.fake_slack import FakeSlack
from tests.helpers import call, finish_turn, make_run
from tests.procs import wait_for

pytestmark = BROWSER_TEST

SECRET = "e2e-signing-secret-0123456789abcdef"


def link_own_slack(page, base: str, slack) -> None:
    """Eve, on her notifications page: approval mails on, and her Slack account linked through
    the button the bot sends it."""
    page.goto(f"{base}/me/reach/")
    assert page.text_content("#slack-unlinked").startswith("No Slack account is linked")
    page.check("input[name=mail_approvals]")
    page.click("#mail-settings button")
    page.wait_for_selector("text=Mail settings saved.")
    page.fill("#slack-user-id", "U0EVE1234")
    page.click("#slack-link-form button")
    page.wait_for_selector("text=Click “Link to eve” there to finish.")
    wait_for(lambda: slack.of("chat.postMessage"), timeout=30, what="the bot's DM")
    [dm] = slack.of("chat.postMessage")
    assert dm["channel"] == "U0EVE1234"
    [button] = next(b for b in dm["blocks"] if b["type"] == "actions")["elements"]
    assert button["text"]["text"] == "Link to eve"
    # Someone else's Slack account clicking it links nothing.
    click = {"type": "block_actions", "actions": [{"action_id": "shiftlog_link"}]}
    click["actions"][0]["value"] = button["value"]
    assert slack_callback(base, {**click, "user": {"id": "U0MALLORY"}}, SECRET) == 200
    page.reload()
    assert page.locator("#slack-linked").count() == 0
    # Eve's does.
    assert slack_callback(base, {**click, "user": {"id": "U0EVE1234"}}, SECRET) == 200
    page.reload()
    assert "Linked to Slack member U0EVE1234" in page.text_content("#slack-linked")
    assert Reach.objects.get(user__username="eve").mail_approvals


def decide_from_mail(page, base: str, mailbox, command: str, *, edit: str = "", deny: str = ""):
    mailed = next(m for m in mailbox.messages if command in mailbox.text_of(m))
    assert mailed.get_body(("html",)) is not None
    path = re.search(r"(/approvals/mail/\S+/)", mailbox.text_of(mailed))[1]
    page.goto(f"{base}{path}")
    if edit:
        page.click("details.edit summary")
        page.fill("textarea[name=input]", "{not json")
        page.click("button[value=edit]")
        page.wait_for_selector("p.error")
        assert "JSON" in page.text_content("p.error")  # said plainly; the link still works
        page.fill("textarea[name=input]", json.dumps({"command": edit}))
        page.click("button[value=edit]")
    else:
        page.fill("input[name=reason]", deny)
        page.click("button[value=deny]")
    page.wait_for_selector("#decided")
    words = page.text_content("#decided")
    page.goto(f"{base}{path}")
    assert "already used" in page.text_content("#link-refused")
    return words


def test_linked_in_slack_by_oneself_then_deciding_from_slack_and_from_the_mail(
    pages, eve, tmp_path
):
    eve.email = "eve@example.com"
    eve.save()
    with (
        smtp_server() as (smtp_port, mailbox),
        FakeSlack() as slack,
        serving(
            tmp_path,
            SHIFTLOG_DEMO_TURN_DELAY="0",
            **slack_env(slack, SECRET),
            **mail_env(smtp_port),
        ) as base,
    ):
        page = pages()
        log_in(page, base)
        link_own_slack(page, base, slack)

        commands = [
            "echo a >> a.txt; rm -rf build",
            "echo b >> b.txt; rm -rf dist",
            "echo c >> c.txt; rm -rf cache",
        ]
        run = make_run(
            created_by=eve,
            turns=[{"tool_calls": [call("bash", command=c) for c in commands]}, finish_turn()],
        )
        wait_for(
            lambda: (
                Approval.objects.filter(run=run, status="pending").count() == 3
                and SlackMessage.objects.filter(run=run).exclude(ts="").count() == 3
                and len(mailbox.messages) == 3
            ),
            timeout=120,
            what="the approvals posted to Slack and mailed",
            interval=0.2,
        )
        by_slack, by_mail, edited = Approval.objects.filter(run=run).order_by("pk")
        page.goto(f"{base}/approvals/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        assert page.locator(f"#approval-{by_slack.pk} form.decide").count() == 1

        # The click Slack would send for the message's Approve button: eve's, by her own link.
        click = {
            "type": "block_actions",
            "user": {"id": "U0EVE1234"},
            "channel": {"id": "C0OPS"},
            "actions": [{"action_id": "shiftlog_approve", "value": str(by_slack.pk)}],
        }
        assert slack_callback(base, click, SECRET) == 200
        wait_js(
            page,
            f"(document.querySelector('#approval-{by_slack.pk} .decided') || {{}})"
            ".textContent?.startsWith('Approved by eve')",
        )
        wait_for(
            lambda: any("Approved* by eve" in str(u["blocks"]) for u in slack.of("chat.update")),
            timeout=60,
            what="the Slack message updated to say who approved",
        )

        # The mails of the other two: one denied, one approved edited, in the browser.
        words = decide_from_mail(page, base, mailbox, "rm -rf dist", deny="keep dist")
        assert words.startswith("Denied by eve")
        by_mail.refresh_from_db()
        assert (by_mail.status, by_mail.comment) == ("denied", "keep dist")
        words = decide_from_mail(page, base, mailbox, "rm -rf cache", edit="echo c >> c.txt")
        assert words.startswith("Approved by eve") and "(with edits)" in words
        edited.refresh_from_db()
        assert edited.edited_input == {"command": "echo c >> c.txt"}
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status not in ("awaiting_approval",),
            timeout=60,
            what="the run to go on",
        )
