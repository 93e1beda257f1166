"""What changes how a check runs, held as it was when the run was created.

A test suite is bent less by editing the tests than by what runs around them: a `conftest.py`
anywhere that deselects the failing test, test settings in pytest.ini, tox.ini, setup.cfg or
pyproject.toml's [tool.pytest] tables, a sitecustomize.py or a .pth file that runs code at start-up,
an executable named like an interpreter or test runner, a .pth in a virtualenv that points outside
the workspace (at another checkout's code). Each of these is fingerprinted when the run is created
(`fingerprint`); before the harness runs the checks, `changes` finds what the agent added or
changed since and `neutralise` puts the originals back (what was added is taken out, and kept as an
artifact), so the checks run the way they did when the run was made. The checks themselves run in
the same sandbox as the agent's commands, with the run's toolchain, never with more reach.

Inside a virtualenv folder (one holding pyvenv.cfg) only .pth files that point outside the
workspace count: packages the agent installs there are its work. A check that runs the
workspace's own virtualenv can still be bent through it: name the environment the checks run in
(`--env`, `--env-requirements`) instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from agents import blobstore

SETTINGS_FILES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
     "tox.toml", "setup.cfg", "noxfile.py", "hatch.toml", "sitecustomize.py", "usercustomize.py"}
)  # fmt: skip
# Code that runs in place of a module's source, or metadata that makes the runner load a plugin:
# with a test-suite check (agents/suite_guard.py) these keep the finish from succeeding.
BLOCKING_KINDS = frozenset(
    {"bytecode without its source", "a compiled module", "a distribution's metadata",
     "a module named like one the checks import"}
)  # fmt: skip
COMPILED = (".so", ".pyd")
# Executables named like what a check command calls: a shim in the workspace stands in for it.
SHIMS = frozenset(
    {"python", "python3", "pytest", "py.test", "pip", "pip3", "sh", "bash", "env", "node",
     "npm", "npx", "make", "tox", "nox", "coverage"}
)  # fmt: skip
SKIPPED = frozenset({".git", "node_modules", "__pycache__", ".shiftlog", ".pytest_cache"})
PYPROJECT = "pyproject.toml"


class OutsidePointer(ValueError):
    """A virtualenv in the workspace points at code outside it (the message says which)."""


def _is_shim(path: Path) -> bool:
    name = path.name
    base = name.split(".", 1)[0] if name.startswith("python") else name
    if name not in SHIMS and base not in SHIMS and not name.startswith("python3."):
        return False
    try:
        return bool(path.lstat().st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
    except OSError:
        return False


def _pytest_table(data: bytes) -> str:
    """pyproject.toml's test settings ([tool.pytest], pytest 9's native table included, and
    the test runners' [tool.tox], [tool.nox] and [tool.hatch.envs]), as canonical JSON (""
    when there are none, or the file is not TOML: then it cannot configure them either)."""
    try:
        tool = tomllib.loads(data.decode("utf-8")).get("tool", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ""
    if not isinstance(tool, dict):
        return ""
    tables = {
        "tox": tool.get("tox"),
        "nox": tool.get("nox"),
        "hatch.envs": (tool.get("hatch") or {}).get("envs")
        if isinstance(tool.get("hatch"), dict)
        else None,
    }
    tables = {k: v for k, v in tables.items() if v}
    if not tables:  # as before: the [tool.pytest] table alone
        table = tool.get("pytest")
        return json.dumps(table, sort_keys=True, default=str) if table else ""
    return json.dumps({"pytest": tool.get("pytest"), **tables}, sort_keys=True, default=str)


def _outside(line: str, workspace: Path) -> bool:
    """Whether a .pth line is a path outside the workspace (code lines, `import …`, are
    judged as code: they run at start-up wherever they point)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return False
    if line.startswith(("import ", "import\t")):
        return True
    target = Path(line)
    if not target.is_absolute():
        return False
    return not (target == workspace or workspace in target.parents)


def scan(workspace: Path, guarded: frozenset[str] | None = None) -> dict[str, dict[str, Any]]:
    """{relative path: {kind, hash}} of everything that changes how checks run, now. With
    `guarded` (agents/suite_guard.guarded_names: a test-suite check), also what would run in
    place of source or of the runner: modules that could be imported as top-level ones under a
    guarded name, bytecode outside __pycache__, compiled modules, distribution metadata."""
    workspace = Path(workspace)
    found: dict[str, dict[str, Any]] = {}
    venvs: list[Path] = []  # virtualenv folders met so far (os.walk goes top down)
    for folder, dirs, files in os.walk(workspace):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        if "pyvenv.cfg" in files:
            venvs.append(here)
        in_venv = any(v == here or v in here.parents for v in venvs)
        for name in sorted(files):
            path = here / name
            if path.is_symlink() and not path.exists():
                continue
            rel = path.relative_to(workspace).as_posix()
            if in_venv:
                if name.endswith(".pth") and _pth_points_outside(path, workspace):
                    found[rel] = _print(path, "a .pth pointing outside the workspace")
                continue
            if guarded is not None and (kind := _shadow(here, name, guarded)):
                found[rel] = _print(path, kind)
            elif name in SETTINGS_FILES or name.endswith(".pth"):
                found[rel] = _print(
                    path, "test settings" if name in SETTINGS_FILES else "a .pth file"
                )
            elif name == PYPROJECT:
                table = _pytest_table(_read(path))
                if table:
                    found[rel] = {
                        **_print(path, "pyproject.toml's [tool.pytest]"),
                        "table": _digest(table.encode()),
                    }
            elif _is_shim(path):
                found[rel] = _print(path, "an executable named like a tool the checks call")
    return found


