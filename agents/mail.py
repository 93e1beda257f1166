"""Mail: approvals and run endings sent through Django's email backend to the people who opted
in (Reach.mail_approvals / mail_run_endings), each with a plain-text and an HTML part (rendered
from templates/mail/, escaped).

An approval's mail carries a one-time link per person: a MailLink row, its id signed with a
TimestampSigner (expiring after MAIL_LINK_SECONDS). The link opens the decision page
(dashboard/mail_views.py): the person logs in, as the person it was sent to, and confirms
there; the decision made through it uses it up. When more than MAIL_DIGEST_AFTER approval mails
went to one person within MAIL_DIGEST_SECONDS, the next ones wait (held links) and go out as one
digest at the end of that window.

Sent by huey tasks after the news commits; a mail server that is down costs a warning in the
log, never a run.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.utils import timezone

from agents import jobs, reach
from agents.models import Approval, ApprovalStatus, MailLink, Reach, Run

log = logging.getLogger(__name__)

SALT = "shiftlog.mail-link"


class LinkError(ValueError):
    """A mailed link that cannot be used: forged, expired, used, or someone else's; `status`
    is the page's HTTP status."""

    def __init__(self, words: str, status: int = 410) -> None:
        super().__init__(words)
        self.status = status


def sign(link: MailLink) -> str:
    return signing.TimestampSigner(salt=SALT).sign(str(link.pk))


def link_url(link: MailLink) -> str:
    return f"{settings.SHIFTLOG_BASE_URL}/approvals/mail/{sign(link)}/"


def open_link(token: str, user) -> MailLink:
    """The link this token names, for this user; LinkError saying why it cannot be used."""
    signer = signing.TimestampSigner(salt=SALT)
    try:
        link_id = int(signer.unsign(token, max_age=settings.SHIFTLOG["MAIL_LINK_SECONDS"]))
    except signing.SignatureExpired:
        raise LinkError(
            "This link has expired: open the approvals inbox to decide instead."
        ) from None
    except (signing.BadSignature, ValueError):
        raise LinkError("This link is not valid (it may have been cut short).", 400) from None
    link = MailLink.objects.select_related("approval__run").filter(pk=link_id).first()
    if link is None:
        raise LinkError("This link is not valid any more.", 400)
    if link.user_id != user.pk:
        raise LinkError(
            "This link was sent to someone else: log in as the person it was mailed to.", 403
        )
    if link.used_at is not None:
        raise LinkError(
            f"This link was already used, at {link.used_at:%Y-%m-%d %H:%M} UTC; each link "
            "works once."
        )
    return link


def use_link(link: MailLink) -> bool:
    """Use the link up; False when it was used meanwhile (a second tab, a double click)."""
    return bool(MailLink.objects.filter(pk=link.pk, used_at=None).update(used_at=timezone.now()))


def give_back(link: MailLink) -> None:
    """A link used for a decision that did not happen (no reason given): good again, while its
    approval still waits."""
    if Approval.objects.filter(pk=link.approval_id).pending().exists():
        MailLink.objects.filter(pk=link.pk).update(used_at=None)


# --- who is mailed ---------------------------------------------------------------------------
def deciders(run: Run) -> list:
    """People who opted in to approval mails and may decide on the run."""
    rows = Reach.objects.filter(reach.active_people(), mail_approvals=True).select_related("user")
    return [r.user for r in rows if reach.may_decide_on(r.user, run)]


def watchers(run: Run) -> list:
    rows = Reach.objects.filter(reach.active_people(), mail_run_endings=True).select_related("user")
    return [r.user for r in rows if reach.may_see(r.user, run)]


def _send(user, subject: str, template: str, context: dict) -> bool:
    context = {**context, "user": user, "base_url": settings.SHIFTLOG_BASE_URL}
    mail = EmailMultiAlternatives(
        subject=subject[:200].replace("\n", " "),
        body=render_to_string(f"mail/{template}.txt", context),
        to=[user.email],
    )
    mail.attach_alternative(render_to_string(f"mail/{template}.html", context), "text/html")
    try:
        mail.send()
    except Exception as e:  # the mail server's trouble never reaches a run
        log.warning("could not mail %s (%s): %s", user.get_username(), template, type(e).__name__)
        return False
    return True


# --- approvals -------------------------------------------------------------------------------
def mail_approvals(approval_ids: list[int]) -> int:
    """Mail each approval (still pending) to each person who may decide it, or hold it for
    their digest when they had many lately. How many mails went out."""
    sent = 0
    window = timedelta(seconds=settings.SHIFTLOG["MAIL_DIGEST_SECONDS"])
    for approval in Approval.objects.filter(pk__in=approval_ids).pending().select_related("run"):
        for user in deciders(approval.run):
            if MailLink.objects.filter(approval=approval, user=user).exists():
                continue
            recent = MailLink.objects.filter(user=user, created_at__gte=timezone.now() - window)
            held = recent.filter(mailed_at=None).exists()
            link = MailLink.objects.create(approval=approval, user=user)
            if held or recent.exclude(pk=link.pk).count() >= settings.SHIFTLOG["MAIL_DIGEST_AFTER"]:
                if not held:  # the first one held: its digest goes at the window's end
                    jobs.schedule("mail_digest", delay=window.total_seconds(), user_id=user.pk)
                continue
            if _send(
                user,
                f"[Shiftlog] run {approval.run_id} asks to use {approval.tool_name}",
                "approval",
                {
                    "approval": approval,
                    "run": approval.run,
                    "asked": reach.what_is_asked(approval),
                    "url": link_url(link),
                },
            ):
                MailLink.objects.filter(pk=link.pk).update(mailed_at=timezone.now())
                sent += 1
    return sent


def mail_digest(user_id: int) -> int:
    """One mail with every held link of this person whose approval still waits; how many it
    listed (0: nothing sent)."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    held = MailLink.objects.filter(user_id=user_id, mailed_at=None, used_at=None)
    if user is None:
        return 0
    links = list(
        held.filter(approval__status=ApprovalStatus.PENDING)
        .select_related("approval__run")
        .order_by("pk")
    )
    # The ones decided meanwhile are no news: not mailed, and no longer held.
    held.exclude(approval__status=ApprovalStatus.PENDING).update(mailed_at=timezone.now())
    links = [link for link in links if reach.may_decide_on(user, link.approval.run)]
    if not links:
        return 0
    items = [(link.approval, reach.what_is_asked(link.approval), link_url(link)) for link in links]
    if _send(user, f"[Shiftlog] {len(items)} approvals wait for you", "digest", {"items": items}):
        MailLink.objects.filter(pk__in=[link.pk for link in links]).update(mailed_at=timezone.now())
        return len(items)
    return 0


# --- run endings -----------------------------------------------------------------------------
def mail_run_ended(run_id: int) -> int:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return 0
    sent = 0
    for user in watchers(run):
        sent += _send(
            user,
            f"[Shiftlog] run {run.pk} {run.status}",
            "run_ended",
            {"run": run, "url": f"{settings.SHIFTLOG_BASE_URL}/runs/{run.pk}/"},
        )
    return sent
