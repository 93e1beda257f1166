"""`Idempotency-Key` on the API's POSTs: a retried write gets the first answer, never a second
run, call or decision.

A POST to /api/v1/ with the header is stored under its token's user and the key, with a hash of
the request (method, path, query, body). The same key from the same user within IDEMPOTENCY_TTL:
- for the same request, the stored answer (status, body), with `Idempotent-Replayed: true`;
- while the first is still being answered, 409 with Retry-After (the client waits and asks again);
- for a different request, 422: a key names one request.
Answers that say nothing about the request's effect are not kept (401, 403, 429 and 5xx), so the
same key may be sent again after them. Without the header nothing changes.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from http import HTTPStatus
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.decorators import sync_and_async_middleware

from api.models import ApiToken, IdempotentRequest, digest

API_PREFIX = "/api/v1/"
HEADER = "Idempotency-Key"
IDEMPOTENCY_TTL = timedelta(hours=24)
# A first request still unanswered after this long died with its process: its key is free again.
STALE_AFTER = timedelta(minutes=10)
NOT_KEPT = {401, 403, 429}
PROBLEM = "application/problem+json"


def _problem(status: int, detail: str, **headers: str) -> HttpResponse:
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status}
    response = JsonResponse({**body, "detail": detail}, status=status, content_type=PROBLEM)
    for name, value in headers.items():
        response[name] = value
    return response


def _applies(request: HttpRequest) -> bool:
    return (
        request.method == "POST"
        and request.path.startswith(API_PREFIX)
        and HEADER in request.headers
    )


def _caller(request: HttpRequest) -> tuple[int, int | None] | None:
    """The token's user and, for a token made for one run, that run."""
    header = request.headers.get("Authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    if not token or len(token) > 200:
        return None
    return (
        ApiToken.objects.usable()
        .filter(hash=digest(token))
        .values_list("user_id", "run_id")
        .first()
    )


def _fingerprint(request: HttpRequest, run_only: int | None = None) -> str:
    h = hashlib.sha256()
    if run_only is not None:
        # A token made for one run never gets the answer kept for another token of its user.
        h.update(f"run {run_only}\0".encode())
    for part in (request.method or "", request.path, request.META.get("QUERY_STRING", "")):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    h.update(request.body)
    return h.hexdigest()


def begin(request: HttpRequest) -> HttpResponse | IdempotentRequest | None:
    """The stored answer or a refusal to send back; a row to fill with the answer; or None when
    the key does not apply (no valid token: the view answers 401)."""
    key = request.headers[HEADER]
    if not (0 < len(key) <= 255 and key.isascii() and key.isprintable()):
        return _problem(422, f"{HEADER} must be 1 to 255 printable ASCII characters")
    caller = _caller(request)
    if caller is None:
        return None
    user_id, run_only = caller
    try:
        fingerprint = _fingerprint(request, run_only)
    except RequestDataTooBig:
        return None  # the view answers 413
    now = timezone.now()
    IdempotentRequest.objects.filter(created_at__lt=now - IDEMPOTENCY_TTL).delete()
    try:
        with transaction.atomic():
            row, created = IdempotentRequest.objects.get_or_create(
                user_id=user_id, key=key, defaults={"fingerprint": fingerprint}
            )
    except IntegrityError:  # another request with the key won the race: it is in progress
        return _problem(409, f"a request with this {HEADER} is in progress", **{"Retry-After": "1"})
    if created:
        return row
    if row.fingerprint != fingerprint:
        return _problem(422, f"this {HEADER} was used for a different request; use a new key")
    if row.status is None:
        took_over = row.created_at < now - STALE_AFTER and IdempotentRequest.objects.filter(
            pk=row.pk, status__isnull=True, created_at=row.created_at
        ).update(created_at=now)
        if took_over:
            return row
        return _problem(409, f"a request with this {HEADER} is in progress", **{"Retry-After": "1"})
    response = HttpResponse(bytes(row.body), status=row.status, content_type=row.content_type)
    response["Idempotent-Replayed"] = "true"
    return response


def finish(row: IdempotentRequest, response: HttpResponse | None) -> None:
    """Keep the answer, or forget the key when the answer says nothing of the effect."""
    if (
        response is None
        or response.streaming
        or response.status_code >= 500
        or response.status_code in NOT_KEPT
    ):
        IdempotentRequest.objects.filter(pk=row.pk).delete()
        return
    IdempotentRequest.objects.filter(pk=row.pk).update(
        status=response.status_code,
        content_type=response.get("Content-Type", "")[:100],
        body=response.content,
    )


@sync_and_async_middleware
def idempotency_middleware(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            if not _applies(request):
                return await get_response(request)
            begun = await sync_to_async(begin)(request)
            if not isinstance(begun, IdempotentRequest):
                return begun if begun is not None else await get_response(request)
            response = None
            try:
                response = await get_response(request)
            finally:
                await sync_to_async(finish)(begun, response)
            return response

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            if not _applies(request):
                return get_response(request)
            begun = begin(request)
            if not isinstance(begun, IdempotentRequest):
                return begun if begun is not None else get_response(request)
            response = None
            try:
                response = get_response(request)
            finally:
                finish(begun, response)
            return response

    return middleware
