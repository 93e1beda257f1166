"""News for people where they are: Slack (agents/slack.py) and mail (agents/mail.py).

The domain calls these inside the transaction that records the news (an approval asked, an
approval settled by anyone or anything, a run paused or ended, a budget nearly spent); each only
writes what is owed and queues a huey task once the transaction commits. Nothing here talks to
Slack or a mail server: an outage there never slows or fails a run.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db.models import Q

from agents import jobs
from agents.models import (
    Approval,
    ApprovalSubject,
    ProjectReach,
    Reach,
    Run,
    SlackMessage,
    SlackMessageKind,
)

# Which ProjectReach switch lets each kind of run news into Slack.
NEWS_SWITCH = {
    "ended": "slack_run_endings",
    "paused": "slack_pauses",
    "budget": "slack_budget_warnings",
    "approval": "slack_approvals",
}


def slack_on() -> bool:
    return bool(settings.SHIFTLOG["SLACK_BOT_TOKEN"])


def mail_on(switch: str) -> bool:
    """Whether anyone is to be mailed this kind of news (one query; who exactly is found by
    the task, off the request path)."""
    return (
        settings.SHIFTLOG["MAIL_NOTIFICATIONS"] and Reach.objects.filter(**{switch: True}).exists()
    )


def route_for(run: Run) -> ProjectReach:
    """The run's project's Slack settings: its own row, else the default row (blank project),
    else the settings' default channel with every kind of news on (an unsaved row)."""
    rows = {r.project: r for r in ProjectReach.objects.filter(project__in={run.project, ""})}
    route = rows.get(run.project) or rows.get("")
    if route is None:
        return ProjectReach(project="", slack_channel=settings.SHIFTLOG["SLACK_CHANNEL"])
    if not route.slack_channel:
        route.slack_channel = settings.SHIFTLOG["SLACK_CHANNEL"]
    return route


def slack_channel(run: Run, news: str) -> str:
    """The channel this news of the run goes to in Slack, or "" (Slack off, no channel, or this
    kind of news switched off for the run's project)."""
    if not slack_on():
        return ""
    route = route_for(run)
    return route.slack_channel if getattr(route, NEWS_SWITCH[news]) else ""


def approvals_asked(run: Run, approvals: list[Approval]) -> None:
    channel = slack_channel(run, "approval")
    for approval in approvals:
        if channel and not SlackMessage.objects.filter(approval=approval).exists():
            message = SlackMessage.objects.create(
                run_id=run.pk, approval=approval, kind=SlackMessageKind.APPROVAL, channel=channel
            )
            jobs.later("slack_post", message_id=message.pk)
    if approvals and mail_on("mail_approvals"):
        jobs.later("mail_approvals", approval_ids=[a.pk for a in approvals])


def approval_settled(approval_ids: list[int]) -> None:
    """These approvals were decided, expired, discarded or withdrawn: their Slack messages
    are brought up to date (who decided, or why nobody can)."""
    stale = SlackMessage.objects.filter(approval_id__in=approval_ids)
    for message_id in stale.values_list("pk", flat=True):
        SlackMessage.objects.filter(pk=message_id).update(stale=True)
        jobs.later("slack_post", message_id=message_id)


def run_news(run: Run, news: str, text: str) -> None:
    """A run paused, ended, or nearly spent a budget (`news`: paused, ended, budget)."""
    channel = slack_channel(run, news)
    if channel:
        message = SlackMessage.objects.create(
            run_id=run.pk, kind=SlackMessageKind.RUN, channel=channel, text=text
        )
        jobs.later("slack_post", message_id=message.pk)
    if news == "ended" and mail_on("mail_run_endings"):
        jobs.later("mail_run_ended", run_id=run.pk)


def what_is_asked(approval: Approval) -> str:
    """What a person is asked, in a line or a few: the command, the host, or the input."""
    args = approval.tool_input or {}
    if approval.subject == ApprovalSubject.NETWORK_HOST:
        return f"connect to {args.get('host', '')}:{args.get('port', '')}"
    if "command" in args and len(args) <= 2:
        return f"$ {args['command']}"
    return json.dumps(args, indent=1, sort_keys=True)


def may_decide_on(user, run: Run) -> bool:
    """Whether this person may decide what the run asks: the right to decide approvals, and to
    see the run (theirs, or every run)."""
    if user is None or not user.is_active:
        return False
    sees = run.created_by_id == user.pk or user.has_perm("agents.view_run")
    return sees and user.has_perm("agents.decide_approval")


def may_see(user, run: Run) -> bool:
    return bool(user and user.is_active) and (
        run.created_by_id == user.pk or user.has_perm("agents.view_run")
    )


def active_people() -> Q:
    return Q(user__is_active=True) & ~Q(user__email="")


def where_approvals_go(run: Run) -> dict:
    """What the run page says of where the run's approvals are sent: the Slack channel ("" for
    none) and who gets them by mail (besides the inbox, always)."""
    mailed: list[str] = []
    if settings.SHIFTLOG["MAIL_NOTIFICATIONS"]:
        rows = Reach.objects.filter(active_people(), mail_approvals=True).select_related("user")
        mailed = [r.user.get_username() for r in rows[:100] if may_decide_on(r.user, run)]
    return {"slack": slack_channel(run, "approval"), "mailed": mailed}
