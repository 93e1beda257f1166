"""Three-way merges of a child run's work into its parent's workspace.

base = the tree the child started from, theirs = the child's final tree, ours = the parent's
workspace as it is now; the child's paths sit under `folder` of the parent's. Per path: when ours
equals theirs nothing changes; when ours is still the base, theirs is taken; when both changed a
text file, `git merge-file` merges the lines (a subprocess: git is a separate program, so its
licence does not reach ours); anything else (both changed a binary file, one deleted what
the other changed, a symlink) is a whole-file conflict.

A merge is planned in memory first (`plan`); a plan with a conflict applies nothing. `apply`
writes every file to a temporary name beside its target and only then renames them all into
place, so a failure part-way leaves no child half-applied in this process; across a worker's
death the runtime restores the checkpoint taken before the merge (agents/fleets/parent.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import sandbox
from agents.snapshots import Snapshots

# A side of a path: ("f", bytes, mode), ("l", target) or None (absent).
Side = tuple | None
MARKERS = ("ours (parent)", "base", "theirs (child)")  # labels for git merge-file's -L
# git with no user or system configuration (a merge.conflictStyle of the host's would change the
# markers), and two-sided markers pinned.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
MERGE_TIMEOUT_S = 60
MAX_CONFLICT_CHARS = 20_000


@dataclass
class Plan:
    writes: dict[str, Side] = field(default_factory=dict)  # parent path -> its new side
    files: list[str] = field(default_factory=list)  # parent paths the child changed
    conflicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.conflicts


def _tree_side(store: Snapshots, tree: str, entries: dict, path: str) -> Side:
    e = entries.get(path)
    if e is None or e.type == "d":
        return None
    if e.type == "l":
        return ("l", e.target)
    return ("f", store.read(tree, path), e.mode)


def _in(workspace: sandbox.Workspace, rel: str) -> Path:
    """`rel` in the workspace, its folders resolved inside it (a symlink the agent made must not
    lead a read or a write outside); the last part itself is not followed."""
    return workspace.resolve(str(Path(rel).parent) or ".") / Path(rel).name


def _live_side(workspace: sandbox.Workspace, path: str) -> Side:
    try:
        target = _in(workspace, path)
        info = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return ("l", os.readlink(target))
    if not stat.S_ISREG(info.st_mode):
        return ("d",) if stat.S_ISDIR(info.st_mode) else None
    return ("f", target.read_bytes(), info.st_mode & 0o7777)


def _text(side: Side) -> list[str] | None:
    if side is None:
        return []
    if side[0] != "f" or b"\0" in side[1]:
        return None
    try:
        return side[1].decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _same(a: Side, b: Side) -> bool:
    # A file's mode counts only when its content is the same.
    if a and b and a[0] == b[0] == "f":
        return a[1] == b[1] and a[2] == b[2]
    return a == b


def plan(
    store: Snapshots,
    base: str,
    theirs: str,
    workspace: sandbox.Workspace,
    folder: str = "",
    resolution: dict[str, Any] | None = None,
) -> Plan:
    """What merging the child's change from `base` to `theirs` into `workspace` would do.
    `resolution` settles conflicts a person decided: {"choose": "ours"|"theirs"} or
    {"files": {parent path: text}}."""
    out = Plan()
    base_files, their_files = store.files(base), store.files(theirs)
    for change in store.diff(base, theirs, text_diffs=False):
        if "d" in (change.old_type, change.new_type) and change.status != "type_changed":
            continue  # folders follow their files
        rel = change.path
        target = f"{folder}/{rel}" if folder else rel
        b = _tree_side(store, base, base_files, rel)
        t = _tree_side(store, theirs, their_files, rel)
        out.files.append(target)
        try:
            o = _live_side(workspace, target)
        except sandbox.ToolInputError as e:  # a symlink of the parent's leads outside
            out.conflicts.append(
                {"path": target, "kind": "unsafe path", "merged": None, "ours": str(e),
                 "theirs": _describe(t)}
            )  # fmt: skip
            continue
        if _same(o, t):
            continue
        if _same(o, b):
            out.writes[target] = t
            continue
        merged = _merge_text(b, o, t)
        if merged is not None and merged[1]:
            out.writes[target] = ("f", merged[0].encode(), (o or t)[2])
            continue
        choice = _resolved(resolution, target)
        if choice is not None:
            out.writes[target] = (
                t if choice == "theirs" else o if choice == "ours" else ("f", choice, (o or t)[2])
            )
            continue
        out.conflicts.append(
            {
                "path": target,
                "kind": "text" if merged is not None else "whole file",
                "merged": merged[0][:MAX_CONFLICT_CHARS] if merged is not None else None,
                "ours": _describe(o),
                "theirs": _describe(t),
            }
        )
    return out


def _merge_text(b: Side, o: Side, t: Side) -> tuple[str, bool] | None:
    """The merged text and whether it is clean; None when a side is not text."""
    lines = [_text(s) for s in (b, o, t)]
    if any(x is None for x in lines) or o is None or t is None:
        return None
    with tempfile.TemporaryDirectory(prefix="shiftlog-merge-") as tmp:
        names = []
        for name, side in (("ours", o), ("base", b), ("theirs", t)):
            path = Path(tmp) / name
            path.write_bytes(side[1] if side is not None else b"")
            names.append(str(path))
        labels = [arg for label in MARKERS for arg in ("-L", label)]
        try:
            done = subprocess.run(
                ["git", "-c", "merge.conflictStyle=merge", "merge-file", "-p", *labels, *names],
                capture_output=True,
                cwd=tmp,
                env={**os.environ, **GIT_ENV},
                timeout=MERGE_TIMEOUT_S,
                check=False,
            )
        except FileNotFoundError as e:
            raise RuntimeError("three-way merges need git on the PATH") from e
        except subprocess.TimeoutExpired:
            return None  # too large to merge line by line: a whole-file conflict
    # 0: clean; 1..127: the number of conflicts; anything else (-1 = 255) is git's own error.
    if not 0 <= done.returncode <= 127:
        return None
    try:
        return done.stdout.decode("utf-8"), done.returncode == 0
    except UnicodeDecodeError:
        return None


def _resolved(resolution: dict[str, Any] | None, path: str) -> str | bytes | None:
    if not resolution:
        return None
    files = resolution.get("files")
    if isinstance(files, dict) and isinstance(files.get(path), str):
        return files[path].encode()
    choose = resolution.get("choose")
    return choose if choose in ("ours", "theirs") else None


def _describe(side: Side) -> str:
    if side is None:
        return "deleted"
    if side[0] == "l":
        return f"symlink to {side[1]}"
    if side[0] == "d":
        return "a folder"
    return f"{len(side[1])} bytes"


def apply(workspace: sandbox.Workspace, p: Plan) -> None:
    """Write a clean plan: every new file to a temporary name first, then all renamed into
    place and the deletions done; on a failure before the renames nothing is changed."""
    staged: list[tuple[Path, Path | None]] = []  # (temporary, target)
    try:
        for i, (rel, side) in enumerate(sorted(p.writes.items())):
            target = _in(workspace, rel)
            if side is None:
                staged.append((target, None))
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.parent / f".shiftlog-merge-{os.getpid()}-{i}"
            if side[0] == "l":
                os.symlink(side[1], temp)
            else:
                temp.write_bytes(side[1])
                os.chmod(temp, side[2] or 0o644)
            staged.append((temp, target))
    except BaseException:
        for temp, target in staged:
            if target is not None:
                with contextlib.suppress(OSError):
                    temp.unlink()
        raise
    for temp, target in staged:
        if target is None:
            if temp.is_dir() and not temp.is_symlink():
                continue
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        else:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)  # a folder replaced by a file
            os.replace(temp, target)
