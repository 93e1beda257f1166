"""An approval's card: the one renderer of `approvals/inbox.html#approval-card`, used by the
inbox, the run page's event rows, the decision form's swap and both sockets' pushes, and what the
card shows of the call (a diff: the command for bash, the change for the file tools)."""

from __future__ import annotations

import difflib
import json

from django.template.loader import render_to_string

from agents import approvals
from agents.models import Approval
from dashboard.markup import diff_lines


def render(
    approval: Approval,
    *,
    can_decide: bool,
    show_run: bool = False,
    oob: bool = False,
    new: bool = False,
    error: str = "",
    request=None,
) -> str:
    """The card as HTML. `oob` swaps it in place by id; `new` prepends it to an open inbox."""
    context = {
        "approval": approval,
        "can_decide": can_decide,
        "show_run": show_run,
        "oob": oob and not new,
        "error": error,
    }
    name = "new-card-oob" if new else "approval-card"
    return render_to_string(f"approvals/inbox.html#{name}", context, request=request)


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


def _unified(a: str, b: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            a.splitlines(keepends=True), b.splitlines(keepends=True), before, after
        )
    )


def call_diff(approval: Approval) -> str:
    """What the call would do, as a diff: the command for bash, the edit for the file tools;
    for a call a person edited, what was asked against what ran."""
    if approval.edited_input is not None:
        return approvals.input_diff(approval.tool_name, approval.tool_input, approval.edited_input)
    args = approval.tool_input or {}
    if approval.tool_name == "bash":
        return f"+ $ {args.get('command', '')}"
    if approval.tool_name == "network":
        return f"+ connect to {args.get('host', '')}:{args.get('port', '')}"
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


def call_diff_lines(approval: Approval) -> list[tuple[str, str]]:
    return diff_lines(call_diff(approval))


def edit_value(approval: Approval) -> str:
    """What the edit box starts with: the call's input as JSON, the one format an edit takes
    (agents.approvals.parse_edit) in the web, the CLI and the API alike."""
    return json.dumps(approval.tool_input, indent=2, ensure_ascii=False)
