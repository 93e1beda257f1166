from __future__ import annotations

from django.conf import settings
from django.utils.functional import SimpleLazyObject

from agents import access


def header(request) -> dict:
    """The live count of waiting approvals in every page's header (queried only if shown), and
    how commands are run here (pages that name one: `.venv/bin/python manage.py` in a checkout,
    `shiftlog manage` for the installed package)."""
    named = {"manage_command": settings.MANAGE_COMMAND}
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return named
    return {**named, "pending_approvals": SimpleLazyObject(lambda: access.pending_count(user))}
