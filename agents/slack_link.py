"""A person links their own Slack member id, safely (the page /me/reach/, dashboard/reach_views.py).

Whoever's Slack id is linked to a Shiftlog user decides as that user when they click Approve or
Deny in Slack, so typing an id is not enough: the bot sends that Slack user a direct message with
a "Link to NAME" button, whose value is a signed, expiring token naming a SlackLinkClaim. The
link is saved only when the click comes back signed by Slack (the signing secret,
dashboard/reach_views.slack_interactive) from that same Slack user, once, in time, and while
nobody else holds the id. A person who did not ask ignores the message and nothing changes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.utils import timezone

from agents import slack
from agents.models import Reach, SlackLinkClaim

SALT = "shiftlog.slack-link"
LINK = "shiftlog_link"  # the button's action_id
MEMBER_ID = re.compile(r"[UW][A-Z0-9]{6,20}")
ASKS_PER_HOUR = 5  # DMs one person may have the bot send (nobody is flooded through Shiftlog)


class LinkError(ValueError):
    """Why a link cannot be asked for or made, in words for the person."""


def not_ready() -> str:
    """Why Slack linking cannot work here, or "": it needs the bot token (to send the message)
    and the signing secret (to believe the click)."""
    config = settings.SHIFTLOG
    if not config["SLACK_BOT_TOKEN"] or not config["SLACK_SIGNING_SECRET"]:
        return (
            "Slack is not set up on this Shiftlog (it needs SHIFTLOG_SLACK_BOT_TOKEN and "
            "SHIFTLOG_SLACK_SIGNING_SECRET): ask an admin."
        )
    return ""


def linked_id(user) -> str:
    return Reach.objects.filter(user=user).values_list("slack_user_id", flat=True).first() or ""


def _holder(slack_user_id: str, user) -> bool:
    """Whether someone other than `user` holds this Slack id."""
    return Reach.objects.filter(slack_user_id=slack_user_id).exclude(user=user).exists()


def sign(claim: SlackLinkClaim) -> str:
    return signing.TimestampSigner(salt=SALT).sign(str(claim.pk))


def blocks(user, token: str) -> tuple[str, list[dict[str, Any]]]:
    name = slack.escape(user.get_username())
    text = f"Link this Slack account to {user.get_username()} in Shiftlog?"
    minutes = max(1, settings.SHIFTLOG["SLACK_LINK_SECONDS"] // 60)
    return text, [
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": f"*<{slack.base_url()}/|Shiftlog>*: link this Slack account to the "
                f"Shiftlog user *{name}*? Then your clicks on Approve and Deny in Slack decide "
                f"as {name}. This button works once, for {minutes} minutes. If you did not ask "
                "for this, ignore this message: nothing changes.",
            },
        },
        {
            "type": "actions",
            "block_id": "slack-link",
            "elements": [
                {
                    "type": "button",
                    "action_id": LINK,
                    "style": "primary",
                    "value": token,
                    "text": {"type": "plain_text", "text": f"Link to {user.get_username()}"[:75]},
                }
            ],
        },
    ]


def ask(user, slack_user_id: str) -> SlackLinkClaim:
    """Send the Slack user a button to link them to `user`; LinkError saying why not."""
    why = not_ready()
    if why:
        raise LinkError(why)
    given = (slack_user_id or "").strip()
    if not MEMBER_ID.fullmatch(given):
        raise LinkError(
            f"{given[:60]!r} is not a Slack member id: in Slack, open your profile, then ⋯ → "
            "Copy member ID (it looks like U0123ABCD)."
        )
    if linked_id(user) == given:
        raise LinkError(f"Slack member {given} is already linked to you.")
    if _holder(given, user):
        raise LinkError(
            f"Slack member {given} is linked to another Shiftlog user: if it is yours, ask an "
            "admin to unlink it first."
        )
    recent = SlackLinkClaim.objects.filter(
        user=user, created_at__gte=timezone.now() - timedelta(hours=1)
    )
    if recent.count() >= ASKS_PER_HOUR:
        raise LinkError(
            f"You asked {ASKS_PER_HOUR} times in the last hour: use a button already sent, or "
            "try again later."
        )
    claim = SlackLinkClaim.objects.create(user=user, slack_user_id=given)
    text, message = blocks(user, sign(claim))
    try:
        # A user id as the channel: the bot's direct message to that person.
        slack.client().chat_postMessage(channel=given, text=text, blocks=message)
    except Exception as e:  # Slack's refusal (user_not_found, ...) or the network
        claim.delete()
        response = getattr(e, "response", None)
        said = response.get("error") if response is not None and hasattr(response, "get") else None
        raise LinkError(
            f"Slack did not take the message ({str(said or type(e).__name__)[:100]}): check "
            "the member id, or try again later."
        ) from None
    return claim


def confirm(token: str, slack_user_id: str) -> str:
    """The click on a "Link to NAME" button, by this (signature-checked) Slack user: the link
    saved, and words saying so; LinkError saying why not (nothing changed)."""
    signer = signing.TimestampSigner(salt=SALT)
    try:
        claim_id = int(signer.unsign(token, max_age=settings.SHIFTLOG["SLACK_LINK_SECONDS"]))
    except signing.SignatureExpired:
        raise LinkError(
            "This link button has expired: ask again from Your notifications in Shiftlog."
        ) from None
    except (signing.BadSignature, ValueError):
        raise LinkError("This link button is not valid.") from None
    claim = SlackLinkClaim.objects.select_related("user").filter(pk=claim_id).first()
    if claim is None:
        raise LinkError("This link button is not valid any more.")
    if claim.slack_user_id != slack_user_id:
        raise LinkError("This link button was sent to another Slack user: it links only them.")
    if claim.used_at is not None:
        raise LinkError("This link button was already used; each one works once.")
    if not claim.user.is_active:
        raise LinkError("That Shiftlog user is deactivated: nothing was linked.")
    name = claim.user.get_username()
    try:
        with transaction.atomic():
            if not SlackLinkClaim.objects.filter(pk=claim.pk, used_at=None).update(
                used_at=timezone.now()
            ):
                raise LinkError("This link button was already used; each one works once.")
            if _holder(slack_user_id, claim.user):
                raise LinkError(
                    "This Slack account is linked to another Shiftlog user meanwhile: nothing "
                    "changed."
                )
            row, _ = Reach.objects.get_or_create(user=claim.user)
            row.slack_user_id = slack_user_id
            row.save(update_fields=["slack_user_id"])
    except IntegrityError:
        raise LinkError("This Slack account is linked to another Shiftlog user.") from None
    return f"Linked: your clicks in Slack now decide as {name} in Shiftlog."


def unlink(user) -> str:
    """Forget the person's Slack id; the id it was ("" when there was none)."""
    was = linked_id(user)
    if was:
        Reach.objects.filter(user=user).update(slack_user_id="")
    return was
