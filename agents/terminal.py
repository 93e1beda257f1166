"""Text for a terminal: what an agent wrote is shown, never obeyed.

An agent's text (a command, a host name, a file, a summary) reaches people's terminals through the
CLI and the logs. Escape sequences in it would set the window title, colour or hide text, move the
cursor over what was printed, or make one host name read as another (a carriage return, a
backspace, a right-to-left override). `visible` writes every character that is not printable as
its escape (`\\x1b`, `\\r`, `\\u202e`), keeping only the newlines and tabs a format lays out text
with. Every management command's stdout and stderr pass through `VisibleOutput` (the commands'
base class in agents/management/base.py), and the console log handler through `VisibleFormatter`.
"""

from __future__ import annotations

import logging
import re

KEEP = "\n\t"
# Candidates only (anything outside printable ASCII); str.isprintable decides the rest, so
# C0 and C1 controls, DEL, format characters (bidi overrides, zero widths), line and paragraph
# separators, unassigned and private-use code points and non-ASCII spaces are all shown escaped.
_CANDIDATE = re.compile(r"[^\x20-\x7e\n\t]")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str, keep: str = KEEP) -> str:
    """`text` with each character that is not printable shown as its escape (but those in
    `keep`)."""
    if not isinstance(text, str):
        text = str(text)

    def sub(m: re.Match) -> str:
        ch = m.group()
        return ch if ch.isprintable() or ch in keep else _escape(ch)

    return _CANDIDATE.sub(sub, text)


class VisibleFormatter(logging.Formatter):
    """The console log's formatter: a record's whole text (message, arguments, traceback)
    shown visibly."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))
