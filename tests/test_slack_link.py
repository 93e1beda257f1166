"""A person links their own Slack id (agents/slack_link.py) from /me/reach/: the bot DMs that
Slack user a "Link to NAME" button through the fake Slack Web API over real HTTP, and only the
click of that Slack user, signed with the signing secret and sent to the real endpoint
(/slack/interactive), saves the link, once and in time."""

from __future__ import annotations

import time

import pytest
from django.core import signing
from django.test import Client

from agents import slack_link
from agents.models import Reach, SlackLinkClaim
from tests.fake_slack import SECRET, signed
from tests.helpers import client_for, drain, user_with

pytestmark = pytest.mark.django_db


def ask(browser: Client, slack_id: str):
    return browser.post("/me/reach/slack", {"slack_user_id": slack_id}, follow=True)


def button(slack) -> str:
    """The token the last DM's "Link to" button carries."""
    dm = slack.of("chat.postMessage")[-1]
    actions = next(b for b in dm["blocks"] if b["type"] == "actions")
    [element] = actions["elements"]
    assert element["action_id"] == "shiftlog_link"
    return element["value"]


@pytest.fixture
def click(django_capture_on_commit_callbacks):
    """Send the signed click Slack would send for a "Link to" button, by `slack_user`."""

    def clicking(token: str, slack_user: str):
        payload = {
            "type": "block_actions",
            "user": {"id": slack_user},
            "channel": {"id": f"D{slack_user}"},
            "actions": [{"action_id": "shiftlog_link", "value": token}],
        }
        with django_capture_on_commit_callbacks(execute=True):
            return Client().post("/slack/interactive", **signed(payload, SECRET))

    return clicking


def told(slack) -> list[str]:
    drain()
    return [m["text"] for m in slack.of("chat.postEphemeral")]


def linked(user) -> str:
    return Reach.objects.filter(user=user).values_list("slack_user_id", flat=True).first() or ""


def test_a_person_links_their_slack_id_by_clicking_the_button_sent_to_it(slack, click):
    dana = user_with("dana", "decide_approval", "view_run")
    browser = client_for(dana)
    page = browser.get("/me/reach/").content.decode()
    assert 'id="slack-unlinked"' in page and 'id="slack-link-form"' in page

    sent = ask(browser, "U0DANA123").content.decode()
    assert "Sent" in sent and "Link to dana" in sent
    [dm] = slack.of("chat.postMessage")
    assert dm["channel"] == "U0DANA123"  # a direct message to that Slack user
    assert "*dana*" in str(dm["blocks"]) and "ignore this message" in str(dm["blocks"])
    assert linked(dana) == ""  # nothing linked until the click

    assert click(button(slack), "U0DANA123").status_code == 200
    assert told(slack) == ["Linked: your clicks in Slack now decide as dana in Shiftlog."]
    assert linked(dana) == "U0DANA123"
    page = browser.get("/me/reach/").content.decode()
    assert 'id="slack-linked"' in page and "<code>U0DANA123</code>" in page


