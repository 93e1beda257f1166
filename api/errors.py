"""Every error as application/problem+json (RFC 9457) with a clear `detail`."""

from __future__ import annotations

import logging
import math
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpResponse
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from agents import approvals, checkpoints, services
from agents.runtime import external

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"


class Problem(Exception):
    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.detail, self.extra = status, detail, extra


def problem(api, request, status: int, detail: str, **extra: Any) -> HttpResponse:
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    response = api.create_response(request, body, status=status)
    response["Content-Type"] = PROBLEM
    return response


def _location(loc: list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "path")]
    return ".".join(parts) or "body"


def install(api) -> None:
    def on(exc_type, status_of, detail_of, **extra_of):
        def handler(request, exc):
            extra = {k: f(exc) for k, f in extra_of.items()}
            response = problem(api, request, status_of(exc), detail_of(exc), **extra)
            if isinstance(exc, Throttled) and exc.wait:
                response["Retry-After"] = str(max(1, math.ceil(exc.wait)))
            return response

        api.add_exception_handler(exc_type, handler)

    def validation_detail(exc: ValidationError) -> str:
        first = exc.errors[0] if exc.errors else {}
        where = _location(first.get("loc", []))
        return f"{where}: {first.get('msg', 'invalid')}"

    def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
        return [
            {"loc": _location(e.get("loc", [])), "msg": str(e.get("msg", ""))} for e in exc.errors
        ]

    on(ValidationError, lambda e: 422, validation_detail, errors=validation_errors)
    on(
        AuthenticationError,
        lambda e: 401,
        lambda e: (
            "a valid API token is needed: "
            "send Authorization: Bearer TOKEN (make one with manage.py create_token)"
        ),
    )
    on(Throttled, lambda e: 429, lambda e: "too many requests for this token; slow down")
    on(HttpError, lambda e: e.status_code, str)
    on(Problem, lambda e: e.status, lambda e: e.detail)
    on(Http404, lambda e: 404, lambda e: str(e) or "not found")
    on(PermissionDenied, lambda e: 403, lambda e: str(e) or "not allowed")
    on(RequestDataTooBig, lambda e: 413, lambda e: "the request body is too large")
    on(external.ExternalError, lambda e: e.status, str)
    # Which rewind the agent has to take in first (it reads its context again).
    on(external.RewoundError, lambda e: e.status, str, rewound=lambda e: e.rewound)
    on(approvals.NotAllowed, lambda e: 403, str)
    on(approvals.ApprovalError, lambda e: 409, str)
    on(services.RunError, lambda e: 422 if getattr(e, "field", None) else 409, str)
    on(checkpoints.CheckpointError, lambda e: 409, str)

    def unexpected(request, exc):
        log.exception("API error on %s %s", request.method, request.path)
        return problem(api, request, 500, "an unexpected error; it has been logged")

    api.add_exception_handler(Exception, unexpected)
