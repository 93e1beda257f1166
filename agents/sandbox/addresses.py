"""Where a connection may go: the host names a person can be asked about, and the addresses a
connection to the outside may reach. Shared by the egress proxy (agents/sandbox/egress.py) and
webhook deliveries (agents/notifications.py). Pure Python, no Django.

- `host_problem(host)`: why a host name is no name anyone could decide about (not ASCII, not
  letters/digits/hyphens in dot-separated labels, too long, a bad IDNA A-label), or None.
- `resolve(host, port)`: the one place names are resolved (tests replace it to play DNS).
- `checked_address(host, port, allow_private=...)`: resolve once and return the address to
  connect to, or raise `Refused` with the reason: the name does not resolve, or it resolves to a
  loopback, private, link-local or otherwise non-public address. The caller connects to that
  address and nothing else, so DNS cannot answer differently between the check and the
  connection (rebinding); every connection is checked again.
"""

from __future__ import annotations

import ipaddress
import re
import socket

import idna

MAX_HOST = 253
MAX_LABEL = 63
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


class Refused(Exception):
    """A connection refused before it is made; str() is the reason, for a person or an agent."""

    def __init__(self, reason: str, decision: str = "blocked") -> None:
        super().__init__(reason)
        self.decision = decision


def is_public(address: str) -> bool:
    """True for a globally routable unicast address (not loopback, private, link-local, shared,
    reserved, multicast, documentation, ...; an IPv4-mapped IPv6 address is judged as IPv4)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.teredo is not None:
            return False
        if ip in _NAT64:  # the IPv4 address a NAT64 gateway would connect to
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        else:
            ip = ip.ipv4_mapped or ip.sixtofour or ip
    return ip.is_global and not ip.is_multicast


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def normal_host(host: str) -> str:
    """The host as rules and approvals name it: lower case, no trailing dot, IPv6 unbracketed."""
    host = host.strip().lower().rstrip(".")
    ip = _ip(host)
    return str(ip) if ip is not None else host


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a host name a connection goes to (and a person be asked about), or
    None when it can: an IP address, or an ASCII name of LDH labels (IDNA A-labels valid)."""
    if not host:
        return "there is no host name"
    if len(host) > MAX_HOST + 2:
        return f"the host name is {len(host):,} characters long (at most {MAX_HOST})"
    if not host.isascii() or not host.isprintable():
        return "the host name has characters that are not letters, digits, hyphens or dots"
    if _ip(host) is not None:
        return None
    name = host.lower().removesuffix(".")
    if len(name) > MAX_HOST:
        return f"the host name is {len(name):,} characters long (at most {MAX_HOST})"
    for label in name.split("."):
        if not label:
            return "the host name has an empty label"
        if len(label) > MAX_LABEL:
            return f"a label of the host name is {len(label)} characters long (at most 63)"
        if not _LABEL.match(label):
            return "the host name has characters that are not letters, digits, hyphens or dots"
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except idna.IDNAError as e:
                return f"the host name is not valid IDNA ({e})"
        elif label[2:4] == "--":
            return "the host name has a label with '--' in 3rd and 4th position that is not IDNA"
    return None


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (the seam tests replace); OSError when it does not."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def checked_address(host: str, port: int, *, allow_private: bool = False) -> str:
    """Resolve `host` once and return the address to connect to, or raise Refused."""
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError) as e:
        raise Refused(f"{host} could not be resolved ({e})", "unresolved") from None
    if not addresses:
        raise Refused(f"{host} could not be resolved (no address)", "unresolved")
    if not allow_private:
        # All of them: a name that also resolves to this machine is refused, whichever comes first.
        private = [a for a in addresses if not is_public(a)]
        if private:
            raise Refused(
                f"{host} resolves to {private[0]}, an address on this machine or a private network",
                "blocked",
            )
    return addresses[0]
