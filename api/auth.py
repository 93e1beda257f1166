"""Bearer tokens: who calls, with which scopes, and how often."""

from __future__ import annotations

import re

from django.core.cache import caches
from django.http import Http404
from django.utils import timezone
from ninja.errors import AuthorizationError
from ninja.security import HttpBearer
from ninja.throttling import SimpleRateThrottle

from api.models import ApiToken, digest

# last_used_at is written at most this often per token (not on every request).
TOUCH_EVERY_SECONDS = 60


# What a token made for one run may call: its run's own routes and its run's tool calls. Not a
# person's acts on the run: resume (with budgets), rewind, a note, a wake-up; nor what reaches
# beyond it: fork (a new run), tokens, promote (memory shared with the project).
_RUN_ROUTE = re.compile(r"/api/v1/runs/(\d+)(?:/(.*))?")
_CALL_ROUTE = re.compile(r"/api/v1/tool-calls/[^/]+(?:/(?:result|withdraw))?")
_NOT_FOR_RUN_TOKENS = re.compile(r"(?:fork|tokens|resume|rewind|note|wake|memory/.+/promote)/?")


def found_token(token: str) -> ApiToken | None:
    """The usable token with this text, with its user (no confinement, no touch)."""
    if not token or len(token) > 200:
        return None
    return ApiToken.objects.usable().select_related("user").filter(hash=digest(token)).first()


def confine(request, token: ApiToken) -> None:
    """A token made for one run acts for that run and nothing else: another run's routes are a
    404 (as another person's run is), every other route (lists, approvals, schedules) a 403."""
    if token.run_id is None:
        return
    path = request.path_info
    if run_route := _RUN_ROUTE.fullmatch(path):
        if int(run_route.group(1)) != token.run_id:
            raise Http404(f"no run with id {run_route.group(1)}")
        if not _NOT_FOR_RUN_TOKENS.fullmatch(run_route.group(2) or ""):
            return
    elif _CALL_ROUTE.fullmatch(path):
        return  # the views check the call's run (api/common.py narrows what the token sees)
    raise AuthorizationError(message=f"this token is for run {token.run_id} only")


class Bearer(HttpBearer):
    """`Authorization: Bearer shl_…`: an unknown, revoked or expired token is a 401."""

    def authenticate(self, request, token: str) -> ApiToken | None:
        found = found_token(token)
        if found is None:
            return None
        confine(request, found)
        now = timezone.now()
        if (
            found.last_used_at is None
            or (now - found.last_used_at).total_seconds() > TOUCH_EVERY_SECONDS
        ):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        return found


def need(request, scope: str) -> None:
    """403 unless the request's token has `scope` (a run's token never decides, whatever it
    holds)."""
    token: ApiToken = request.auth
    if scope == "decide" and token.run_id is not None:
        raise AuthorizationError(
            message=f"this token is for run {token.run_id} only and can never decide"
        )
    if scope not in token.scopes:
        raise AuthorizationError(
            message=f"this token lacks the {scope!r} scope (it has: {', '.join(token.scopes)})"
        )


class PerToken(SimpleRateThrottle):
    """SHIFTLOG_API_RATE_PER_MINUTE requests a minute for each token (429 with Retry-After)."""

    scope = "token"
    cache = caches["api"]  # Redis when there is one: the limit holds across web processes

    def __init__(self, per_minute: int) -> None:
        super().__init__(f"{per_minute}/m")

    def get_cache_key(self, request) -> str | None:
        token = getattr(request, "auth", None)
        if token is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.hash[:32]}
