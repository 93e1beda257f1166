"""File names as trees store them, and workspace paths as this package hands them out.

A name (or link target) that is valid UTF-8 is stored as itself; any other byte string, and any
name that itself starts with "b64:", as "b64:" + urlsafe base64 of the raw bytes, so every name
round-trips byte for byte.

Paths handed out (Entry.path, Change.path) are "/"-joined and decoded as UTF-8 with
surrogateescape, so `path.encode("utf-8", "surrogateescape")` gives the exact bytes back;
`display()` makes one printable. Methods taking a path accept that str or the raw bytes.
"""

from __future__ import annotations

import base64

B64_PREFIX = "b64:"


def encode_name(raw: bytes) -> str:
    """A file name (or link target) as a JSON-safe str; reversible with decode_name."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or text.startswith(B64_PREFIX):
        return B64_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")
    return text


def decode_name(key: str) -> bytes:
    if key.startswith(B64_PREFIX):
        return base64.urlsafe_b64decode(key[len(B64_PREFIX) :])
    return key.encode("utf-8")


def display(path: str) -> str:
    """A printable form of a path from this package (undecodable bytes shown as \\xNN)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def to_str(raw: bytes) -> str:
    """A raw workspace-relative path as handed out (reversible with to_bytes)."""
    return raw.decode("utf-8", "surrogateescape")


def to_bytes(path: str | bytes) -> bytes:
    return path if isinstance(path, bytes) else path.encode("utf-8", "surrogateescape")


def join_path(rel: bytes, name: bytes) -> bytes:
    """`rel`/`name` for raw workspace-relative paths ("" being the top)."""
    return rel + b"/" + name if rel else name
