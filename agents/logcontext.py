"""What a log line is about: the run, its session and the web request being served.

Context variables set where the work starts (a worker's slice binds its run and each session it
opens; the web's RequestIdMiddleware binds the request id), read by `ContextFilter`, which the
console handler runs on every record (shiftlog/settings.py LOGGING). A JSON line
(SHIFTLOG_LOG_FORMAT=json) then has `run_id`, `session` and `request_id` keys, null where there is
none; a plain line gets ` [run 7 session 2]` or ` [request ab12…]` after the logger's name.

Plain Python, no Django: settings name the filter, so it is imported while logging is set up.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from contextvars import ContextVar

from agents.terminal import visible

run_id: ContextVar[int | None] = ContextVar("shiftlog_run_id", default=None)
session: ContextVar[int | None] = ContextVar("shiftlog_session", default=None)
request_id: ContextVar[str | None] = ContextVar("shiftlog_request_id", default=None)

# A request id a proxy sends is kept only when it is a plain token: it goes into logs and a header.
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def sane_request_id(value: str | None) -> str | None:
    return value if value and _SANE_ID.fullmatch(value) else None


@contextlib.contextmanager
def bound_run(run: int) -> Iterator[None]:
    """Log lines written inside are about run `run` (and the session set_session names)."""
    run_token, session_token = run_id.set(run), session.set(None)
    try:
        yield
    finally:
        session.reset(session_token)
        run_id.reset(run_token)


def set_session(index: int | None) -> None:
    """The session the bound run is in now (its number in the run, from 1)."""
    session.set(index)


class ContextFilter(logging.Filter):
    """Adds run_id, session and request_id to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.run_id = run_id.get()
        record.session = session.get()
        record.request_id = request_id.get()
        return True


class PlainFormatter(logging.Formatter):
    """A plain line; `%(context)s` is ` [run 7 session 2]`, ` [request …]` or nothing."""

    def format(self, record: logging.LogRecord) -> str:
        parts = []
        if getattr(record, "run_id", None) is not None:
            parts.append(f"run {record.run_id}")
            if getattr(record, "session", None) is not None:
                parts.append(f"session {record.session}")
        if getattr(record, "request_id", None) is not None:
            parts.append(f"request {record.request_id}")
        record.context = f" [{' '.join(parts)}]" if parts else ""
        # An agent's text in a log line shows its control characters visibly.
        return visible(super().format(record))
