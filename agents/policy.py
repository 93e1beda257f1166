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


def similar_rule(tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """An allow rule for calls like this one: same program and subcommand, or same folder."""
    if tool == "bash":
        try:
            words = shlex.split(str(tool_input.get("command", "")))
        except ValueError:
            words = str(tool_input.get("command", "")).split()
        head = words[:2] if len(words) > 1 and not words[1].startswith("-") else words[:1]
        pattern = r"^\s*" + r"\s+".join(re.escape(w) for w in head) + r"(\s|$)" if head else "^$"
        return {"tool": "bash", "pattern": pattern, "action": "allow"}
    if tool in PATH_TOOLS:
        path = str(tool_input.get("path", ""))
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        pattern = "^" + re.escape(folder) if folder else r"^[^/]*$"
        return {"tool": tool, "pattern": pattern, "action": "allow"}
    return {"tool": tool, "action": "allow"}
