"""Bearer tokens: who calls, with which scopes, and how often."""

from __future__ import annotations

from django.core.cache import caches
from django.utils import timezone
from ninja.errors import AuthorizationError
from ninja.security import HttpBearer
from ninja.throttling import SimpleRateThrottle

from api.models import ApiToken, digest

# last_used_at is written at most this often per token (not on every request).
TOUCH_EVERY_SECONDS = 60


class Bearer(HttpBearer):
    """`Authorization: Bearer shl_…`: an unknown, revoked or expired token is a 401."""

    def authenticate(self, request, token: str) -> ApiToken | None:
        if not token or len(token) > 200:
            return None
        found = ApiToken.objects.usable().select_related("user").filter(hash=digest(token)).first()
        if found is None:
            return None
        now = timezone.now()
        if (
            found.last_used_at is None
            or (now - found.last_used_at).total_seconds() > TOUCH_EVERY_SECONDS
        ):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        return found


def need(request, scope: str) -> None:
    """403 unless the request's token has `scope`."""
    token: ApiToken = request.auth
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
