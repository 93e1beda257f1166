"""The event stream as the page shows it: rows built from Event values, and the fragments
(template partials) that both the page and its WebSocket push render.

Rows are built from plain values (not model instances) so the same code serves a page query and a
message that came through the channel layer.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.eventlog import describe
from agents.models import Approval, Event

PAGE_SIZE = 50  # events on first open, and per "older" page
LONG_LINES = 12
LONG_CHARS = 1500
EVENT_FIELDS = ("pk", "run_id", "seq", "session_id", "kind", "actor", "payload", "created_at")


@dataclass
class Row:
    pk: int
    run_id: int
    seq: int
    kind: str
    actor: str
    payload: dict[str, Any]
    created_at: datetime
    session_id: int | None = None
    approval: Approval | None = None
    abandoned: bool = False  # on a branch a rewind left behind
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return describe(self.kind, self.payload)

    @property
    def css(self) -> str:
        return self.kind.replace(".", "-")

    @property
    def text(self) -> str:
        return str(self.payload.get("text") or "")

    @property
    def usage(self) -> dict[str, Any]:
        return self.payload.get("usage") or {}

    @property
    def tool_name(self) -> str:
        return str(self.payload.get("name") or self.payload.get("tool") or "")

    @property
    def tool_input(self) -> dict[str, Any]:
        return self.payload.get("input") or {}

    @property
    def command(self) -> str:
        return str(self.tool_input.get("command") or "")

    @property
    def input_json(self) -> str:
        return json.dumps(self.tool_input, indent=2, ensure_ascii=False)

    @property
    def output(self) -> str:
        return str(self.payload.get("output") or "")

    @property
    def output_is_long(self) -> bool:
        return is_long(self.output)

    @property
    def output_head(self) -> str:
        return head(self.output)

    @property
    def is_error(self) -> bool:
        return bool(self.payload.get("is_error"))

    @property
    def actor_label(self) -> str:
        if self.actor.startswith("worker:"):
            return "worker"
        return self.actor.removeprefix("user:")


def is_long(text: str) -> bool:
    return len(text) > LONG_CHARS or text.count("\n") > LONG_LINES


def head(text: str) -> str:
    lines = text.splitlines()[:LONG_LINES]
    return "\n".join(lines)[:LONG_CHARS]


def to_message(values: dict[str, Any]) -> dict[str, Any]:
    """An event's values made safe for any channel layer (msgpack has no datetimes)."""
    out = {k: values[k] for k in EVENT_FIELDS}
    out["created_at"] = values["created_at"].timestamp()
    return out


def from_message(values: dict[str, Any]) -> Row:
    created = values["created_at"]
    if not isinstance(created, datetime):
        created = datetime.fromtimestamp(created, tz=UTC)
    return Row(**{**{k: values[k] for k in EVENT_FIELDS}, "created_at": created})


def attach_approvals(rows: list[Row]) -> list[Row]:
    """One query for the approvals the rows mention, so each card shows its current state."""
    ids = {r.payload.get("approval_id") for r in rows if r.kind == "approval.requested"} - {None}
    if ids:
        found = Approval.objects.select_related("run", "decided_by").in_bulk(ids)
        for r in rows:
            if r.kind == "approval.requested":
                r.approval = found.get(r.payload.get("approval_id"))
    return rows


def in_ranges(seq: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether seq is in one of the (after, upto] ranges of agents.checkpoints.abandoned_ranges."""
    return any(after < seq <= upto for after, upto in ranges)


def mark_abandoned(rows: list[Row], ranges: list[tuple[int, int]]) -> list[Row]:
    """Flag the rows on abandoned branches, from ranges read once (no query per row)."""
    if ranges:
        for r in rows:
            r.abandoned = in_ranges(r.seq, ranges)
    return rows


def newest(run_id: int, *, before: int | None = None, limit: int = PAGE_SIZE) -> list[Row]:
    """The newest `limit` events (before `before`), oldest first: the (run, seq) index only."""
    qs = Event.objects.filter(run_id=run_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    values = list(qs.order_by("-seq").values(*EVENT_FIELDS)[:limit])
    values.reverse()
    return attach_approvals([Row(**v) for v in values])


def after(run_id: int, seq: int, *, limit: int = 1000) -> list[Row]:
    values = Event.objects.for_run(run_id, after=seq).values(*EVENT_FIELDS)[:limit]
    return attach_approvals([Row(**v) for v in values])


# --- approvals -------------------------------------------------------------------------------
def _workspace_file(run, rel: str, limit: int = 200_000) -> str | None:
    root = run.workspace_path.resolve()
    try:
        target = (root / rel).resolve()
    except (OSError, ValueError):
        return None
    if root not in target.parents or not target.is_file() or target.stat().st_size > limit:
        return None
    try:
        return target.read_text(errors="replace")
    except OSError:
        return None


def _unified(a: str, b: str, before: str, after_: str) -> str:
    return "".join(
        difflib.unified_diff(
            a.splitlines(keepends=True),
            b.splitlines(keepends=True),
            before,
            after_,
        )
    )


def approval_diff(approval: Approval) -> str:
    """What the call would do, as a diff: the command for bash, the edit for the file tools."""
    args = approval.edited_input or approval.tool_input or {}
    if approval.tool_name == "bash":
        return f"+ $ {args.get('command', '')}"
    path = str(args.get("path", ""))
    if approval.tool_name == "edit_file":
        return _unified(
            str(args.get("old_string", "")), str(args.get("new_string", "")), path, path
        )
    if approval.tool_name == "write_file":
        current = _workspace_file(approval.run, path) if path else None
        return _unified(
            current or "", str(args.get("content", "")), path if current else "/dev/null", path
        )
    return json.dumps(args, indent=2, ensure_ascii=False)


def diff_lines(text: str) -> list[tuple[str, str]]:
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


def edit_value(approval: Approval) -> str:
    """What the edit box starts with: the command for bash, the input's JSON otherwise."""
    if approval.tool_name == "bash":
        return str(approval.tool_input.get("command", ""))
    return json.dumps(approval.tool_input, indent=2, ensure_ascii=False)


def parse_edit(approval: Approval, raw: str) -> dict[str, Any]:
    """The edited input from the edit box; raises ValueError with a readable message."""
    if approval.tool_name == "bash":
        if not raw.strip():
            raise ValueError("the command cannot be empty")
        return {**approval.tool_input, "command": raw.replace("\r\n", "\n")}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("the input must be a JSON object")
    return value


def highlight(text: str, filename: str) -> str:
    """Pygments HTML for a text artifact (Pygments escapes the text itself)."""
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import TextLexer, guess_lexer_for_filename
    from pygments.util import ClassNotFound

    try:
        lexer = guess_lexer_for_filename(Path(filename).name, text)
    except ClassNotFound:
        lexer = TextLexer()
    return pyg(text, lexer, HtmlFormatter(cssclass="hl", linenos="table"))


def markdown_html(text: str) -> str:
    """Markdown rendered, then sanitised by nh3: no scripts, no handlers, safe links only."""
    import markdown
    import nh3

    html = markdown.markdown(text, extensions=["fenced_code", "tables"])
    return nh3.clean(html, url_schemes={"http", "https", "mailto"})