def _shadow(here: Path, name: str, guarded: frozenset[str]) -> str:
    """The blocking kind of a file, or "" (see BLOCKING_KINDS)."""
    if name.endswith(".pyc"):
        return "bytecode without its source"
    if name.endswith(COMPILED) or ".so." in name:
        return "a compiled module"
    if here.name.endswith((".dist-info", ".egg-info")) or name.endswith(".egg-link"):
        return "a distribution's metadata"
    top_level = not (here / "__init__.py").exists()
    if name.endswith(".py") and top_level and name[:-3] in guarded:
        return "a module named like one the checks import"
    if (
        name == "__init__.py"
        and here.name in guarded
        and not (here.parent / "__init__.py").exists()
    ):
        return "a module named like one the checks import"
    return ""


def _pth_points_outside(path: Path, workspace: Path) -> bool:
    try:
        return any(
            _outside(line, workspace) for line in path.read_text(errors="replace").splitlines()
        )
    except OSError:
        return False


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _print(path: Path, kind: str) -> dict[str, Any]:
    return {"kind": kind, "hash": _digest(_read(path))}


def fingerprint(
    workspace: Path, guarded: frozenset[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The run's check settings at creation; their contents go into the blob store, so the
    originals can be put back. OutsidePointer when a virtualenv points outside the workspace:
    the checks would test that code, not the workspace's."""
    prints = scan(workspace, guarded)
    pointing = [rel for rel, p in prints.items() if p["kind"].startswith("a .pth pointing")]
    if pointing:
        raise OutsidePointer(
            f"{pointing[0]} points at code outside the workspace (a virtualenv made elsewhere, "
            "e.g. by `uv sync` in the original checkout): the checks would test that code, not "
            "the workspace's. Remove the virtualenv from the workspace, or name the environment "
            "the checks run in with --env / --env-requirements"
        )
    store = blobstore.configured()
    for rel, p in prints.items():
        p["blob"] = store.put(_read(Path(workspace) / rel))
    return prints


def changes(
    workspace: Path, prints: dict[str, dict[str, Any]], guarded: frozenset[str] | None = None
) -> list[dict[str, Any]]:
    """What the agent added, changed or removed of the check settings since creation."""
    now = scan(workspace, guarded)
    found = []
    for rel, p in now.items():
        was = prints.get(rel)
        # "absent": a person approved taking it out (agents/config_changes.py).
        if was is None or was.get("absent"):
            found.append({"path": rel, "change": "added", "kind": p["kind"]})
        elif rel.endswith(PYPROJECT) and "table" in was:
            if p.get("table") != was["table"]:
                found.append({"path": rel, "change": "test settings changed", "kind": p["kind"]})
        elif p["hash"] != was["hash"]:
            found.append({"path": rel, "change": "modified", "kind": p["kind"]})
    for rel, was in prints.items():
        if rel not in now and not was.get("absent"):
            path = Path(workspace) / rel
            if rel.endswith(PYPROJECT) and path.is_file():
                # Still there, without test settings: they were taken out.
                found.append({"path": rel, "change": "test settings changed", "kind": was["kind"]})
            else:
                found.append({"path": rel, "change": "deleted", "kind": was["kind"]})
    return sorted(found, key=lambda c: c["path"])


def neutralise(
    workspace: Path, prints: dict[str, dict[str, Any]], found: list[dict[str, Any]]
) -> dict[str, bytes]:
    """Put the check settings back as they were: originals restored, additions taken out.
    Returns what was taken out or replaced, {path: contents}, for the caller to keep."""
    store = blobstore.configured()
    kept: dict[str, bytes] = {}
    for change in found:
        rel = change["path"]
        path = Path(workspace) / rel
        if path.is_file() and not path.is_symlink():
            kept[rel] = path.read_bytes()
        if path.is_symlink() or path.is_file():
            path.unlink()
        original = prints.get(rel)
        if original is not None and original.get("blob"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(store.get(original["blob"]))
    return kept
