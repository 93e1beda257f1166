"""Which origins may open the live sockets (dashboard/origins.py): the page's own, compared as
scheme, host and port, and the ones the settings name."""

from __future__ import annotations

import pytest

from dashboard import origins

pytestmark = pytest.mark.no_services


def scope(origin: str | None, host: str = "127.0.0.1:8765", scheme: str = "ws") -> dict:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "websocket", "scheme": scheme, "headers": headers}


def test_an_origin_is_scheme_host_and_port():
    assert origins.normalise("http://127.0.0.1:8765") == "http://127.0.0.1:8765"
    assert origins.normalise("HTTP://LocalHost") == "http://localhost:80"
    assert origins.normalise("https://example.org/") == "https://example.org:443"
    assert origins.normalise("http://[::1]:8000") == "http://[::1]:8000"
    for bad in ("null", "", "file:///etc", "javascript:alert(1)", "http://", "http://a:99999"):
        assert origins.normalise(bad) is None, bad


def test_the_pages_own_origin_is_allowed_and_another_port_is_not(settings):
    settings.SHIFTLOG_BASE_URL = "http://127.0.0.1:8000"
    settings.CSRF_TRUSTED_ORIGINS = []
    assert origins.allowed(scope("http://127.0.0.1:8765"))  # the page's own
    assert not origins.allowed(scope("http://127.0.0.1:3000"))  # another port, same host
    assert not origins.allowed(scope("https://127.0.0.1:8765"))  # another scheme
    assert not origins.allowed(scope("http://evil.example:8765"))
    assert not origins.allowed(scope(None))  # browsers always send one
    assert not origins.allowed(scope("null"))  # a sandboxed iframe or a file
    # A host the settings do not allow is no page of ours, whatever the Origin says.
    assert not origins.allowed(scope("http://evil.example:80", host="evil.example"))


def test_the_settings_name_the_other_allowed_origins(settings):
    settings.SHIFTLOG_BASE_URL = "https://shiftlog.example.org"
    settings.CSRF_TRUSTED_ORIGINS = ["https://ops.example.org:8443"]
    assert origins.allowed(scope("https://shiftlog.example.org"))
    assert origins.allowed(scope("https://ops.example.org:8443"))
    assert not origins.allowed(scope("https://ops.example.org"))  # port 443, not 8443


def test_behind_a_tls_proxy_the_forwarded_scheme_counts(settings):
    settings.SHIFTLOG_BASE_URL = "http://127.0.0.1:8000"
    settings.ALLOWED_HOSTS = ["shiftlog.example.org"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    forwarded = scope("https://shiftlog.example.org", host="shiftlog.example.org")
    forwarded["headers"].append((b"x-forwarded-proto", b"https"))
    assert origins.allowed(forwarded)
    plain = scope("https://shiftlog.example.org", host="shiftlog.example.org")
    assert not origins.allowed(plain)  # the proxy did not say https
