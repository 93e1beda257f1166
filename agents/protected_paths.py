"""Protected paths: the files and folders the done-conditions depend on, which no tool call
may write (a file tool that would is denied, or asks, before any rule), and the one decision
on a run's tool call that puts them first.

`run.protected` maps each protected file to {hash, size, mode} and each protected folder, keyed
"path/", to the same plus "folder": true (agents/verification.py keeps and checks them); a path
that did not exist at creation is there with "absent": true, so creating it is a change too.
"""

from __future__ import annotations

from typing import Any

from agents.policy import Decision, decide
from agents.sandbox.workspace import ToolInputError


def is_folder(fingerprint: dict[str, Any]) -> bool:
    return bool(fingerprint.get("folder"))


def protected_prefix(folder: str) -> str:
    """What every path under a protected folder starts with ("" for the whole workspace)."""
    folder = folder.rstrip("/")
    return "" if folder in ("", ".") else folder + "/"


def is_protected(prints: dict[str, dict[str, Any]], rel_path: str) -> bool:
    """Whether a file tool writing `rel_path` would change what the checks depend on."""
    rel = rel_path.strip("/")
    while rel.startswith("./"):
        rel = rel[2:]
    if rel in prints:
        return True
    return any(
        is_folder(p) and (rel + "/").startswith(protected_prefix(key)) for key, p in prints.items()
    )


WRITING_TOOLS = frozenset({"write_file", "edit_file"})


def decide_call(
    rules: list[dict[str, Any]],
    tool: str,
    tool_input: dict[str, Any],
    *,
    workspace=None,
    protected: dict[str, dict[str, Any]] | None = None,
    protected_action: str = "deny",
    sandboxed: bool = False,
) -> Decision:
    """The decision on one of a run's tool calls: protected files first, then the rules (and
    the risk classifier). `workspace` (an agents.sandbox.Workspace) resolves the path a file
    tool would write; `sandboxed` as for `policy.decide`."""
    found = protected_decision(tool, tool_input, workspace, protected, protected_action)
    if found is not None:
        return found
    return decide(
        rules,
        tool,
        tool_input,
        workspace=workspace.path if workspace is not None else None,
        sandboxed=sandboxed,
    )


def protected_decision(
    tool: str,
    tool_input: dict[str, Any],
    workspace,
    protected: dict[str, dict[str, Any]] | None,
    protected_action: str = "deny",
) -> Decision | None:
    """The decision when a file tool would write a protected path, else None."""
    if tool in WRITING_TOOLS and protected and workspace is not None:
        try:
            rel = str(workspace.resolve(tool_input["path"]).relative_to(workspace.path))
        except (ToolInputError, ValueError, KeyError, OSError):
            rel = None
        if rel is not None and is_protected(protected, rel):
            return Decision(
                protected_action, f"{rel} is protected: the done-conditions depend on it"
            )
    return None
