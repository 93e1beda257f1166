"""Refusing what is not text before any view reads it (and paths with a NUL byte, which no
page has and no PostgreSQL text column takes).

Django decodes form bodies and query strings with errors="replace": invalid UTF-8 becomes U+FFFD
and goes on as if a person had typed it (a note, a goal). A request that is not UTF-8 is refused
here, with 400 and a sentence saying why, so nothing built from a mangled value reaches the log.
"""

from __future__ import annotations

import uuid
from urllib.parse import parse_qsl

from django.http import HttpResponseBadRequest

from agents import logcontext

FORM = "application/x-www-form-urlencoded"


def is_utf8(query: bytes) -> bool:
    """Whether a query string or form body is UTF-8, its percent escapes too."""
    try:
        parse_qsl(query.decode("utf-8"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return False
    return True


class Utf8OnlyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # The server hands over the query string as latin-1 text: its bytes, exactly.
        query = request.META.get("QUERY_STRING", "").encode("latin-1", "replace")
        form = request.content_type == FORM and request.method in ("POST", "PUT", "PATCH")
        if "\x00" in request.path_info:
            return HttpResponseBadRequest(
                "The address contains a NUL byte.", content_type="text/plain; charset=utf-8"
            )
        if not is_utf8(query) or (form and not is_utf8(request.body)):
            return HttpResponseBadRequest(
                "The request is not UTF-8 text: send forms and parameters as UTF-8.",
                content_type="text/plain; charset=utf-8",
            )
        return self.get_response(request)


class RequestIdMiddleware:
    """Each request's id: the proxy's X-Request-ID when it is a plain token, else a new one. It
    is on every log line written while the request is served and on the response's
    X-Request-ID, so an operator finds a request's lines from what the browser or proxy saw."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = logcontext.sane_request_id(request.headers.get("X-Request-ID")) or uuid.uuid4().hex
        # Not reset on the way out: Django logs a refused request (4xx, 5xx) after the
        # middleware has returned. Under ASGI each request has a context of its own; a
        # threaded server's next request on the thread sets its own id here.
        logcontext.request_id.set(rid)
        response = self.get_response(request)
        response["X-Request-ID"] = rid
        return response
