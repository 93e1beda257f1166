"""Tool policy: which tool calls an agent may make alone, which wait for a person, which never run.

A policy is an ordered list of rules; the first rule whose tool (or "*") matches and whose
condition holds decides. Two shapes:

- a pattern rule, `{"tool": "bash", "pattern": "^git push", "action": "ask"}`: the pattern is a
  regular expression searched in the command for bash and in the path for the file tools (no
  pattern: every call of the tool). An ask or deny pattern is also searched in each command as it
  will run (`r""m -rf x` reads `rm -rf x`), so quoting does not slip past it. An allow pattern
  does not allow a bash command that cannot be read plainly (`shell.parse(...).opaque`).
- an "allow similar" rule, `{"tool": "bash", "program": "rm", "flags": ["-f", "-r"],
  "paths": "workspace", "action": "allow", "note": "..."}` (optionally `"args": ["clean"]`, the
  leading arguments that must be the same; `"paths": "none"`: nothing more): it allows a command
  that is only that one program, with exactly those flags, every other argument a path inside
  the workspace, nothing joined to it, no redirection, substitution or variable. `describe_rule`
  says it in words; `similar_rule` makes one from an approved call.

When no rule matches, the risk classifier decides for bash (a risky command asks) and everything
else is allowed. The classifier reads the parsed command (agents.shell), never its text. The
run's rules come first, then the global default from settings.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import patterns, schemas, shell
from agents.agent_tools import (
    NETWORK_TOOL,
    PATH_TOOLS,
    AgentCall,
    agent_call,
    canonical_name,
    outside,
)

# The risk classifier's names, read here and by callers as policy's.
from agents.classifier import (  # noqa: F401
    DELETES,
    NETWORK,
    NETWORK_PROGRAMS,
    NEUTRAL_WRAPPERS,
    OPAQUE,
    PACKAGE_MANAGERS,
    RISKS,
    SYSTEM,
    WRITES,
    WRITES_BUT_FIRST,
    _command_risks,
    _written,
    classify,
    classify_bash,
)

ACTIONS = ("allow", "ask", "deny")


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Decision:
    action: str  # allow | ask | deny
    reason: str
    rule: dict[str, Any] | None = None


# --- rules ------------------------------------------------------------------------------------
_RULE_KEYS = frozenset({"tool", "pattern", "action", "note", "program", "args", "flags", "paths"})
PATHS = ("workspace", "none")


def validate(rules: Any) -> list[dict[str, Any]]:
    if not isinstance(rules, list):
        raise PolicyError("a tool policy is a list of rules")
    cleaned = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            raise PolicyError(
                f"rule {i + 1} must be an object with tool, action and optional pattern"
            )
        unknown = set(rule) - _RULE_KEYS
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
                # An allow-similar rule of an earlier version is read as one, never searched.
                if _as_similar({**rule, "tool": tool, "action": action}) is None:
                    patterns.compile_pattern(pattern)
            except patterns.PatternError as e:
                raise PolicyError(
                    f"rule {i + 1}: pattern {pattern[:200]!r} is not a valid regular "
                    f"expression: {e}"
                ) from None
        if rule.get("note") is not None and not isinstance(rule["note"], str):
            raise PolicyError(f"rule {i + 1}: note must be a string")
        # Another agent's name for one of our tools ("Bash") is stored as ours ("bash").
        rule = {k: v for k, v in rule.items() if v is not None} | {"tool": canonical_name(tool)}
        if set(rule) & {"program", "args", "flags", "paths"}:
            rule = _validate_similar(i + 1, rule)
        cleaned.append(rule)
    # The published contract (agents/schemas/policy.schema.json) has the last word: the checks
    # above word the common mistakes; the schema also bounds counts and lengths.
    problem = schemas.first_problem("policy", cleaned)
    if problem is not None:
        path = list(problem.absolute_path)
        if not path:  # the list as a whole
            raise PolicyError(f"a tool policy: {schemas.describe(problem, whole='it')}")
        raise PolicyError(f"rule {path[0] + 1}: {schemas.describe(problem, skip=1, whole='it')}")
    return cleaned


def check_length(rules: list[dict[str, Any]]) -> None:
    """The published bound on a policy's length, for a policy grown one rule at a time (its
    rules each validated already)."""
    most = schemas.schema("policy")["maxItems"]
    if len(rules) > most:
        raise PolicyError(
            f"the run's tool policy is full (at most {most} rules): this rule was not added"
        )


def _validate_similar(n: int, rule: dict[str, Any]) -> dict[str, Any]:
    program = rule.get("program")
    if not isinstance(program, str) or not re.fullmatch(r"[^\s/\0]+", program):
        raise PolicyError(f"rule {n}: an allow-similar rule needs a program name (no folder)")
    if rule["tool"] != "bash" or "pattern" in rule:
        raise PolicyError(f"rule {n}: an allow-similar rule is for bash and has no pattern")
    if rule["action"] != "allow":
        raise PolicyError(f"rule {n}: an allow-similar rule can only allow")
    flags, args = rule.get("flags", []), rule.get("args", [])
    if not isinstance(flags, list) or not all(
        isinstance(f, str) and f.startswith("-") for f in flags
    ):
        raise PolicyError(f"rule {n}: flags must be a list of flags, each starting with -")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise PolicyError(f"rule {n}: args must be a list of strings")
    if rule.get("paths", "workspace") not in PATHS:
        raise PolicyError(f"rule {n}: paths must be one of {', '.join(PATHS)}")
    cleaned = {**rule, "flags": sorted(set(flags)), "paths": rule.get("paths", "workspace")}
    if not args:
        cleaned.pop("args", None)
    return cleaned


def decide_agent(
    rules: list[dict[str, Any]],
    call: AgentCall,
    *,
    root: str | None = None,
    workspace: Path | str | None = None,
) -> Decision:
    """The decision on an external agent's call: the rules, then the classifier for bash (with
    the agent's root as its workspace), then: a file outside the workspace asks, a connection
    new to the run asks, a sub-agent or an unknown tool asks; anything else is allowed."""
    decision = decide(rules, call.tool, call.input, workspace=root or workspace)
    if decision.rule is not None or decision.action != "allow":
        return decision
    if call.tool == NETWORK_TOOL:
        target = network_target(str(call.input.get("host", "")), call.input.get("port", ""))
        return Decision("ask", f"a connection to {target} is new to this run")
    if outside(call):
        verb = "reads" if call.tool in ("read_file", "list_files") else "writes"
        return Decision("ask", f"{verb} outside the workspace ({call.input['path']})")
    if not call.known:
        return Decision("ask", f"no rule matched and {call.why}")
    return decision


def subject(tool: str, tool_input: dict[str, Any]) -> str:
    """The text a rule's pattern is matched against."""
    if tool == "bash":
        return str(tool_input.get("command", ""))
    if tool == NETWORK_TOOL:
        return network_target(str(tool_input.get("host", "")), tool_input.get("port", ""))
    if tool in PATH_TOOLS:
        return str(tool_input.get("path", ""))
    return ""


