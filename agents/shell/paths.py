"""Where a path value lands, relative to the workspace root, or None when outside it or
unknown (the rules are the package's docstring, Paths). `ROOT` and `HOME` are the two places the
other modules name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

ROOT = PurePosixPath(".")  # the workspace root, as paths relative to it are kept
HOME = "\0home"  # the value of ~ and $HOME: a home folder, never inside the workspace

_GLOB = re.compile(r"[*?\[]")


def _place(
    value: str, cwd: PurePosixPath | None, workspace: Path | None, *, glob: bool = True
) -> PurePosixPath | None:
    if value.startswith(HOME) or "\0" in value:
        return None
    if value.startswith("/"):
        if workspace is None:
            return None
        root = PurePosixPath(os.path.normpath(str(workspace)))
        parts = _normalise(PurePosixPath("/"), value, glob)
        if parts is None:
            return None
        absolute = PurePosixPath("/", *parts)
        if absolute != root and root not in absolute.parents:
            return None
        rel = absolute.relative_to(root)
    else:
        if cwd is None:
            return None
        parts = _normalise(cwd, value, glob)
        if parts is None:
            return None
        rel = PurePosixPath(*parts) if parts else PurePosixPath(".")
    if workspace is not None and not _stays_inside_on_disk(Path(workspace), rel, glob):
        return None
    return rel


def _normalise(base: PurePosixPath, value: str, glob: bool) -> list[str] | None:
    """The path's parts after `..` and `.`; a glob part that may match `..` climbs. None: above."""
    stack = [p for p in base.parts if p not in ("/", ".")]
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part == ".." or (glob and _GLOB.search(part) and part[0] in ".[?"):
            if not stack:
                return None
            stack.pop()
        else:
            stack.append(part)
    return stack


def _stays_inside_on_disk(workspace: Path, rel: PurePosixPath, glob: bool) -> bool:
    """Symbolic links in the part of the path that exists do not lead out of the workspace."""
    literal = []
    for part in rel.parts:
        if glob and _GLOB.search(part):
            break
        literal.append(part)
    try:
        root = os.path.realpath(workspace)
        real = os.path.realpath(os.path.join(root, *literal))
    except (OSError, ValueError):
        return False
    return real == root or real.startswith(root.rstrip("/") + "/")
