"""`parse`: a command line read into a `Script`, and the cache of recent readings."""

from __future__ import annotations

import functools
from pathlib import Path

from agents.shell.script import Script
from agents.shell.state import _parser, _State
from agents.shell.statements import _substitution, _walk_statements
from agents.shell.words import _numeric_variables


def parse(command: str, *, workspace: Path | str | None = None) -> Script:
    """Read a shell command as the shell will; the rules are the package's docstring."""
    where = str(workspace) if workspace is not None else None
    if len(command) > CACHED_LENGTH:
        return _parse(command, where)
    return _cached_parse(command, where)


def _parse(command: str, workspace: str | None) -> Script:
    where = Path(workspace) if workspace is not None else None
    state = _State(where, command.encode(), _substitution)
    tree = _parser().parse(state.source)
    root = tree.root_node
    state.numeric = _numeric_variables(root, state)
    _walk_statements(root, state)
    statements = [c for c in root.named_children if c.type != "comment"]
    single = (
        len(statements) == 1
        and statements[0].type == "command"
        and len(state.commands) == 1
        and not state.redirects
        and not state.operators
        and not state.opaque
        and not state.commands[0].context
    )
    return Script(
        source=command,
        workspace=state.workspace,
        commands=tuple(state.commands),
        operators=tuple(dict.fromkeys(state.operators)),
        redirects=tuple(state.redirects),
        opaque=tuple(state.opaque),
        single=single,
    )


# The same command is read by the policy, then by approvals, checkpoints …: keep recent ones.
# (Paths are resolved on the file system only when asked, so a cached Script stays true.)
CACHED_LENGTH = 4096
_cached_parse = functools.lru_cache(maxsize=1024)(_parse)
