from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from dashboard import access


def header(request) -> dict:
    """The live count of waiting approvals in every page's header (queried only if shown)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"pending_approvals": SimpleLazyObject(lambda: access.pending_count(user))}
