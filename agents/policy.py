"""Tool policy: which tool calls an agent may make alone, which wait for a person, which never run.

A policy is an ordered list of rules, `{"tool": "bash", "pattern": "^git push", "action": "ask"}`;
the first rule whose tool (or "*") and pattern match decides. The pattern is a regular expression
searched in the command for bash and in the path for the file tools. When no rule matches, a
built-in risk classifier decides for bash (risky commands ask) and everything else is allowed.
The run's rules come first, then the global default from settings.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from agents.sandbox.workspace import ToolInputError

ACTIONS = ("allow", "ask", "deny")
PATH_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "save_artifact"})


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Decision:
    action: str  # allow | ask | deny
    reason: str
    rule: dict[str, Any] | None = None


# Each: (name, regex on the command). Kept readable rather than clever: a person reading an
# approval request sees the name of what matched.
RISKS: list[tuple[str, re.Pattern[str]]] = [
    (
        "reaches the network",
        re.compile(
            r"\b(curl|wget|ssh|scp|sftp|rsync|nc|ncat|telnet|ftp)\b"
            r"|\b(pip3?|uv|poetry|npm|pnpm|yarn|gem|cargo|go|apt|apt-get|brew)\s+(install|add|get|download|publish|update|upgrade)\b"
            r"|\bgit\s+(push|pull|fetch|clone)\b"
            r"|\bpython3?\s+-m\s+pip\s+install\b"
        ),
    ),
    (
        "deletes widely",
        re.compile(
            r"\brm\s+(-[a-zA-Z]*[rRf][a-zA-Z]*\s+|--recursive\s+|--force\s+)|\bfind\b.*\s-delete\b|\bshred\b"
        ),
    ),
    (
        "changes permissions or the system",
        re.compile(
            r"\bsudo\b|\bsu\s|\bchmod\s+(-[a-zA-Z]*R|--recursive)|\bchown\b|\bchgrp\b"
            r"|\b(mount|umount|systemctl|service|useradd|usermod|passwd|crontab|iptables|mkfs|dd)\b"
        ),
    ),
    (
        "writes outside the workspace",
        re.compile(
            r"(>>?|\btee\s+(-a\s+)?)\s*(/(?!dev/null\b)|~|\.\./)|\b(cp|mv|ln)\b[^;&|]*\s(/|~|\.\./)\S*\s*$"
        ),
    ),
]


def classify_bash(command: str) -> list[str]:
    """Names of the risks a shell command shows; empty when it looks contained."""
    return [name for name, pattern in RISKS if pattern.search(command)]


def validate(rules: Any) -> list[dict[str, Any]]:
    if not isinstance(rules, list):
        raise PolicyError("a tool policy is a list of rules")
    cleaned = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            raise PolicyError(
                f"rule {i + 1} must be an object with tool, action and optional pattern"
            )
        unknown = set(rule) - {"tool", "pattern", "action", "note"}
        if unknown:
            raise PolicyError(f"rule {i + 1} has unknown keys: {', '.join(sorted(unknown))}")
        tool, action = rule.get("tool"), rule.get("action")
        if not isinstance(tool, str) or not tool:
            raise PolicyError(f'rule {i + 1} needs a tool name (or "*")')
        if action not in ACTIONS:
            raise PolicyError(
                f"rule {i + 1}: action must be one of {', '.join(ACTIONS)}, not {action!r}"
            )
        pattern = rule.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise PolicyError(f"rule {i + 1}: pattern must be a string")
            try:
                re.compile(pattern)
            except re.error as e:
                raise PolicyError(
                    f"rule {i + 1}: pattern {pattern!r} is not a valid regular expression: {e}"
                ) from None
        cleaned.append({k: v for k, v in rule.items() if v is not None})
    return cleaned


def subject(tool: str, tool_input: dict[str, Any]) -> str:
    """The text a rule's pattern is matched against."""
    if tool == "bash":
        return str(tool_input.get("command", ""))
    if tool in PATH_TOOLS:
        return str(tool_input.get("path", ""))
    return ""


def decide(rules: list[dict[str, Any]], tool: str, tool_input: dict[str, Any]) -> Decision:
    text = subject(tool, tool_input)
    for rule in rules:
        if rule["tool"] not in (tool, "*"):
            continue
        pattern = rule.get("pattern")
        if pattern is not None and not re.search(pattern, text):
            continue
        label = (
            f"rule {rule['tool']}" + (f" /{pattern}/" if pattern else "") + f" → {rule['action']}"
        )
        return Decision(rule["action"], label, rule)
    if tool == "bash":
        risks = classify_bash(text)
        if risks:
            return Decision("ask", "risky command: " + ", ".join(risks))
    return Decision("allow", "no rule matched")


# What may follow an allowed-similar command: plain arguments only. No shell operators (a
# second command, a pipe, a substitution, a redirection), and no argument that starts outside
# the workspace (/..., ~...) or climbs out of it (..).
_PLAIN_ARGS = r"(?!.*(?:\s|/)\.\.(?:/|\s|$))(?!.*\s[/~])(?:\s+[^;&|`$()<>\n\\]*)?\s*$"
_SHELL_OPERATORS = re.compile(r"[;&|`$()<>\n\\]")


def similar_rule(tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """An allow rule for calls like this one.

    bash: the same program, subcommand and leading flags (`rm -rf`, `pip install`) with any
    plain arguments inside the workspace; a command with shell operators is allowed again only
    exactly as it was (`python3 x && rm -rf /` is not "similar" to `python3 x`). File tools: the
    same folder.
    """
    if tool == "bash":
        command = str(tool_input.get("command", "")).strip()
        try:
            words = shlex.split(command)
        except ValueError:
            words = []
        if not words or _SHELL_OPERATORS.search(command):
            return {"tool": "bash", "pattern": rf"^\s*{re.escape(command)}\s*$", "action": "allow"}
        head = words[:1]
        rest = words[1:]
        if rest and not rest[0].startswith("-"):
            head.append(rest.pop(0))  # the subcommand: pip install, git commit
        while rest and rest[0].startswith("-"):
            head.append(rest.pop(0))
        pattern = r"^\s*" + r"\s+".join(re.escape(w) for w in head) + _PLAIN_ARGS
        return {"tool": "bash", "pattern": pattern, "action": "allow"}
    if tool in PATH_TOOLS:
        path = str(tool_input.get("path", ""))
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        pattern = "^" + re.escape(folder) if folder else r"^[^/]*$"
        return {"tool": tool, "pattern": pattern, "action": "allow"}
    return {"tool": tool, "action": "allow"}


# --- protected files ------------------------------------------------------------------------
# `run.protected` maps each protected file to {hash, size, mode} and each protected folder, keyed
# "path/", to the same plus "folder": true (agents/verification.py keeps and checks them). A file
# tool that would write one is decided here, before any rule: the checks depend on them.
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
) -> Decision:
    """The decision on one of a run's tool calls: protected files first, then the rules (and
    the risk classifier). `workspace` (an agents.sandbox.Workspace) resolves the path a file
    tool would write."""
    if tool in WRITING_TOOLS and protected and workspace is not None:
        try:
            rel = str(workspace.resolve(tool_input["path"]).relative_to(workspace.path))
        except (ToolInputError, ValueError, KeyError, OSError):
            rel = None
        if rel is not None and is_protected(protected, rel):
            return Decision(
                protected_action, f"{rel} is protected: the done-conditions depend on it"
            )
    return decide(rules, tool, tool_input)
