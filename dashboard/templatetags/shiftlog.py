from __future__ import annotations

import json

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince

from agents import money, policy, reach
from dashboard import cards, markup, stream

register = template.Library()


@register.filter
def usd(amount, places: int = 4) -> str:
    """Dollars as every page and command shows them (agents/money.py)."""
    return money.usd(amount, places)


@register.filter
def approval_diff(approval) -> list[tuple[str, str]]:
    return cards.call_diff_lines(approval)


@register.filter
def diff_lines(text: str) -> list[tuple[str, str]]:
    return markup.diff_lines(text or "")


@register.filter
def similar_words(approval) -> str:
    """What "allow similar" would allow, in words: the rule it adds."""
    return policy.similar_rule(approval.tool_name, approval.tool_input)["note"]


@register.filter
def edit_value(approval) -> str:
    return cards.edit_value(approval)


@register.filter
def slack_news_words(run) -> str:
    return reach.news_words(run)


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def is_long(text) -> bool:
    return stream.is_long(str(text or ""))


@register.filter
def head(text) -> str:
    return stream.head(str(text or ""))


@register.filter
def line_count(text) -> int:
    return str(text or "").count("\n") + 1


@register.filter
def ago(moment) -> str:
    """ "12 s ago" under a minute (an agent's contact is counted in seconds), else as timesince
    says ("2 minutes ago")."""
    seconds = (timezone.now() - moment).total_seconds()
    if seconds < 60:
        return f"{max(0, int(seconds))} s ago"
    return f"{timesince(moment, depth=1)} ago"


# The run page re-reads an external run's state this often (a stall pushes nothing): half its
# heartbeat window, between these bounds.
STATE_POLL_SECONDS = (5, 30)


@register.filter
def state_poll(run) -> int:
    low, high = STATE_POLL_SECONDS
    return max(low, min(high, run.heartbeat_window // 2))


@register.filter
def run_href(run_id) -> str:
    """A run page's address from an id in an event's payload ("" for anything but an id: a
    payload is data, and a bad one must not break the page)."""
    if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < 1:
        return ""
    return reverse("run-detail", args=[run_id])


@register.filter
def thousands(value) -> str:
    """12990 as "12,990" (the meters' way of writing tokens)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)