def decide(
    rules: list[dict[str, Any]],
    tool: str,
    tool_input: dict[str, Any],
    *,
    workspace: Path | str | None = None,
    sandboxed: bool = False,
) -> Decision:
    """The first matching rule's action, else the classifier's for bash, else allow.

    `workspace` is the run's workspace folder: absolute paths inside it count as inside, and
    symbolic links in it are followed. Without it, every absolute path counts as outside.
    `sandboxed`: the command runs in bubblewrap (only the workspace writable, no network but
    through the run's proxy, which asks about each new host; the workspace rewindable), where
    code the classifier cannot read (`python -c`, `node -e`, `sh -c`) is no more a reason to
    ask than `python script.py`; what it can read as risky (deletes, writes outside the
    workspace, the network, the system) still asks."""
    if canonical_name(tool) != tool:  # another agent's name for one of our tools
        call = agent_call(tool, tool_input)
        tool, tool_input = call.tool, call.input
    text = subject(tool, tool_input)
    script = shell.parse(text, workspace=workspace) if tool == "bash" else None
    for rule in rules:
        if canonical_name(rule["tool"]) not in (tool, "*"):
            continue
        similar = _as_similar(rule)
        if similar is not None:
            if script is not None and matches_similar(similar, script):
                return Decision(rule["action"], _label(similar), rule)
            continue
        pattern = rule.get("pattern")
        if pattern is not None:
            if not _pattern_matches(pattern, rule["action"], text, script):
                continue
            if rule["action"] == "allow" and script is not None and not _vouches(pattern, script):
                continue
        return Decision(rule["action"], _label(rule), rule)
    if script is not None:
        risks = classify(script)
        readable = [r for r in risks if not r.startswith(OPAQUE)] if sandboxed else risks
        if readable:
            return Decision("ask", "risky command: " + ", ".join(readable))
        if risks:
            return Decision("allow", f"runs in the sandbox, though it {risks[0]}")
    return Decision("allow", "no rule matched")


