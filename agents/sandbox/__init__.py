"""The sandbox agents work in: a confined workspace folder, shell commands, and file tools.

Pure Python on purpose (no Django, nothing else from the project), so the runtime can
hand it everything through parameters and it can be tested on its own.
"""

from __future__ import annotations

from agents.sandbox.bash import (
    CommandResult,
    describe_isolation,
    isolation_available,
    run_command,
)
from agents.sandbox.limits import DEFAULT_LIMITS, Limits, cleanup_stale_cgroups
from agents.sandbox.tools import (
    HARNESS_TOOLS,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    WORKSPACE_TOOLS,
    ToolResult,
    execute,
    validate_input,
)
from agents.sandbox.workspace import PathEscape, ToolInputError, Workspace

__all__ = [
    "DEFAULT_LIMITS",
    "HARNESS_TOOLS",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "WORKSPACE_TOOLS",
    "CommandResult",
    "Limits",
    "PathEscape",
    "ToolInputError",
    "ToolResult",
    "Workspace",
    "cleanup_stale_cgroups",
    "describe_isolation",
    "execute",
    "isolation_available",
    "run_command",
    "validate_input",
]
