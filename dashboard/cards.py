"""An approval's card: the one renderer of `approvals/inbox.html#approval-card`, used by the
inbox, the run page's event rows, the decision form's swap and both sockets' pushes, and what the
card shows of the call (a diff: the command for bash, the change for the file tools)."""

from __future__ import annotations

import difflib
import json

from django.template.loader import render_to_string

from agents import access, approvals, config_changes, workspaces
from agents.models import Approval, ApprovalSubject
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
    user=None,
) -> str:
    """The card as HTML. `oob` swaps it in place by id; `new` prepends it to an open inbox.
    With `user` (and `show_run`), a fleet child's card names its fleet (`mark_fleets`)."""
    if user is not None and show_run:
        mark_fleets([approval], user)
    context = {
        "approval": approval,
        "can_decide": can_decide,
        "show_run": show_run,
        "oob": oob and not new,
        "error": error,
    }
    name = "new-card-oob" if new else "approval-card"
    return render_to_string(f"approvals/inbox.html#{name}", context, request=request)


def mark_fleets(approvals, user) -> None:
    """Each card of a fleet's child names the fleet: `approval.fleet_parent` is the parent run
    when `user` may see it (else None: the card says only that it is part of a fleet). Read the
    approvals with select_related("run__parent"): no query here."""
    for approval in approvals:
        parent = approval.run.parent if approval.run.parent_id else None
        approval.fleet_parent = parent if parent and access.can_see(user, parent) else None


def _workspace_file(run, rel: str, limit: int = 200_000) -> str | None:
    data = workspaces.read_live(run, rel, limit)
    return None if data is None else data.decode(errors="replace")


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
    if approval.subject == ApprovalSubject.CONFIG_CHANGE:
        return config_changes.card_diff(args)
    if approval.tool_name == "bash":
        return f"+ $ {args.get('command', '')}"
    if approval.subject == ApprovalSubject.NETWORK_HOST:
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
