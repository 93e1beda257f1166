"""Inbound webhooks: `POST /hooks/<token>/` makes a run from a trigger's template run
(agents/schedules/triggers.py). A machine endpoint: no login, no CSRF token (the token in the path is the
credential, with an optional HMAC signature), JSON in and out, a clear status for each refusal."""

from __future__ import annotations

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.schedules import triggers

MAX_TOKEN_CHARS = 100


def answer(status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"ok": status < 400, "message": message, **extra}, status=status)


def _over_rate(token_hash: str) -> bool:
    """A fixed one-minute window per trigger, counted where the API's limit is (Redis when
    there is one, so it holds across web processes); keyed by the token's hash, as the API's is
    (an id is reused after a rollback, a hash never)."""
    limit = settings.SHIFTLOG["HOOK_RATE_PER_MINUTE"]
    if not limit:
        return False
    cache = caches["api"]
    key = f"hook-rate:{token_hash[:32]}"
    cache.add(key, 0, timeout=60)
    try:
        return cache.incr(key) > limit
    except ValueError:  # expired between add and incr: a new window
        cache.add(key, 1, timeout=60)
        return False


@csrf_exempt
@require_POST
def hook(request: HttpRequest, token: str) -> JsonResponse:
    trigger = triggers.find(token) if len(token) <= MAX_TOKEN_CHARS else None
    if trigger is None:
        return answer(404, "no such trigger (or it was revoked)")
    if _over_rate(trigger.token_hash):
        response = answer(429, "too many deliveries to this trigger: try again in a minute")
        response["Retry-After"] = "60"
        return response
    if request.content_type != "application/json":
        return answer(415, "send the body as JSON (Content-Type: application/json)")
    limit = settings.SHIFTLOG["HOOK_MAX_BODY_KB"] * 1024
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    body = b"" if declared > limit else request.read(limit + 1)
    if declared > limit or len(body) > limit:
        return answer(413, f"the body is over {limit // 1024} KB")
    done = triggers.deliver(trigger, body, request.headers)
    extra = {}
    if done.run is not None:
        extra = {"run": done.run.pk, "url": request.build_absolute_uri(done.run.get_absolute_url())}
    return answer(done.status, done.message, **extra)
