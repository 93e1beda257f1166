"""Slack: approvals as Block Kit messages with Approve / Deny / Open buttons, and a run's news
(ended, paused, a budget nearly spent), posted by a huey task through `slack_sdk`'s WebClient.

What a run owes Slack is a SlackMessage row written with its news (agents/reach.py); the task
`slack_post` posts it (chat.postMessage) or, once the approval is settled anywhere (the web, the
CLI, the API, Slack, an expiry), updates it to show who decided (chat.update). A failed call is
tried again on the queue after a doubling backoff, SLACK_ATTEMPTS times, then given up with a
warning in the log: a Slack outage never blocks or fails a run. Clicks come back through
agents/slack_interactions.py.

The bot token is read from the settings at each call and never logged.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agents import jobs, reach
from agents.models import (
    Approval,
    ApprovalStatus,
    Event,
    EventKind,
    SlackMessage,
)

log = logging.getLogger(__name__)

APPROVE, DENY, OPEN = "shiftlog_approve", "shiftlog_deny", "shiftlog_open"
DENY_MODAL = "shiftlog_deny_reason"
CLAIM_SECONDS = 30
SHOWN_INPUT = 2_500  # characters of a call's input a message shows


def client():
    """A WebClient for the configured bot (the `slack` extra), to SLACK_API_URL (a test's
    fake Slack)."""
    from slack_sdk import WebClient  # noqa: PLC0415 (the optional `slack` extra)

    return WebClient(
        token=settings.SHIFTLOG["SLACK_BOT_TOKEN"],
        base_url=settings.SHIFTLOG["SLACK_API_URL"],
        timeout=5,
    )


def escape(text: str) -> str:
    """Text as Slack shows it literally: its three control characters escaped, so a command or
    a goal cannot mention @channel, link or format."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def base_url() -> str:
    return settings.SHIFTLOG_BASE_URL


# --- what a message shows --------------------------------------------------------------------
def asked_why(approval: Approval) -> str:
    """The harness's reason for asking (the risk), from the approval's `approval.requested`."""
    payload = (
        Event.objects.filter(
            run_id=approval.run_id,
            kind=EventKind.APPROVAL_REQUESTED,
            payload__approval_id=approval.pk,
        )
        .values_list("payload", flat=True)
        .last()
    )
    return str((payload or {}).get("reason") or "")


def settled_words(approval: Approval) -> str:
    when = approval.decided_at.strftime("%Y-%m-%d %H:%M UTC") if approval.decided_at else ""
    who = approval.decided_by.get_username() if approval.decided_by else ""
    icon = {"approved": ":white_check_mark:", "denied": ":no_entry:"}.get(approval.status, "")
    words = f"{icon} *{approval.get_status_display()}*".strip()
    if who:
        words += f" by {escape(who)}"
    words += f" at {when}" if when else ""
    if approval.comment:
        words += f": {escape(approval.comment[:500])}"
    return words


