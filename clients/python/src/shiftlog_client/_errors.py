"""Errors: every answer of 400 or more becomes a `ShiftlogError` read from its problem+json body."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import httpx


class ShiftlogError(Exception):
    """An error answer from the API (`application/problem+json`).

    `status` is the HTTP status, `title` and `detail` the problem's, `body` the parsed JSON (or
    the text when the body was not JSON), `errors` the list of `{"loc", "msg"}` a 422 carries.
    """

    def __init__(self, status: int, title: str, detail: str, body: Any = None) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.body = body
        errors = body.get("errors") if isinstance(body, dict) else None
        self.errors: list[dict[str, Any]] = errors if isinstance(errors, list) else []
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")


class Unauthorized(ShiftlogError):
    """401: no token, or an unknown, revoked or expired one."""


class Forbidden(ShiftlogError):
    """403: the token lacks the scope (or the user the permission)."""


class NotFound(ShiftlogError):
    """404: no such thing, or one this token's user may not see."""


class Conflict(ShiftlogError):
    """409: the run's state forbids the act (resume a running run, decide a decided approval)."""


class Rewound(Conflict):
    """409: a person rewound the run and the agent has not taken it in: it reads the run's
    context again (and restores its folder from the checkpoint) before it uploads, hands off
    or finishes. `rewound` is the rewind: `{"checkpoint", "by", "note"}`."""

    def __init__(self, status: int, title: str, detail: str, body: Any = None) -> None:
        super().__init__(status, title, detail, body)
        self.rewound: dict[str, Any] = body["rewound"]


class Invalid(ShiftlogError):
    """422 or 400: the request was malformed; `errors` names the fields."""


class TooLarge(ShiftlogError):
    """413: a body over its limit."""


class RateLimited(ShiftlogError):
    """429: too many requests; `retry_after` is the seconds the server asked to wait."""

    def __init__(
        self, status: int, title: str, detail: str, body: Any = None, retry_after: float = 1.0
    ) -> None:
        super().__init__(status, title, detail, body)
        self.retry_after = retry_after


_CLASSES: dict[int, type[ShiftlogError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
}


def retry_after_seconds(response: httpx.Response, default: float = 1.0) -> float:
    """The `Retry-After` header in seconds (a number or an HTTP date), or `default`."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - time.time())


def error_from_response(response: httpx.Response) -> ShiftlogError:
    """The exception for an error answer (its body must have been read)."""
    status = response.status_code
    body: Any
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = response.text
    if isinstance(body, dict):
        title = str(body.get("title") or response.reason_phrase or "Error")
        detail = body.get("detail")
        detail = "" if detail is None else detail if isinstance(detail, str) else json.dumps(detail)
    else:
        title = response.reason_phrase or "Error"
        detail = str(body)[:500]
    if status == 429:
        return RateLimited(status, title, detail, body, retry_after_seconds(response))
    if status == 409 and isinstance(body, dict) and isinstance(body.get("rewound"), dict):
        return Rewound(status, title, detail, body)
    cls = _CLASSES.get(status, ShiftlogError)
    return cls(status, title, detail, body)
