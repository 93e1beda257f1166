"""The client's address for login throttling (django-axes' AXES_CLIENT_IP_CALLABLE).

Without trusted proxies (SHIFTLOG_TRUSTED_PROXIES=0, the default without SHIFTLOG_HTTPS) it is
the connection's own address: X-Forwarded-For is anyone's to write, so it is ignored and a client
cannot dodge a lockout by forging it. Behind N trusted proxies each one appends the address it saw
to X-Forwarded-For, so the client is the N-th entry from the right (what the outermost trusted
proxy saw); what a client wrote further left is never read. A chain shorter than N, or an entry
that is not an address, falls back to the connection's address.

django-ipware was weighed and not used: its proxy count counts entries of the header, not
proxies (with one proxy in front it found no address at all, and with a count of 0 it picked
the left-most public entry, which the client writes), and axes puts every request whose address
is unknown in one bucket, which is the lock-out-everyone failure this module exists to prevent.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def _address(text: str) -> str | None:
    """An address as a proxy writes it: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[::1]:80`."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def client_ip(request: HttpRequest) -> str | None:
    remote = request.META.get("REMOTE_ADDR") or None
    trusted = settings.SHIFTLOG_TRUSTED_PROXIES
    if trusted <= 0:
        return remote
    # Several X-Forwarded-For headers reach Django joined by commas, in order.
    hops = [h for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    if len(hops) < trusted:
        return remote
    return _address(hops[-trusted]) or remote
