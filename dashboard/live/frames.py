"""Fragments pushed to a page, grouped into WebSocket messages that parse the way they read.

htmx's ws extension parses each message inside a `<template>`, where the first element fixes the
parser's mode for the rest: after a `<span>` (the header's approval count), a `<tr>` is not a
table row but a parse error, and Chromium drops its `<tr>`/`<td>` tags, so the row's update is
lost (`htmx:oobErrorNoTarget`). A row is valid only among rows. So every push goes through
`frames`: consecutive fragments of one kind (table parts, or anything else) share a message, and
a change of kind starts a new one. Each message is swapped out-of-band on its own, in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Elements that are valid only inside a table (the HTML parser's "in table" modes).
TABLE_PART = re.compile(r"\s*<(tr|td|th|tbody|thead|tfoot|caption|colgroup|col)[\s>/]", re.I)


def frames(parts: Iterable[str]) -> list[str]:
    """The messages to send for these fragments, in order (none for empty fragments)."""
    out: list[str] = []
    kind: bool | None = None
    for part in parts:
        if not part:
            continue
        table = bool(TABLE_PART.match(part))
        if out and table == kind:
            out[-1] += part
        else:
            out.append(part)
            kind = table
    return out
