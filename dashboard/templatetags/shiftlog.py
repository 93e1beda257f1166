from __future__ import annotations

import json

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from agents import policy
from dashboard import cards, markup, stream

register = template.Library()


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
