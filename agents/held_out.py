"""Held-out checks: files (tests, say) the agent never sees and commands that use them, run only
at finish, after every done-condition passed.

At creation the files of a folder go into the blob store (`collect`), not into the workspace. At
finish they are written into the workspace, the commands run as the harness (guarded like any
test-suite check), and the files are taken out again, whatever was there before put back
(`run_held_out`). The agent is told only which held-out checks failed, never their output: that
is kept as an artifact for people.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from agents import blobstore, done_conditions

MAX_FILES = 500


class HeldOutProblem(ValueError):
    pass


def collect(folder: str | Path, checks: list[str]) -> dict[str, Any]:
    """{"files": {relative path: blob hash}, "checks": [...]} for a run's held-out set."""
    root = Path(folder)
    if not root.is_dir():
        raise HeldOutProblem(f"{root} is not a folder")
    if not checks:
        raise HeldOutProblem("held-out files need at least one held-out check to run them")
    store = blobstore.configured()
    files: dict[str, str] = {}
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__"))
        for name in sorted(names):
            path = Path(here, name)
            if path.is_symlink() or not path.is_file():
                continue
            files[path.relative_to(root).as_posix()] = store.put(path.read_bytes())
            if len(files) > MAX_FILES:
                raise HeldOutProblem(f"a held-out set has at most {MAX_FILES} files")
    return {"files": files, "checks": list(checks)}


def run_held_out(held_out: dict[str, Any], workspace, **check_options) -> list[dict[str, Any]]:
    """Write the held-out files in, run the held-out checks, take the files out again."""
    store = blobstore.configured()
    before: dict[str, bytes | None] = {}
    made: list[Path] = []  # folders the held-out files needed: taken out again, deepest first
    try:
        for rel, digest in held_out.get("files", {}).items():
            path = workspace.resolve(rel)  # inside the workspace, through no link
            before[rel] = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            if path.is_symlink():
                path.unlink()
            missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
            made += [p for p in missing if p not in made]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(store.get(digest))
        return done_conditions.run_checks(held_out.get("checks", []), workspace, **check_options)
    finally:
        for rel, data in before.items():
            path = Path(workspace.path) / rel
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)
        for folder in sorted(made, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):  # not empty: the check left something there
                folder.rmdir()