def test_once_linked_a_click_on_approve_decides_as_them(
    slack, click, django_capture_on_commit_callbacks
):
    from tests.test_slack import asking_run
    from tests.test_slack import click as click_approval

    dana = user_with("dana", "decide_approval", "view_run")
    ask(client_for(dana), "U0DANA123")
    click(button(slack), "U0DANA123")
    _, approval = asking_run(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        click_approval(Client(), approval, "U0DANA123", "shiftlog_approve")
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", dana)


def test_nobody_can_claim_another_persons_slack_id(slack, click):
    """Mallory types Dana's Slack id: the button goes to Dana's Slack, not Mallory's; a click of
    it by anyone else (Mallory's own Slack account) links nothing."""
    mallory = user_with("mallory", "decide_approval", "view_run")
    ask(client_for(mallory), "U0DANA123")
    token = button(slack)
    click(token, "U0MALLORY1")
    assert told(slack) == [
        "Not linked: This link button was sent to another Slack user: it links only them."
    ]
    assert linked(mallory) == ""
    # A token of one's own making is no token.
    forged = signing.TimestampSigner(salt="another-salt").sign("1")
    click(forged, "U0DANA123")
    assert told(slack)[-1] == "Not linked: This link button is not valid."
    assert not Reach.objects.exclude(slack_user_id="").exists()


def test_a_reused_or_expired_button_is_refused(slack, click):
    dana = user_with("dana")
    browser = client_for(dana)
    ask(browser, "U0DANA123")
    token = button(slack)
    click(token, "U0DANA123")
    slack_link.unlink(dana)
    click(token, "U0DANA123")  # used once already
    assert told(slack)[-1] == "Not linked: This link button was already used; each one works once."
    assert linked(dana) == ""

    ask(browser, "U0DANA123")
    claim_id = signing.TimestampSigner(salt=slack_link.SALT).unsign(button(slack))

    class AnHourAgo(signing.TimestampSigner):
        def timestamp(self):
            return signing.b62_encode(int(time.time()) - 3600)

    click(AnHourAgo(salt=slack_link.SALT).sign(claim_id), "U0DANA123")
    assert "expired" in told(slack)[-1]
    assert linked(dana) == ""
    assert SlackLinkClaim.objects.filter(used_at=None).count() == 1


def test_a_slack_id_linked_to_someone_else_is_refused_when_asked_and_when_clicked(slack, click):
    dana = user_with("dana")
    sam = user_with("sam")
    ask(client_for(sam), "U0SHARED1")
    sams_button = button(slack)
    Reach.objects.create(user=dana, slack_user_id="U0SHARED1")  # linked meanwhile (an admin)
    refused = ask(client_for(sam), "U0SHARED1").content.decode()
    assert "linked to another Shiftlog user" in refused
    click(sams_button, "U0SHARED1")
    assert "linked to another Shiftlog user meanwhile" in told(slack)[-1]
    assert (linked(dana), linked(sam)) == ("U0SHARED1", "")
    assert SlackLinkClaim.objects.get().used_at is None  # nothing changed, the claim neither


def test_bad_ids_slack_refusals_and_floods_are_said_plainly(slack):
    dana = user_with("dana")
    browser = client_for(dana)
    for bad in ("dana", "u0dana123", "C0CHANNEL1", "<@U0DANA>"):
        page = ask(browser, bad).content.decode()
        assert "is not a Slack member id" in page, bad
    slack.unknown_users.add("U0NOBODY1")
    page = ask(browser, "U0NOBODY1").content.decode()
    assert "Slack did not take the message (user_not_found)" in page
    assert not SlackLinkClaim.objects.exists()
    for _ in range(slack_link.ASKS_PER_HOUR):
        ask(browser, "U0DANA123")
    page = ask(browser, "U0DANA123").content.decode()
    assert "times in the last hour" in page
    assert len(slack.of("chat.postMessage")) == slack_link.ASKS_PER_HOUR + 1  # the refused one too


def test_unlinking_forgets_the_id_and_its_clicks(slack):
    from agents.slack_interactions import person

    dana = user_with("dana")
    Reach.objects.create(user=dana, slack_user_id="U0DANA123")
    browser = client_for(dana)
    done = browser.post("/me/reach/slack/unlink", follow=True).content.decode()
    assert "Unlinked Slack member U0DANA123" in done and 'id="slack-unlinked"' in done
    assert linked(dana) == "" and person("U0DANA123") is None
    again = browser.post("/me/reach/slack/unlink", follow=True).content.decode()
    assert "No Slack account was linked" in again


def test_without_slack_set_up_the_page_says_so_and_sends_nothing(slack, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "SLACK_SIGNING_SECRET": ""}
    browser = client_for(user_with("dana"))
    page = browser.get("/me/reach/").content.decode()
    assert 'id="slack-not-ready"' in page and 'id="slack-link-form"' not in page
    refused = ask(browser, "U0DANA123").content.decode()
    assert "Slack is not set up on this Shiftlog" in refused
    assert slack.of("chat.postMessage") == []


def test_the_page_needs_a_login_and_saves_ones_own_mail_switches(slack):
    for path in ("/me/reach/",):
        assert "/accounts/login/" in Client().get(path)["Location"]
    for path in ("/me/reach/slack", "/me/reach/slack/unlink"):
        assert Client().post(path, {"slack_user_id": "U0DANA123"}).status_code == 302
    assert slack.of("chat.postMessage") == []
    dana = user_with("dana")
    page = client_for(dana).post("/me/reach/", {"mail_approvals": "on"}, follow=True)
    assert "Mail settings saved" in page.content.decode()
    assert "no email address" in page.content.decode()
    row = Reach.objects.get(user=dana)
    assert (row.mail_approvals, row.mail_run_endings) == (True, False)


def test_an_unlinked_clicker_is_pointed_to_the_page(slack, django_capture_on_commit_callbacks):
    from tests.test_slack import asking_run
    from tests.test_slack import click as click_approval

    _, approval = asking_run(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        click_approval(Client(), approval, "U0STRANGER", "shiftlog_approve")
    assert "/me/reach/" in told(slack)[-1] and "U0STRANGER" in told(slack)[-1]
