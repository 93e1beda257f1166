"""Slack approvals: Block Kit messages posted to a fake Slack Web API over real HTTP, and signed
interaction payloads sent to the real endpoint (/slack/interactive), decided through
`approvals.decide_as`."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from agents import approvals, services
from agents.models import Approval, Event, ProjectReach, Reach, SlackMessage
from tests.fake_slack import SECRET, TOKEN, signed
from tests.helpers import call, drain, drive_until_idle, finish_turn, make_run, user_with

pytestmark = pytest.mark.django_db


def linked(name: str, slack_id: str, *perms: str):
    user = user_with(name, *perms)
    Reach.objects.create(user=user, slack_user_id=slack_id)
    return user


def asking_run(django_capture_on_commit_callbacks, **kwargs):
    turns = [
        {
            "text": "Cleaning.",
            "tool_calls": [call("bash", command="echo '<b>&</b>' >> ran.txt; rm -rf build")],
        },
        finish_turn(),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=turns, **kwargs))
    assert run.status == "awaiting_approval"
    return run, Approval.objects.get(run=run)


def click(client: Client, approval: Approval, slack_user: str, action: str, **sign):
    payload = {
        "type": "block_actions",
        "user": {"id": slack_user},
        "channel": {"id": "C0DEFAULT"},
        "container": {"message_ts": "1700000000.000001"},
        "trigger_id": "trig-1",
        "actions": [{"action_id": action, "value": str(approval.pk)}],
    }
    return client.post("/slack/interactive", **signed(payload, sign.pop("secret", SECRET), **sign))


def deny_submission(approval: Approval, slack_user: str, reason: str) -> dict:
    return {
        "type": "view_submission",
        "user": {"id": slack_user},
        "view": {
            "callback_id": "shiftlog_deny_reason",
            "private_metadata": f"{approval.pk}|C0DEFAULT|1700000000.000001",
            "state": {
                "values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
            },
        },
    }


def test_an_approval_posts_a_block_kit_message_with_three_buttons(
    slack, django_capture_on_commit_callbacks
):
    run, approval = asking_run(django_capture_on_commit_callbacks, project="infra")
    assert drain() == ["slack_post"]
    [post] = slack.of("chat.postMessage")
    assert post["channel"] == "C0DEFAULT"
    actions = next(b for b in post["blocks"] if b["type"] == "actions")
    assert [e["action_id"] for e in actions["elements"]] == [
        "shiftlog_approve",
        "shiftlog_deny",
        "shiftlog_open",
    ]
    assert actions["elements"][2]["url"].endswith(f"/approvals/?run={run.pk}")
    shown = str(post["blocks"])
    # What is asked, escaped (no mention, link or format can be smuggled in), and the risk.
    assert "echo '&lt;b&gt;&amp;&lt;/b&gt;'" in shown and "<b>" not in shown
    assert "Risk:" in shown and "Project: infra" in shown
    headers = next(c["headers"] for c in slack.calls if c["method"] == "chat.postMessage")
    assert headers["authorization"] == f"Bearer {TOKEN}"
    message = SlackMessage.objects.get(approval=approval)
    assert message.ts and message.channel == "CC0DEFAULT"  # the channel id Slack answered


def test_a_project_posts_to_its_own_channel_and_may_switch_news_off(
    slack, django_capture_on_commit_callbacks
):
    ProjectReach.objects.create(project="infra", slack_channel="C0INFRA", slack_run_endings=False)
    asking_run(django_capture_on_commit_callbacks, project="infra")
    with django_capture_on_commit_callbacks(execute=True):
        drive_until_idle(make_run(turns=[finish_turn()], project="infra"))
        done = drive_until_idle(make_run(turns=[finish_turn()], project="web"))
    drain()
    assert [p["channel"] for p in slack.of("chat.postMessage")] == ["C0INFRA", "C0DEFAULT"]
    assert f"Run {done.pk}" in slack.of("chat.postMessage")[1]["text"]
    assert "succeeded" in slack.of("chat.postMessage")[1]["text"]


def test_approve_in_slack_decides_as_the_mapped_person_and_updates_the_message(
    slack, django_capture_on_commit_callbacks
):
    dana = linked("dana", "U0DANA", "decide_approval", "view_run")
    run, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        response = click(Client(), approval, "U0DANA", "shiftlog_approve")
    assert response.status_code == 200
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == dana
    decided = Event.objects.get(run=run, kind="approval.decided")
    assert decided.actor == "user:dana"  # the same audit event as the web's
    run.refresh_from_db()
    assert run.status == "queued"
    assert "slack_post" in drain()
    [update] = slack.of("chat.update")
    assert update["ts"] == SlackMessage.objects.get(approval=approval).ts
    assert "Approved* by dana" in str(update["blocks"])
    assert "shiftlog_approve" not in str(update["blocks"])  # no buttons left to click


def test_a_decision_on_the_web_updates_the_slack_message(
    slack, decider, django_capture_on_commit_callbacks
):
    _, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        approvals.decide_as(approval.pk, user=decider, decision="deny", reason="not today")
    drain()
    [update] = slack.of("chat.update")
    assert "Denied* by dana" in str(update["blocks"]) and "not today" in str(update["blocks"])


@pytest.mark.parametrize(
    "sign",
    [
        {"secret": "not-the-secret"},  # forged
        {"at": time.time() - 6 * 60},  # replayed: older than the five minutes
    ],
    ids=["bad-signature", "old-timestamp"],
)
def test_a_forged_or_stale_callback_is_refused_and_changes_nothing(
    slack, sign, django_capture_on_commit_callbacks
):
    linked("dana", "U0DANA", "decide_approval", "view_run")
    _, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        response = click(Client(), approval, "U0DANA", "shiftlog_approve", **sign)
    assert response.status_code == 401 and b"signature" in response.content
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert drain() == [] and slack.of("chat.update") == []


def test_a_callback_without_a_signature_is_refused(slack):
    form = "application/x-www-form-urlencoded"
    bare = Client().post("/slack/interactive", data="payload=%7B%7D", content_type=form)
    odd = Client().post(
        "/slack/interactive",
        data="payload=%7B%7D",
        content_type=form,
        headers={"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
    )
    assert (bare.status_code, odd.status_code) == (401, 401)


def test_an_unmapped_person_is_refused_and_told(slack, django_capture_on_commit_callbacks):
    _, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        response = click(Client(), approval, "U0STRANGER", "shiftlog_approve")
    assert response.status_code == 200
    approval.refresh_from_db()
    assert approval.status == "pending"
    drain()
    [told] = slack.of("chat.postEphemeral")
    assert told["user"] == "U0STRANGER" and "not linked" in told["text"]


def test_a_person_without_the_right_is_refused_and_told(slack, django_capture_on_commit_callbacks):
    linked("vic", "U0VIC", "view_run")  # may watch, not decide
    _, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        click(Client(), approval, "U0VIC", "shiftlog_approve")
        click(Client(), approval, "U0VIC", "shiftlog_deny")
    approval.refresh_from_db()
    assert approval.status == "pending"
    drain()
    assert [
        t["text"].startswith("You (vic in Shiftlog) may not")
        for t in slack.of("chat.postEphemeral")
    ] == [True, True]
    assert slack.of("views.open") == []


def test_a_second_click_loses_and_is_told_who_decided(slack, django_capture_on_commit_callbacks):
    linked("dana", "U0DANA", "decide_approval", "view_run")
    linked("sam", "U0SAM", "decide_approval", "view_run")
    _, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        click(Client(), approval, "U0DANA", "shiftlog_approve")
        click(Client(), approval, "U0SAM", "shiftlog_approve")
        click(Client(), approval, "U0SAM", "shiftlog_deny")
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by.username == "dana"
    assert Event.objects.filter(kind="approval.decided", run=approval.run).count() == 1
    drain()
    told = [t for t in slack.of("chat.postEphemeral") if t["user"] == "U0SAM"]
    assert len(told) == 2 and all("already approved by dana" in t["text"] for t in told)
    assert slack.of("views.open") == []


def test_deny_opens_a_modal_and_its_submission_denies_with_the_reason(
    slack, django_capture_on_commit_callbacks
):
    dana = linked("dana", "U0DANA", "decide_approval", "view_run")
    run, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    response = click(Client(), approval, "U0DANA", "shiftlog_deny")
    assert response.status_code == 200
    [opened] = slack.of("views.open")
    assert opened["trigger_id"] == "trig-1"
    assert opened["view"]["callback_id"] == "shiftlog_deny_reason"
    assert opened["view"]["private_metadata"].startswith(f"{approval.pk}|")
    approval.refresh_from_db()
    assert approval.status == "pending"  # a click on Deny alone decides nothing

    # Submitted without a reason: the modal shows the error, nothing is decided.
    empty = Client().post(
        "/slack/interactive", **signed(deny_submission(approval, "U0DANA", " "), SECRET)
    )
    assert empty.json()["response_action"] == "errors"
    assert "needs a reason" in empty.json()["errors"]["reason"]

    with django_capture_on_commit_callbacks(execute=True):
        done = Client().post(
            "/slack/interactive",
            **signed(deny_submission(approval, "U0DANA", "keep the build"), SECRET),
        )
    assert done.status_code == 200 and done.content == b""  # closes the modal
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.comment) == (
        "denied",
        dana,
        "keep the build",
    )
    drain()
    assert "Denied* by dana" in str(slack.of("chat.update")[0]["blocks"])

    # The same submission again (a replay): refused in the modal, nothing changes.
    again = Client().post(
        "/slack/interactive", **signed(deny_submission(approval, "U0DANA", "again"), SECRET)
    )
    assert "already denied by dana" in again.json()["errors"]["reason"]
    assert Event.objects.filter(kind="approval.decided", run=run).count() == 1


def test_a_click_for_a_run_that_ended_is_refused(slack, django_capture_on_commit_callbacks):
    linked("dana", "U0DANA", "decide_approval", "view_run")
    run, approval = asking_run(django_capture_on_commit_callbacks)
    drain()
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_run(run.pk, actor="user:olivia")
    drain()
    # The message was updated when the run's end discarded the approval.
    assert "Discarded" in str(slack.of("chat.update")[-1]["blocks"])
    with django_capture_on_commit_callbacks(execute=True):
        click(Client(), approval, "U0DANA", "shiftlog_approve")
    drain()
    approval.refresh_from_db()
    assert approval.status == "discarded"
    assert "can no longer be decided" in slack.of("chat.postEphemeral")[0]["text"]


def test_a_slack_outage_is_retried_and_never_touches_the_run(
    slack, decider, django_capture_on_commit_callbacks, settings
):
    slack.fail(2)
    run, approval = asking_run(django_capture_on_commit_callbacks)
    assert drain() == ["slack_post"] * 3  # two failures, then posted
    message = SlackMessage.objects.get(approval=approval)
    assert message.ts and message.failed_at is None and message.last_error == "internal_error"

    settings.SHIFTLOG = {**settings.SHIFTLOG, "SLACK_ATTEMPTS": 2}
    slack.fail(10)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.decide_as(approval.pk, user=decider, decision="approve")
    drain()
    message.refresh_from_db()
    assert message.failed_at is not None and message.last_error == "internal_error"
    run.refresh_from_db()
    assert run.status == "queued"  # the decision stood; Slack's trouble is only logged


def test_the_signing_secret_and_token_never_show_in_the_admin(slack, client, admin_user):
    client.force_login(admin_user)
    for url in (
        "/admin/agents/projectreach/",
        "/admin/agents/reach/",
        "/admin/agents/slackmessage/",
    ):
        page = client.get(url)
        assert page.status_code == 200
        assert SECRET.encode() not in page.content and TOKEN.encode() not in page.content
    assert b"Slack bot token: set" in client.get("/admin/agents/projectreach/").content


def test_the_run_page_says_where_its_approvals_go(slack, owner, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "MAIL_NOTIFICATIONS": True}
    ProjectReach.objects.create(project="infra", slack_channel="C0INFRA")
    dana = linked("dana", "U0DANA", "decide_approval", "view_run")
    dana.email = "dana@example.com"
    dana.save()
    Reach.objects.filter(user=dana).update(mail_approvals=True)
    run = make_run(turns=[finish_turn()], project="infra", created_by=owner)
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert "Slack <code>C0INFRA</code>" in page and "mail to dana" in page
    other = make_run(turns=[finish_turn()], project="web", created_by=owner)
    assert "Slack <code>C0DEFAULT</code>" in browser.get(f"/runs/{other.pk}/").content.decode()


def test_a_lost_post_is_queued_again_by_the_reaper(slack, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from agents import slack as slack_module

    _, approval = asking_run(django_capture_on_commit_callbacks)
    from huey.contrib.djhuey import HUEY

    HUEY.flush()  # the queue lost the task (Redis restarted)
    assert drain() == []
    message = SlackMessage.objects.get(approval=approval)
    assert slack_module.requeue_lost(after=60) == []  # not yet: it may still be on its way
    later = timezone.now() + timedelta(seconds=120)
    assert slack_module.requeue_lost(later, after=60) == [message.pk]
    assert drain() == ["slack_post"]
    assert len(slack.of("chat.postMessage")) == 1
    assert slack_module.requeue_lost(later, after=60) == []  # posted: nothing more


@pytest.mark.django_db(transaction=True)
def test_two_people_clicking_at_once_make_one_decision(slack):
    """Two signed clicks on Approve and Deny's modal at the same moment, each in its own thread
    and database connection: exactly one decision, the other told who was first."""
    import threading

    from django.db import connection

    linked("dana", "U0DANA", "decide_approval", "view_run")
    linked("sam", "U0SAM", "decide_approval", "view_run")
    turns = [{"tool_calls": [call("bash", command="echo x >> ran.txt; rm -rf build")]}]
    run = drive_until_idle(make_run(turns=[*turns, finish_turn()]))
    approval = Approval.objects.get(run=run)
    start = threading.Barrier(2)
    answers = {}

    def press(who: str) -> None:
        try:
            start.wait(10)
            if who == "U0DANA":
                answers[who] = click(Client(), approval, who, "shiftlog_approve")
            else:
                body = deny_submission(approval, who, "no")
                answers[who] = Client().post("/slack/interactive", **signed(body, SECRET))
        finally:
            connection.close()

    threads = [threading.Thread(target=press, args=(who,)) for who in ("U0DANA", "U0SAM")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    approval.refresh_from_db()
    assert Event.objects.filter(run=run, kind="approval.decided").count() == 1
    assert {a.status_code for a in answers.values()} == {200}
    if approval.status == "approved":
        assert "already approved by dana" in answers["U0SAM"].json()["errors"]["reason"]
    else:
        assert approval.status == "denied" and approval.decided_by.username == "sam"
        assert any("already denied by sam" in t["text"] for t in _told_after_drain(slack))


def _told_after_drain(slack) -> list[dict]:
    drain()
    return slack.of("chat.postEphemeral")


def test_a_budget_warning_and_the_pause_post_too_unless_the_project_says_no(
    slack, fake_api, django_capture_on_commit_callbacks
):
    from decimal import Decimal

    def spend(project: str):
        for i in range(4):  # $0.003 a turn against $0.01: warned, then paused
            fake_api.push_message(
                [{"type": "tool_use", "id": f"toolu_{i}", "name": "list_files", "input": {}}],
                stop_reason="tool_use",
                usage={"input_tokens": 1000, "output_tokens": 0},
            )
        budgets = services.Budgets(max_cost_usd=Decimal("0.01"))
        with django_capture_on_commit_callbacks(execute=True):
            run = drive_until_idle(make_run(provider="anthropic", budgets=budgets, project=project))
        assert run.status == "paused"
        drain()
        return run

    run = spend("infra")
    texts = [p["text"] for p in slack.of("chat.postMessage")]
    assert texts == [
        f"Run {run.pk}: has used 0.009000 of its cost budget (0.010000)",
        f"Run {run.pk}: paused: {run.status_reason}",
    ]
    ProjectReach.objects.create(project="quiet", slack_budget_warnings=False, slack_pauses=False)
    slack.reset()
    spend("quiet")
    assert slack.of("chat.postMessage") == []
