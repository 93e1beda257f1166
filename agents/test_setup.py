"""A real project's test set-up, found the way its own CI finds it, and the check environment
built from it.

`detect(DIR)` reads pyproject.toml (the test extras of [project.optional-dependencies], the test
groups of [dependency-groups], [tool.tox]'s and tox.ini's test environment, hatch's test
environment), requirements files named for tests, and the layout (src/ or flat), and says what it
chose and why (`Setup.describe`). `build(setup, workspace, where)` builds the check environment:
the test dependencies in a virtualenv cached by their hash (built once, shared read-only by the
runs that need the same), and per run a small virtualenv on top of it with the project installed
editable from the run's workspace, never a copy. `create_run --workspace-from DIR` without
`--check` uses it; `--check` and `--env-requirements` change what it chose.

A `.venv` (any folder holding pyvenv.cfg) in the checkout is left out of the workspace
(`leave_out`): it was made for the checkout, not for the run. A check environment that holds a
non-editable copy of the project is refused (`installed_copy`): its checks would test that copy.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents import suite_guard
from agents.isolation import _base_python

TEST_NAMES = ("tests", "test", "testing")  # extras, groups and envs, in order of preference
REQUIREMENT_FILES = (
    "requirements/tests.txt",
    "requirements/test.txt",
    "requirements/testing.txt",
    "requirements-tests.txt",
    "requirements-test.txt",
    "test-requirements.txt",
    "tests/requirements.txt",
)


class SetupProblem(ValueError):
    """The project's test set-up cannot be found or built; the message says why."""


@dataclass
class Setup:
    name: str = ""  # the project's distribution name ("" when it has none)
    installable: bool = False  # pyproject.toml or setup.py: installed editable
    layout: str = "flat"  # "src" or "flat"
    runner: str = "pytest"  # or "unittest"
    requirements: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)  # installed with the project: pkg[extra]
    sources: list[str] = field(default_factory=list)  # where each choice came from
    command: str = ""

    def describe(self) -> str:
        lines = [
            f"test set-up of {self.name or 'the project'} ({self.layout} layout, {self.runner})",
            f"  check: {self.command}",
            f"  test dependencies: {', '.join(self.requirements) or '(none)'}",
        ]
        if self.installable:
            extras = f"[{','.join(self.extras)}]" if self.extras else ""
            lines.append(f"  the project installed editable from the workspace{extras}")
        lines += [f"  from {s}" for s in self.sources]
        lines.append("  (give --check CMD or --env-requirements FILE to change what was chosen)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def leave_out(folder: str, names: list[str]) -> set[str]:
    """shutil.copytree's `ignore`: virtualenvs (a folder holding pyvenv.cfg) are not copied."""
    return {n for n in names if os.path.isfile(os.path.join(folder, n, "pyvenv.cfg"))}


PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "noxfile.py")