def _label(rule: dict[str, Any]) -> str:
    if "program" in rule:
        words = " ".join([rule["program"], *rule.get("args", [])])
        flags = " ".join(rule["flags"]) or "no flags"
        where = "paths in the workspace" if rule["paths"] == "workspace" else "nothing more"
        return f"rule bash `{words}` {flags}, {where} → {rule['action']}"
    pattern = rule.get("pattern")
    return f"rule {rule['tool']}" + (f" /{pattern}/" if pattern else "") + f" → {rule['action']}"


def _pattern_matches(pattern: str, action: str, text: str, script: shell.Script | None) -> bool:
    """RE2 (agents/patterns.py): no pattern hangs a worker; one it cannot read errs towards a
    person (an allow never matches, a deny or ask always does)."""
    unreadable = action != "allow"
    if patterns.search_or(pattern, text, unreadable=unreadable):
        return True
    if action == "allow" or script is None:
        return False
    return any(
        patterns.search_or(pattern, c.canonical(), unreadable=unreadable) for c in script.commands
    )


def _vouches(pattern: str, script: shell.Script) -> bool:
    """An allow pattern that matched vouches for the commands it matches, not for what hides
    behind them: nothing may be unreadable, and every other risky command or redirection still
    asks (`^make` does not allow `make $(curl x)` nor `make; rm -rf ~`). A rule allowing one exact
    command vouches for all of it, as long as it can be read plainly."""
    if any(r.startswith(OPAQUE) for r in classify(script)):
        return False
    if _exact_command(pattern) is not None:
        return True
    for command in script.commands:
        if _command_risks(command, script) and not (
            patterns.search_or(pattern, command.source, unreadable=False)
            or patterns.search_or(pattern, command.canonical(), unreadable=False)
        ):
            return False
    return not any(
        redirect.writes and _written(script, redirect.target, redirect.cwd, "a redirection", True)
        for redirect in script.redirects
    )


def matches_similar(rule: dict[str, Any], script: shell.Script) -> bool:
    """The parsed command is what the allow-similar rule allows (see the module docstring)."""
    if not script.single:
        return False
    command = script.commands[0]
    if command.program != rule["program"] or command.cwd is None or command.assigns:
        return False
    if any(w not in NEUTRAL_WRAPPERS for w in command.wrappers):
        return False
    if any(w.value is None for w in command.args):
        return False
    opts = command.options()
    if sorted(opts.flags) != rule["flags"]:
        return False
    fixed = rule.get("args", [])
    if [w.value for w in opts.operands[: len(fixed)]] != fixed:
        return False
    rest = opts.operands[len(fixed) :]
    if rule["paths"] == "none":
        return not rest
    if command.family == "git" and any((w.value or "").startswith(":") for w in rest):
        return False  # pathspec magic (`:/`, `:(top)`) starts at the repository's root
    return all(_path_inside(script, w, command.cwd) for w in rest)


_URL = re.compile(r"[A-Za-z][\w+.-]*://|[\w.-]+@[\w.-]+:")


def _path_inside(script: shell.Script, word: shell.Word, cwd: Any) -> bool:
    """A word used as a path lands inside the workspace; `key=value` also by its value, and a
    URL never counts as a path inside."""
    for value, glob in word.readings():
        if _URL.match(value):
            return False
        candidates = [value]
        if "=" in value:
            candidates.append(value.split("=", 1)[1])
        if any(script.place(v, cwd, glob=glob) is None for v in candidates):
            return False
    return bool(word.values) and not word.unknown


# Programs whose first argument is a subcommand (`git clean`, `pip install`), and the
# subcommands that take one more (`git remote add`, `uv pip install`).
SUBCOMMAND_PROGRAMS = PACKAGE_MANAGERS | frozenset(
    {"git", "docker", "podman", "kubectl", "systemctl", "npx", "make", "cargo", "dotnet"}
)
NESTED_SUBCOMMANDS = frozenset(
    {"remote", "stash", "submodule", "worktree", "config", "notes", "bisect", "lfs", "pip"}
    | {"mod", "work", "tool", "python", "compose", "container", "image", "network", "volume"}
)


