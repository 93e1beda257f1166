"""Which origins may open the live sockets: the page's own (scheme, host and port), and the
ones the settings name (SHIFTLOG_BASE_URL, CSRF_TRUSTED_ORIGINS).

A session cookie is sent with every request to the host, whatever its port (SameSite=Lax treats
every port of a host as the same site), so a page served from another port of the same machine
(a developer's local tool, say) could otherwise open a socket with the supervisor's cookie and read
the run's events. Comparing the host alone, as channels' AllowedHostsOriginValidator does, lets it
through; an origin is scheme, host and port, compared whole.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise(origin: str) -> str | None:
    """`scheme://host:port` in lower case with the port spelt out; None if it is no origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host or parts.path not in ("", "/"):
        return None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def configured() -> set[str]:
    """The origins the settings allow besides each page's own."""
    named = [settings.SHIFTLOG_BASE_URL, *settings.CSRF_TRUSTED_ORIGINS]
    return {o for o in (normalise(n) for n in named) if o}


def own_origin(scope) -> str | None:
    """The origin the page was served from: the Host the browser asked for, with the scheme it
    used (behind a TLS proxy, the forwarded one)."""
    headers = dict(scope.get("headers") or [])
    host = headers.get(b"host", b"").decode("latin1")
    if not host or not validate_host(host.rsplit(":", 1)[0].strip("[]"), settings.ALLOWED_HOSTS):
        return None
    secure = scope.get("scheme") in ("wss", "https")
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy is not None:
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        secure = headers.get(name, b"").decode("latin1") == proxy[1]
    return normalise(f"{'https' if secure else 'http'}://{host}")


def allowed(scope) -> bool:
    headers = dict(scope.get("headers") or [])
    origin = normalise(headers.get(b"origin", b"").decode("latin1"))
    if origin is None:  # browsers always send one with a WebSocket handshake
        return False
    return origin == own_origin(scope) or origin in configured()


class SameOriginValidator:
    """ASGI middleware for the sockets: refuse the handshake (403) unless the Origin header is
    the page's own origin or one the settings name."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards WebSocket connections only")
        if allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