def is_python_project(folder: str | Path) -> bool:
    """Whether `folder` has a Python project's set-up to detect."""
    root = Path(folder)
    return any((root / f).is_file() for f in (*PROJECT_FILES, *REQUIREMENT_FILES))


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _group(groups: dict[str, Any], name: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """A [dependency-groups] group's requirements, its {include-group} resolved (PEP 735)."""
    out: list[str] = []
    for item in groups.get(name) or []:
        if isinstance(item, str):
            out.append(item)
        elif (
            isinstance(item, dict)
            and isinstance(item.get("include-group"), str)
            and item["include-group"] not in seen
        ):
            out += _group(groups, item["include-group"], seen | {name})
    return out


def _ini_list(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


def detect(project: str | Path) -> Setup:
    """The project's test set-up, as its CI would run it."""
    root = Path(project)
    if not root.is_dir():
        raise SetupProblem(f"{root} is not a folder")
    setup = Setup()
    data = _load_toml(root / "pyproject.toml")
    meta = data.get("project") if isinstance(data.get("project"), dict) else {}
    tool = data.get("tool") if isinstance(data.get("tool"), dict) else {}
    setup.name = str(meta.get("name") or "")
    setup.installable = bool(data.get("build-system") or meta) or (root / "setup.py").is_file()
    if not setup.name and (root / "setup.cfg").is_file():
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read(root / "setup.cfg")
            setup.name = cfg.get("metadata", "name", fallback="")
        except configparser.Error:
            pass
    src = root / "src"
    if src.is_dir() and any(p.suffix == ".py" or p.is_dir() for p in src.iterdir()):
        setup.layout = "src"

    reqs: list[str] = []
    groups = (
        data.get("dependency-groups") if isinstance(data.get("dependency-groups"), dict) else {}
    )
    extras = meta.get("optional-dependencies") or {}
    tox = tool.get("tox") if isinstance(tool.get("tox"), dict) else {}
    tox_base = tox.get("env_run_base") if isinstance(tox.get("env_run_base"), dict) else {}
    # tox first (it is what CI runs), then the groups and extras named for tests.
    for g in tox_base.get("dependency_groups") or []:
        if g in groups:
            reqs += _group(groups, g)
            setup.sources.append(f"pyproject.toml [tool.tox.env_run_base] dependency group {g!r}")
    for e in tox_base.get("extras") or []:
        if e in extras:
            setup.extras.append(e)
            setup.sources.append(f"pyproject.toml [tool.tox.env_run_base] extra {e!r}")
    if (root / "tox.ini").is_file() and not reqs and not setup.extras:
        ini = configparser.ConfigParser(interpolation=None)
        try:
            ini.read(root / "tox.ini")
            if ini.has_section("testenv"):
                for line in _ini_list(ini.get("testenv", "deps", fallback="")):
                    if line.startswith("-r"):
                        reqs += _requirements_file(
                            root, line[2:].strip().removeprefix("{toxinidir}/")
                        )
                    elif not line.startswith(("-", "{")):
                        reqs.append(line)
                for e in _ini_list(ini.get("testenv", "extras", fallback="").replace(",", "\n")):
                    setup.extras.append(e)
                setup.sources.append("tox.ini [testenv]")
        except configparser.Error:
            pass
    if not reqs and not setup.extras:
        for name in TEST_NAMES:
            if name in groups:
                reqs += _group(groups, name)
                setup.sources.append(f"pyproject.toml [dependency-groups] {name!r}")
                break
        for name in TEST_NAMES:
            if name in extras:
                setup.extras.append(name)
                setup.sources.append(f"pyproject.toml [project.optional-dependencies] {name!r}")
                break
    hatch = tool.get("hatch") if isinstance(tool.get("hatch"), dict) else {}
    envs = hatch.get("envs") if isinstance(hatch.get("envs"), dict) else {}
    if not reqs and not setup.extras:
        for env in ("hatch-test", "test", "tests", "default"):
            table = envs.get(env) if isinstance(envs.get(env), dict) else {}
            found = [*(table.get("dependencies") or []), *(table.get("extra-dependencies") or [])]
            if found:
                reqs += [r for r in found if isinstance(r, str)]
                setup.extras += [f for f in table.get("features") or [] if isinstance(f, str)]
                setup.sources.append(f"pyproject.toml [tool.hatch.envs.{env}]")
                break
    if not reqs and not setup.extras:
        for rel in REQUIREMENT_FILES:
            if (root / rel).is_file():
                reqs += _requirements_file(root, rel)
                setup.sources.append(rel)
                break
    # The extras' requirements and the project's own go into the shared environment; the
    # project itself is then installed without them (--no-deps), editable.
    for e in setup.extras:
        reqs += [r for r in extras.get(e) or [] if isinstance(r, str)]
    if setup.extras or reqs:
        reqs += [r for r in meta.get("dependencies") or [] if isinstance(r, str)]
    own = re.sub(r"[-_.]+", "-", setup.name).lower()
    reqs = [
        r
        for r in reqs
        if not own or re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", r.strip())[0]).lower() != own
    ]
    setup.requirements = list(dict.fromkeys(r.strip() for r in reqs if r.strip()))
    wants_pytest = (
        any(re.match(r"pytest\b", r) for r in setup.requirements)
        or "pytest" in tool
        or any((root / f).is_file() for f in ("pytest.ini", "pytest.toml", "conftest.py"))
        or any("pytest" in json.dumps(extras.get(e, [])) for e in setup.extras)
    )
    setup.runner = "pytest" if wants_pytest else "unittest"
    has_pytest = any(re.match(r"pytest\b", r) for r in setup.requirements) or any(
        "pytest" in json.dumps(extras.get(e, [])) for e in setup.extras
    )
    if setup.runner == "pytest" and not has_pytest:
        setup.requirements.append("pytest")
    setup.command = "python -m pytest -q" if wants_pytest else "python -m unittest discover -q"
    if not setup.installable and setup.layout == "src":
        setup.command = "PYTHONPATH=src " + setup.command
    return setup


def _requirements_file(root: Path, rel: str) -> list[str]:
    path = (root / rel).resolve()
    if root.resolve() not in path.parents or not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            out += _requirements_file(root, str(path.parent.relative_to(root) / line[2:].strip()))
        elif not line.startswith("-"):
            out.append(line)
    return out


# --- building the check environment ----------------------------------------------------------
def _run(step: list[str], what: str) -> None:
    done = subprocess.run(step, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise SetupProblem(f"{what} failed: " + " / ".join(tail))


def _site(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SetupProblem(f"{venv} has no site-packages")
    return found[0]


def dependencies_env(requirements: list[str], envs: Path) -> Path:
    """A virtualenv holding `requirements` (and pip), under `envs`, named by their hash: built
    once, then shared read-only by every run that needs the same."""
    key = hashlib.sha256(
        json.dumps([sys.version_info[:2], sorted(requirements)]).encode()
    ).hexdigest()[:16]
    where = envs / f"deps-{key}"
    if (where / ".complete").is_file():
        return where
    envs.mkdir(parents=True, exist_ok=True)
    with open(envs / f"deps-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others then reuse it
        if (where / ".complete").is_file():
            return where
        shutil.rmtree(where, ignore_errors=True)
        try:
            _run([_base_python(), "-m", "venv", str(where)], "making the test environment")
            if requirements:
                _run(
                    [str(where / "bin" / "python"), "-m", "pip", "install", "-q", *requirements],
                    "installing the test dependencies",
                )
            (where / ".complete").write_text("\n".join(requirements) + "\n")
        except BaseException:
            shutil.rmtree(where, ignore_errors=True)
            raise
    return where


def build(setup: Setup, workspace: Path, where: Path, envs: Path) -> list[str]:
    """The run's check environment: a virtualenv at `where` that sees the shared test
    dependencies and has the project installed editable from `workspace`. Returns the toolchain
    folders (the run's venv, then the shared one)."""
    deps = dependencies_env(setup.requirements, envs)
    _run([_base_python(), "-m", "venv", "--without-pip", str(where)], "making the run's venv")
    (_site(where) / "_shiftlog_test_dependencies.pth").write_text(f"{_site(deps)}\n")
    if setup.installable:
        _run(
            [
                str(deps / "bin" / "python"),
                "-m",
                "pip",
                "--python",
                str(where / "bin" / "python"),
                "install",
                "-q",
                "--no-deps",  # its requirements are in the shared environment
                "-e",
                str(workspace),
            ],
            "installing the project editable from the workspace",
        )
    return [str(where), str(deps)]


def installed_copy(toolchain: list[str], workspace: Path) -> str:
    """Why the check environment cannot test the workspace ("" when it can): it holds the
    project installed as a copy (not editable), so the checks would import that copy."""
    name = detect(workspace).name if (Path(workspace) / "pyproject.toml").is_file() else ""
    if not name:
        return ""
    wanted = re.sub(r"[-_.]+", "_", name).lower()
    for site in suite_guard.site_dirs(toolchain):
        for dist in site.glob("*.dist-info"):
            stem = dist.name.removesuffix(".dist-info").rsplit("-", 1)[0]
            dist_name = re.sub(r"[-_.]+", "_", stem).lower()
            if dist_name != wanted:
                continue
            direct = dist / "direct_url.json"
            try:
                editable = json.loads(direct.read_text()).get("dir_info", {}).get("editable")
            except (OSError, ValueError, AttributeError):
                editable = False
            if not editable:
                return (
                    f"the check environment holds a copy of {name} ({dist.parent}), not an "
                    "editable install of the workspace: the checks would test that copy. Name "
                    "an environment without it, or let create_run build one (--workspace-from "
                    "without --env)"
                )
    return ""