def similar_rule(
    tool: str, tool_input: dict[str, Any], *, root: str | None = None
) -> dict[str, Any]:
    """An allow rule for calls like this one, with its `note` saying what it allows in words.

    bash: a command that is one plain simple command gets an allow-similar rule: the same
    program, the same leading subcommand (`git clean`, `pip install`) or mode (`chmod u+w`),
    exactly the same flags, and any other arguments paths inside the workspace — or none at all
    for programs that reach the network, whose arguments are where they go. Anything else
    (several commands, a redirection, a substitution, a variable, sudo) is allowed again only
    exactly as it was: `python3 x && rm -rf /` is not "similar" to `python3 x`; and while it
    cannot be read plainly not even that (see `decide`). File tools: the same folder.

    Another agent's tool ("Bash", "Write" with an absolute path under its `root`) is read as
    ours first, so the rule is exactly as narrow as for ours.
    """
    if canonical_name(tool) != tool or root:
        call = agent_call(tool, tool_input, root=root)
        if call.tool != tool:
            return similar_rule(call.tool, call.input)
    if tool == "bash":
        command = str(tool_input.get("command", "")).strip()
        rule = _similar_bash(command)
        unread = [r for r in classify_bash(command) if r.startswith(OPAQUE)]
        if "program" not in rule and unread:
            note = (
                f"bash: exactly `{command}` again — but it {unread[0]}, so it will still ask "
                "every time"
            )
            return {**rule, "note": note}
        return {**rule, "note": describe_rule(rule)}
    if tool in PATH_TOOLS:
        path = str(tool_input.get("path", ""))
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        pattern = "^" + re.escape(folder) if folder else r"^[^/]*$"
        rule = {"tool": tool, "pattern": pattern, "action": "allow"}
        return {**rule, "note": describe_rule(rule)}
    if tool == NETWORK_TOOL:  # the same host and port, for the rest of the run
        return network_rule(str(tool_input.get("host", "")), tool_input.get("port"), "allow")
    rule = {"tool": tool, "action": "allow"}
    return {**rule, "note": describe_rule(rule)}


def _similar_bash(command: str) -> dict[str, Any]:
    script = shell.parse(command)
    exact = {"tool": "bash", "pattern": rf"^\s*{re.escape(command)}\s*$", "action": "allow"}
    if not script.single:
        return exact
    cmd = script.commands[0]
    if any(w.value is None for w in cmd.args) or cmd.cwd != shell.ROOT or cmd.assigns:
        return exact
    if any(w not in NEUTRAL_WRAPPERS for w in cmd.wrappers) or not cmd.program:
        return exact
    opts = cmd.options()
    operands = [w.value or "" for w in opts.operands]
    fam = cmd.family
    if cmd.program in NETWORK_PROGRAMS:
        fixed, paths = operands, "none"
    elif fam in SUBCOMMAND_PROGRAMS or cmd.program in WRITES_BUT_FIRST:
        fixed = operands[:1]
        if fam in SUBCOMMAND_PROGRAMS and fixed and fixed[0] in NESTED_SUBCOMMANDS:
            fixed = operands[:2]
        paths = "workspace"
    else:
        fixed, paths = [], "workspace"
    rule: dict[str, Any] = {"tool": "bash", "program": cmd.program}
    if fixed:
        rule["args"] = fixed
    rule |= {"flags": sorted(opts.flags), "paths": paths, "action": "allow"}
    return rule


def describe_rule(rule: dict[str, Any]) -> str:
    """A rule in words: exactly what it lets through, asks about or refuses."""
    similar = _as_similar(rule)
    tool = rule["tool"]
    if similar is not None:
        words = " ".join([similar["program"], *similar.get("args", [])])
        flags = similar["flags"]
        with_flags = f"exactly the flags {' '.join(flags)}" if flags else "no flags"
        where = (
            "any other argument a path inside the workspace (a plain name is one; a URL, ~ or "
            "a path leading out is not)"
            if similar["paths"] == "workspace"
            else "and no other arguments"
        )
        older = "older allow-similar rule, read as: " if "pattern" in rule else ""
        return (
            f"bash: {older}runs `{words}` with {with_flags}, {where}; "
            "nothing else chained, no redirection, substitution or variable, no sudo"
        )
    pattern = rule.get("pattern")
    verb = {"allow": "allowed", "ask": "asks a person", "deny": "refused"}[rule["action"]]
    who = "every tool" if tool == "*" else tool
    if pattern is None:
        return f"{who}: every call {verb}"
    exact = _exact_command(pattern) if tool == "bash" else None
    if exact is not None:
        return (
            f"bash: exactly `{exact}` again, character for character, {verb} "
            "(only while it can be read plainly)"
            if rule["action"] == "allow"
            else f"bash: exactly `{exact}` {verb}"
        )
    what = {"bash": "command"}.get(tool, "path" if tool in PATH_TOOLS else "input")
    return f"{who}: {verb} when the {what} matches /{pattern}/"


