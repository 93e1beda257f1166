"""News for people where they are: Slack (agents/slack.py) and mail (agents/mail.py).

The domain calls these inside the transaction that records the news (an approval asked, an
approval settled by anyone or anything, a run paused or ended, a budget nearly spent); each only
writes what is owed and queues a huey task once the transaction commits. Nothing here talks to
Slack or a mail server: an outage there never slows or fails a run.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from agents import eventlog, inputs, jobs
from agents.models import (
    Approval,
    ApprovalSubject,
    EventKind,
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


# The run news a run may choose for itself (Run.slack_news); approvals follow the project's.
RUN_NEWS = ("ended", "paused", "budget")
# A channel as chat.postMessage takes it: its id (C…, G… for an older private one), or #name.
CHANNEL = re.compile(r"(?:[CG][A-Z0-9]{6,20}|#[a-z0-9][a-z0-9._-]{0,79})")


def clean_channel(value: Any, *, field: str = "slack_channel") -> str:
    """A Slack channel as given (an id, or #name), or "" for none; InputError otherwise."""
    text = str(value or "").strip()
    if text and not CHANNEL.fullmatch(text):
        raise inputs.InputError(
            f"slack-channel: {text[:100]!r} is not a Slack channel: give its id (C…, in Slack: "
            "the channel's name → About → Channel ID) or #name (lowercase, no spaces)",
            field,
        )
    return text


def clean_news(value: Any, *, field: str = "slack_news") -> list[str] | None:
    """Which run news a run posts to Slack: None (not given: the project's switches), [] ("off":
    none), or some of ended, paused, budget. Given as a list or as words split by commas or
    spaces; InputError naming an unknown kind."""
    if value is None:
        return None
    if isinstance(value, str):
        words = [w for w in re.split(r"[,\s]+", value.strip()) if w]
        if not words:
            return None
    elif isinstance(value, (list, tuple)):
        words = [str(w).strip() for w in value]
    else:
        raise inputs.InputError("slack-news must be words (ended, paused, budget) or off", field)
    if words in (["off"], []):
        return []
    unknown = [w for w in words if w not in RUN_NEWS]
    if unknown:
        known = ", ".join(RUN_NEWS)
        raise inputs.InputError(
            f"slack-news: unknown kind {unknown[0][:40]!r} (known: {known}; or off alone for none)",
            field,
        )
    return [n for n in RUN_NEWS if n in words]


def news_words(run: Run) -> str:
    """The run's own choice of Slack news, as the CLI and the forms spell it."""
    if run.slack_news is None:
        return ""
    return ", ".join(run.slack_news) or "off"


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
    kind of news switched off). The run's own settings win over its project's: its channel
    (for all its messages, approvals too) and its choice of run news (ended, paused, budget;
    [] for none); what the run leaves unset is the project's."""
    if not slack_on():
        return ""
    return _channel(run, route_for(run), news)


def _channel(run: Run, route: ProjectReach, news: str) -> str:
    if news != "approval" and run.slack_news is not None:
        on = news in run.slack_news
    else:
        on = getattr(route, NEWS_SWITCH[news])
    return (run.slack_channel or route.slack_channel) if on else ""


def set_run_slack(run: Run, *, channel: Any = None, news: Any = None, actor: str) -> Run:
    """Change where a run's Slack news goes: `channel` ("" back to the project's) and `news`
    (words as clean_news takes them, or "project" back to the project's), each None to leave
    as it is. Recorded in the run's log; InputError for a bad value."""
    changes: dict[str, Any] = {}
    if channel is not None:
        changes["slack_channel"] = clean_channel(channel)
    if news is not None:
        given = news.strip() if isinstance(news, str) else news
        changes["slack_news"] = None if given == "project" else clean_news(given)
        if changes["slack_news"] is None and given != "project":
            raise inputs.InputError(
                "slack-news: give any of ended, paused, budget; off; or project",
                "slack_news",
            )
    if changes:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(**changes)
            eventlog.append(run.pk, EventKind.RUN_UPDATED, {"slack": changes}, actor=actor)
        run.refresh_from_db()
    return run


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
    route = route_for(run) if slack_on() else None
    channels = {n: _channel(run, route, n) if route else "" for n in ("approval", *RUN_NEWS)}
    news = [n for n in RUN_NEWS if channels[n]]
    return {
        "slack": channels["approval"],
        "mailed": mailed,
        # The run's news in Slack: which, where, and whether the run chose (else its project).
        "news": news,
        "news_channel": channels[news[0]] if news else "",
        "own": bool(run.slack_channel or run.slack_news is not None),
        "slack_on": slack_on(),
    }
