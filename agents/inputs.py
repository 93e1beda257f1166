"""Checks for what people (and their scripts) hand in, so bad input gets a clear error, never a
crash: numbers within what the database can hold, finite amounts of money, text without NUL
bytes and of a sane length, JSON of bounded size and depth. The web forms, the CLI and the
services all use these, so the limits and the messages are the same wherever the input came in.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit


class InputError(ValueError):
    """Bad input; the message says what to change. `field` names the input when known."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotJSON(InputError):
    """Text that does not parse as JSON at all (as opposed to JSON that breaks a limit)."""


# What the columns hold on every backend (PositiveIntegerField is a 32-bit integer on
# PostgreSQL; ids and big counters 64-bit; money is DecimalField(max_digits=12, places=6)).
MAX_INT = 2_147_483_647
MAX_BIG_INT = 9_223_372_036_854_775_807
MAX_DOLLARS = Decimal("999999.999999")
MAX_JSON_BYTES = 1_000_000
MAX_JSON_DEPTH = 32
MAX_TEXT = 20_000  # a goal, a note, a comment
MAX_LINE = 2_000  # a check command, a label, a name


def whole_number(
    value: Any, *, what: str, minimum: int = 1, maximum: int = MAX_INT, field: str | None = None
) -> int:
    """An int in [minimum, maximum], from an int or its decimal text."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a whole number", field)
    if isinstance(value, str):
        value = value.strip()
        digits = value.removeprefix("-").removeprefix("+")
        if not (digits.isascii() and digits.isdigit()):
            raise InputError(f"{what} must be a whole number, not {short(value)!r}", field)
        if len(digits) > 30:  # far past any limit: no need to build the number
            raise InputError(f"{what} must be at most {maximum:,}", field)
        value = int(value)
    if not isinstance(value, int):
        raise InputError(f"{what} must be a whole number", field)
    if value < minimum:
        raise InputError(f"{what} must be at least {minimum}", field)
    if value > maximum:
        raise InputError(f"{what} must be at most {maximum:,}", field)
    return value


def object_id(value: Any, *, what: str, field: str | None = None) -> int:
    """A row id: a positive whole number a database key can hold."""
    return whole_number(value, what=what, maximum=MAX_BIG_INT, field=field)


def dollars(value: Any, *, what: str, field: str | None = None) -> Decimal:
    """A positive, finite amount of dollars the database can hold, to the millionth."""
    try:
        amount = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise InputError(
            f"{what} must be a number of dollars, not {short(value)!r}", field
        ) from None
    if not amount.is_finite():
        raise InputError(f"{what} must be a finite number of dollars", field)
    if amount <= 0 or amount > MAX_DOLLARS:
        raise InputError(f"{what} must be more than 0 and at most {MAX_DOLLARS}", field)
    return amount.quantize(Decimal("0.000001"))


def text(
    value: Any,
    *,
    what: str,
    max_length: int = MAX_TEXT,
    required: bool = True,
    field: str | None = None,
    empty: str = "",
) -> str:
    """Text, stripped: no NUL byte (no database keeps one) and at most `max_length` long.
    `empty` is the message when required text is missing."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InputError(f"{what} must be text", field)
    if "\x00" in value:
        raise InputError(f"{what} contains a NUL byte", field)
    value = value.strip()
    if required and not value:
        raise InputError(empty or f"{what} is empty", field)
    if len(value) > max_length:
        raise InputError(
            f"{what} is too long ({len(value):,} characters, at most {max_length:,})", field
        )
    return value


def http_url(value: Any, *, what: str, field: str | None = None) -> str:
    """An http:// or https:// URL with a host (webhooks: no file://, no other scheme)."""
    url = text(value, what=what, max_length=MAX_LINE, field=field)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise InputError(f"{what} {short(url)!r} is not a URL", field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"{what} {short(url)!r} must be an http:// or https:// URL", field)
    return url


def load_json(
    raw: str | bytes,
    *,
    what: str,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    field: str | None = None,
) -> Any:
    """Parse JSON that came from outside: size and nesting checked before it is parsed (Python's
    parser recurses), NaN and Infinity refused (no column or API holds them)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{what} is not UTF-8 text: {e}", field) from None
    if len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
        raise InputError(f"{what} is larger than {max_bytes:,} bytes", field)
    if nesting(raw) > max_depth:
        raise InputError(f"{what} is nested more than {max_depth} levels deep", field)

    def refuse(constant: str):
        raise InputError(f"{what}: {constant} is not a number JSON allows", field)

    try:
        return json.loads(raw, parse_constant=refuse)
    except json.JSONDecodeError as e:
        raise NotJSON(f"{what} is not valid JSON: {e}", field) from None


def nesting(raw: str) -> int:
    """How deep the brackets of a JSON text go (strings skipped), without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def short(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