def _exact_command(pattern: str) -> str | None:
    m = re.fullmatch(r"\^\\s\*(.*)\\s\*\$", pattern, flags=re.S)
    if m is None:
        return None
    body = m.group(1)
    text = re.sub(r"\\(.)", r"\1", body, flags=re.S)
    return text if re.escape(text) == body else None


# What the allow-similar rules of earlier versions put after the program and its leading words.
# Rules like that, still stored in runs, are read as allow-similar rules of the shape above: the
# text check they made let quoting and `--` through.
_LEGACY_PLAIN_ARGS = r"(?!.*(?:\s|/)\.\.(?:/|\s|$))(?!.*\s[/~])(?:\s+[^;&|`$()<>\n\\]*)?\s*$"


def _as_similar(rule: dict[str, Any]) -> dict[str, Any] | None:
    if "program" in rule:
        return rule
    pattern = rule.get("pattern")
    if rule["tool"] != "bash" or rule["action"] != "allow" or not isinstance(pattern, str):
        return None
    return _legacy_similar(pattern)


@functools.lru_cache(maxsize=256)
def _legacy_similar(pattern: str) -> dict[str, Any] | None:
    if not (pattern.startswith(r"^\s*") and pattern.endswith(_LEGACY_PLAIN_ARGS)):
        return None
    head = pattern[len(r"^\s*") : -len(_LEGACY_PLAIN_ARGS)]
    words = [re.sub(r"\\(.)", r"\1", w) for w in head.split(r"\s+")]
    if not words or not words[0]:
        return None
    program, rest = words[0], words[1:]
    fixed = [w for w in rest if not w.startswith("-")]
    flags = [w for w in rest if w.startswith("-")]
    opts = shell.split_options(shell.family(program), [shell.Word(f, (f,)) for f in flags])
    rule: dict[str, Any] = {"tool": "bash", "program": program}
    if fixed:
        rule["args"] = fixed
    return rule | {"flags": sorted(opts.flags), "paths": "workspace", "action": "allow"}


# --- network ----------------------------------------------------------------------------------
# A run's commands reach the network only through the egress proxy the harness runs for it
# (agents/sandbox/egress.py), which asks here about every connection: rules of tool "network"
# whose pattern is searched in "host:port" (`--allow-host` writes them), then a new host asks a
# person, like a risky tool call.
_HOST = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$"
)


def network_target(host: str, port: Any) -> str:
    return f"{host.strip().lower().rstrip('.')}:{port}"


def network_rule(host: str, port: Any, action: str) -> dict[str, Any]:
    """A rule for one host, on one port (or any, with port None)."""
    host = host.strip().lower().rstrip(".")
    port_pattern = r"\d+" if port in (None, "", "*") else re.escape(str(port))
    where = f"{host} on any port" if port in (None, "", "*") else f"{host}:{port}"
    verb = {"allow": "allowed", "ask": "asks a person", "deny": "refused"}[action]
    return {
        "tool": NETWORK_TOOL,
        "pattern": f"^{re.escape(host)}:{port_pattern}$",
        "action": action,
        "note": f"network: connections to {where} {verb}",
    }


def allow_host_rule(spec: str) -> dict[str, Any]:
    """The rule for `--allow-host HOST[:PORT]`; PolicyError when it is no host."""
    host, _, port = str(spec).strip().rpartition(":") if ":" in str(spec) else (spec, "", "")
    host = str(host).strip().lower()
    if not _HOST.match(host):
        raise PolicyError(f"allow-host: {spec!r} is not a host name (HOST or HOST:PORT)")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise PolicyError(f"allow-host: {port!r} is not a port (1-65535)")
    return network_rule(host, port or None, "allow")


def decide_network(rules: list[dict[str, Any]], host: str, port: int) -> Decision:
    """The decision on one connection a command tries to make: the first rule of tool
    "network" (or "*") that matches "host:port", else ask a person."""
    target = network_target(host, port)
    for rule in rules:
        if canonical_name(rule["tool"]) not in (NETWORK_TOOL, "*") or "program" in rule:
            continue
        pattern = rule.get("pattern")
        if pattern is None or patterns.search_or(
            pattern, target, unreadable=rule["action"] != "allow"
        ):
            return Decision(rule["action"], rule.get("note") or _label(rule), rule)
    return Decision("ask", f"a connection to {target} is new to this run")