def approval_blocks(approval: Approval) -> tuple[str, list[dict[str, Any]]]:
    run = approval.run
    run_link = f"<{base_url()}/runs/{run.pk}/|run {run.pk}>"
    text = f"Run {run.pk} asks to use {approval.tool_name}"
    shown = reach.what_is_asked(approval)
    if len(shown) > SHOWN_INPUT:
        shown = shown[:SHOWN_INPUT] + "\n…"
    blocks: list[dict[str, Any]] = [
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": f"*{run_link} asks to use `{escape(approval.tool_name)}`*\n"
                f"{escape(run.goal[:300])}",
            },
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{escape(shown)}```"}},
    ]
    why = asked_why(approval)
    facts = []
    if why:
        facts.append(f"Risk: {escape(why[:300])}")
    if run.project:
        facts.append(f"Project: {escape(run.project)}")
    if approval.expires_at:
        facts.append(f"Expires {approval.expires_at:%Y-%m-%d %H:%M} UTC")
    if facts:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)}]}
        )
    open_button = {
        "type": "button",
        "action_id": OPEN,
        "text": {"type": "plain_text", "text": "Open"},
        "url": f"{base_url()}/approvals/?run={run.pk}",
    }
    if approval.status == ApprovalStatus.PENDING:
        value = str(approval.pk)
        blocks.append(
            {
                "type": "actions",
                "block_id": f"approval-{approval.pk}",
                "elements": [
                    {
                        "type": "button",
                        "action_id": APPROVE,
                        "style": "primary",
                        "value": value,
                        "text": {"type": "plain_text", "text": "Approve"},
                    },
                    {
                        "type": "button",
                        "action_id": DENY,
                        "style": "danger",
                        "value": value,
                        "text": {"type": "plain_text", "text": "Deny…"},
                    },
                    open_button,
                ],
            }
        )
    else:
        text += f" ({approval.status})"
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": settled_words(approval)}}
        )
        blocks.append({"type": "actions", "elements": [open_button]})
    return text, blocks


def run_blocks(message: SlackMessage) -> tuple[str, list[dict[str, Any]]]:
    run = message.run
    link = f"<{base_url()}/runs/{run.pk}/|Run {run.pk}>"
    return f"Run {run.pk}: {message.text}", [
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": f"*{link}* {escape(message.text)}\n{escape(run.goal[:300])}",
            },
        }
    ]


def deny_modal(approval: Approval, *, channel: str, ts: str) -> dict[str, Any]:
    """The modal a Deny click opens: the reason the agent will read."""
    return {
        "type": "modal",
        "callback_id": DENY_MODAL,
        "private_metadata": f"{approval.pk}|{channel}|{ts}",
        "title": {"type": "plain_text", "text": "Deny the call"},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": f"Run {approval.run_id}: `{escape(approval.tool_name)}`\n"
                    f"```{escape(reach.what_is_asked(approval)[:1000])}```",
                },
            },
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Why (the agent reads it)"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "max_length": 3000,
                },
            },
        ],
    }


# --- posting ---------------------------------------------------------------------------------
def _claim(message_id: int) -> bool:
    now = timezone.now()
    return bool(
        SlackMessage.objects.filter(pk=message_id, failed_at=None)
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now))
        .update(claimed_until=now + timedelta(seconds=CLAIM_SECONDS))
    )


def deliver(message_id: int) -> str:
    """Post the message, or bring a posted one up to date; what it did ("posted", "updated",
    "current", "busy", "retry", "failed")."""
    if not _claim(message_id):
        return "busy"  # another task is on it, and re-reads the approval when it is done
    outcome = "current"
    try:
        for _ in range(3):  # again while the approval changed under a post
            message = SlackMessage.objects.select_related("run", "approval__decided_by").get(
                pk=message_id
            )
            if message.ts and not message.stale:
                break
            shown = message.approval.status if message.approval_id else ""
            if message.approval_id:
                text, blocks = approval_blocks(message.approval)
            else:
                text, blocks = run_blocks(message)
            web = client()
            if not message.ts:
                answer = web.chat_postMessage(channel=message.channel, text=text, blocks=blocks)
                # Slack answers with the channel's id, which chat.update needs.
                SlackMessage.objects.filter(pk=message_id).update(
                    ts=answer["ts"],
                    channel=answer.get("channel") or message.channel,
                    stale=False,
                    attempts=0,  # each post or update gets its own tries
                )
                outcome = "posted"
            else:
                web.chat_update(channel=message.channel, ts=message.ts, text=text, blocks=blocks)
                # Cleared only once Slack took it (a failed update stays owed for the retry);
                # a decision meanwhile is caught by the look at the status below.
                SlackMessage.objects.filter(pk=message_id).update(stale=False, attempts=0)
                outcome = "updated"
            if not message.approval_id:
                break
            now = Approval.objects.filter(pk=message.approval_id).values_list("status", flat=True)
            if list(now) == [shown] and not SlackMessage.objects.get(pk=message_id).stale:
                break
            SlackMessage.objects.filter(pk=message_id).update(stale=True)
    except Exception as e:  # any failure of Slack or the network: retried
        return _failed(message_id, e)
    finally:
        SlackMessage.objects.filter(pk=message_id).update(claimed_until=None)
    return outcome


def _failed(message_id: int, error: Exception) -> str:
    response = getattr(error, "response", None)  # a SlackApiError carries Slack's answer
    said = response.get("error") if response is not None and hasattr(response, "get") else None
    words = str(said or type(error).__name__)[:500]
    SlackMessage.objects.filter(pk=message_id).update(attempts=F("attempts") + 1, last_error=words)
    attempts = SlackMessage.objects.get(pk=message_id).attempts
    if attempts < max(1, settings.SHIFTLOG["SLACK_ATTEMPTS"]):
        delay = settings.SHIFTLOG["SLACK_BACKOFF_SECONDS"] * 2 ** (attempts - 1)
        log.info(
            "Slack message %s failed (%s, attempt %s); again in %s s",
            message_id,
            words,
            attempts,
            delay,
        )
        jobs.schedule("slack_post", delay=delay, message_id=message_id)
        return "retry"
    log.warning("Slack message %s given up after %s attempts: %s", message_id, attempts, words)
    SlackMessage.objects.filter(pk=message_id).update(failed_at=timezone.now())
    return "failed"


def tell(*, channel: str, user: str, text: str) -> bool:
    """Tell one person something only they see (chat.postEphemeral); False when Slack did not
    take it (logged: a refusal that was not shown changes nothing)."""
    try:
        client().chat_postEphemeral(channel=channel, user=user, text=text)
    except Exception as e:
        log.warning("could not tell Slack user %s: %s", user, type(e).__name__)
        return False
    return True


def requeue_lost(now=None, *, after: float) -> list[int]:
    """Queue again the messages never tried for more than `after` seconds: their task was lost
    (with Redis, or never queued because the queue was down). The reaper calls it."""
    now = now or timezone.now()
    lost = list(
        SlackMessage.objects.filter(
            ts="", attempts=0, failed_at=None, created_at__lt=now - timedelta(seconds=after)
        )
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now))
        .order_by("pk")
        .values_list("pk", flat=True)[:500]
    )
    for message_id in lost:
        if not jobs.queue_now("slack_post", message_id=message_id):
            break  # the queue is down: the next pass tries again
    return lost
