"""Other agents' tools as Shiftlog's policy knows them (agents/policy.py reads them through
here): Claude Code, the Agent SDK or a loop of its own name their tools their own way; each is
read as the tool of ours it acts like before any rule is made or matched, so a rule, an
allow-similar rule and the classifier mean the same for `Bash` as for `bash`."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PATH_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "save_artifact"})
SHELL_ALIASES = frozenset({"bash", "shell", "run_command", "execute_command", "terminal"})
WRITE_ALIASES = frozenset({"write", "write_file", "create_file"})
EDIT_ALIASES = frozenset(
    {"edit", "edit_file", "multiedit", "multi_edit", "notebookedit", "str_replace_based_edit_tool"}
)
READ_ALIASES = frozenset({"read", "read_file", "notebookread", "view"})
LIST_ALIASES = frozenset({"glob", "grep", "ls", "list_files"})
FETCH_ALIASES = frozenset({"webfetch", "web_fetch", "fetch"})
SEARCH_ALIASES = frozenset({"websearch", "web_search"})
AGENT_ALIASES = frozenset({"agent", "task", "spawn_agent"})
# Tools that only touch the agent's own bookkeeping: allowed unless a rule says otherwise.
HARMLESS_TOOLS = frozenset(
    {"todowrite", "todoread", "toolsearch", "bashoutput", "killshell", "killbash"}
    | {"exitplanmode", "skill", "listmcpresourcestool", "readmcpresourcetool"}
)
AGENT_TOOL = "agent"  # a sub-agent: logged and asked
NETWORK_TOOL = "network"  # a connection a command makes (agents/policy.py, network rules)
WEB_SEARCH_HOST = "web-search"  # WebSearch, under the network policy as this host
_ALIASES = (
    (SHELL_ALIASES, "bash"),
    (WRITE_ALIASES, "write_file"),
    (EDIT_ALIASES, "edit_file"),
    (READ_ALIASES, "read_file"),
    (LIST_ALIASES, "list_files"),
    (FETCH_ALIASES | SEARCH_ALIASES, "network"),
    (AGENT_ALIASES, AGENT_TOOL),
)


def canonical_name(tool: str) -> str:
    """The name of ours a tool name means ("Bash" → bash, "Write" → write_file); any other
    name as it is."""
    low = str(tool).lower()
    if low in ("network", "*"):
        return low
    for names, ours in _ALIASES:
        if low in names:
            return ours
    return tool


@dataclass(frozen=True)
class AgentCall:
    """An external agent's call as the policy reads it: the tool of ours it acts like, its
    input in our shape, and whether we know what it does (an unknown tool asks)."""

    tool: str
    input: dict[str, Any]
    known: bool = True
    why: str = ""  # an unknown or unreadable call: why it asks


def _under_root(path: str, root: str | None) -> str:
    """A path an agent gave, placed against the workspace: an absolute path under the agent's
    declared root becomes the relative path inside; any other absolute path stays as it is
    (outside the workspace)."""
    if not root or not path.startswith("/"):
        return path
    normal = posixpath.normpath(path)
    if normal == root:
        return "."
    if normal.startswith(root.rstrip("/") + "/"):
        return normal[len(root.rstrip("/")) + 1 :]
    return normal


def agent_call(tool: str, tool_input: dict[str, Any], *, root: str | None = None) -> AgentCall:
    """Read an external agent's call as ours (see the aliases above). `root` is the folder the
    agent works in, as the agent sees it: absolute paths under it are paths in the workspace."""
    name = canonical_name(tool)
    low = str(tool).lower()
    if name == "bash":
        command = tool_input.get("command")
        if isinstance(command, str):
            return AgentCall("bash", {"command": command})
        return AgentCall("bash", {"command": ""}, False, f"{tool} without a command")
    if name in ("write_file", "edit_file", "read_file", "list_files"):
        path = next(
            (
                tool_input[k]
                for k in ("file_path", "path", "notebook_path")
                if isinstance(tool_input.get(k), str)
            ),
            None,
        )
        if path is None and name == "list_files":
            path = "."
        if not isinstance(path, str) or not path:
            return AgentCall(name, {"path": ""}, False, f"{tool} without a path")
        return AgentCall(name, {"path": _under_root(path, root)})
    if name == NETWORK_TOOL:
        if low in SEARCH_ALIASES:
            return AgentCall(NETWORK_TOOL, {"host": WEB_SEARCH_HOST, "port": 443})
        url = tool_input.get("url")
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            host, port = (parts.hostname, parts.port) if parts else (None, None)
        except ValueError:
            host = port = None
        if not host:
            return AgentCall(NETWORK_TOOL, {"host": "", "port": ""}, False, f"{tool} without a URL")
        port = port or (80 if parts.scheme == "http" else 443)
        return AgentCall(NETWORK_TOOL, {"host": host.lower(), "port": port})
    if name == AGENT_TOOL:
        return AgentCall(AGENT_TOOL, dict(tool_input), False, "it starts a sub-agent")
    if low in HARMLESS_TOOLS:
        return AgentCall(tool, dict(tool_input))
    return AgentCall(tool, dict(tool_input), False, f"{tool} is a tool Shiftlog does not know")


def outside(call: AgentCall) -> bool:
    """A file tool's path that is outside the workspace (absolute, or leading out of it)."""
    if call.tool not in PATH_TOOLS:
        return False
    path = posixpath.normpath(str(call.input.get("path", "")) or ".")
    return path.startswith("/") or path == ".." or path.startswith("../")
