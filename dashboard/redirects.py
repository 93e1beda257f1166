"""Where to send a person after an action: only ever a page of this site.

Every redirect target that comes from a request (a `next` field, a parameter) goes through
`safe_next`, which uses Django's url_has_allowed_host_and_scheme: another host, a protocol-relative
`//host`, `javascript:` and backslash tricks fall back to a page of ours."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme


def safe_next(request: HttpRequest, candidate: str | None, fallback: str) -> str:
    """`candidate` when it leads to this site (over HTTPS when the request came that way),
    else `fallback`."""
    if candidate and url_has_allowed_host_and_scheme(
        candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return candidate
    return fallback
