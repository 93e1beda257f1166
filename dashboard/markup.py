"""Turning text into safe HTML for the pages: highlighted code, sanitised Markdown, and unified
diffs split into classed lines. Everything here escapes what it is given."""

from __future__ import annotations

from pathlib import Path

import markdown
import nh3
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, guess_lexer_for_filename
from pygments.util import ClassNotFound


def highlight(text: str, filename: str) -> str:
    """Pygments HTML for a text artifact (Pygments escapes the text itself)."""
    try:
        lexer = guess_lexer_for_filename(Path(filename).name, text)
    except ClassNotFound:
        lexer = TextLexer()
    return pygments_highlight(text, lexer, HtmlFormatter(cssclass="hl", linenos="table"))


def markdown_html(text: str) -> str:
    """Markdown rendered, then sanitised by nh3: no scripts, no handlers, safe links only."""
    html = markdown.markdown(text, extensions=["fenced_code", "tables"])
    return nh3.clean(html, url_schemes={"http", "https", "mailto"})


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs: file, hunk, add, del or ctx."""
    out = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out
