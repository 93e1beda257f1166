"""A test-suite check the workspace cannot bend: how it runs, and what it must report.

A check is recognised as a test suite when its command runs pytest (`pytest`, `py.test`,
`python -m pytest`), unittest (`python -m unittest`), tox or nox (`suite_kind`). For such a check:

- **the interpreter and the runner come from the check environment** (`check_env`): a safe path
  (PYTHONSAFEPATH: `python -m pytest` does not put the workspace first on sys.path, so a
  `pytest.py` there is not what runs), no user site, pytest's plugin autoload off with the plugins
  the check environment declares (its `pytest11` entry points) loaded by name, and bytecode written
  to and read from a cache outside the workspace (PYTHONPYCACHEPREFIX: a `__pycache__` in the
  workspace is never read). Workspace modules named like the standard library, the runner or an
  installed test dependency, loose bytecode and compiled modules, and distribution metadata
  (entry points) in the workspace are found by agents/check_settings.py (`guarded_names` says
  which names) and keep the finish from succeeding;
- **the runner's own result is read** (`read_result`): pytest writes a JUnit report outside the
  workspace (the summary line gives deselected and xpassed), unittest's closing lines are parsed;
- **a ratchet on what it counted** (`compare`): fewer tests than at the run's start, more
  deselected, skipped, xfailed or xpassed, or no result at all fails the check, with the reason.

Checks that are not test suites (`true`, `make test`, a shell script) run as before. A run opts out
with `suite_guard=False` (`create_run --no-suite-guard`).
"""

from __future__ import annotations

import configparser
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from agents.sandbox import view

# What a suite's command looks like. Word boundaries on both sides: `pytest-foo` is not pytest.
_PYTEST = re.compile(r"(?:^|[\s;&|(/=])(?:py\.test|pytest)(?=$|[\s;&|)])|-m\s*pytest(?=$|[\s;&|)])")
_UNITTEST = re.compile(r"-m\s*unittest(?=$|[\s;&|)])")
_TOX = re.compile(r"(?:^|[\s;&|(/])(tox|nox)(?=$|[\s;&|)])")

# The runner and what it imports at start-up: a workspace module of one of these names shadows it.
RUNNER_NAMES = frozenset(
    {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "exceptiongroup", "tomli",
     "unittest", "tox", "nox", "coverage", "pygments", "colorama", "_distutils_hack",
     "setuptools", "pkg_resources", "pip", "sitecustomize", "usercustomize"}
)  # fmt: skip

REPORT = "junit.xml"
COUNTED = ("tests", "passed", "failed", "errors", "skipped", "xfailed", "xpassed", "deselected")
# What must not grow from the baseline (and `tests`, which must not shrink).
MUST_NOT_GROW = ("deselected", "skipped", "xfailed", "xpassed")


def suite_kind(command: str) -> str | None:
    """ "pytest", "unittest", "tox" or "nox" when the command runs a test suite, else None."""
    if _PYTEST.search(command):
        return "pytest"
    if _UNITTEST.search(command):
        return "unittest"
    if m := _TOX.search(command):
        return m.group(1)
    return None


# --- the check environment -------------------------------------------------------------------
def site_dirs(toolchain: Sequence[str] | None) -> list[Path]:
    """The site-packages folders the check's interpreter imports from: a virtualenv's own (and
    its base's when it includes system site packages), an interpreter prefix's."""
    found: list[Path] = []

    def add(prefix: Path) -> None:
        for pattern in ("lib/python3*/site-packages", "lib/python3/dist-packages"):
            for d in sorted(prefix.glob(pattern)):
                if d.is_dir() and d not in found:
                    found.append(d)

    folders = [Path(f) for f in view.toolchain_folders(toolchain)]
    hidden = set()  # the bases of virtualenvs that do not include system site packages
    for prefix in folders:
        cfg = prefix / "pyvenv.cfg"
        if cfg.is_file():
            text = cfg.read_text(errors="replace").lower()
            if not re.search(r"include-system-site-packages\s*=\s*true", text):
                hidden.add(_venv_base(cfg))
    for prefix in folders:
        if (prefix / "pyvenv.cfg").is_file() or prefix not in hidden:
            add(prefix)
    return found


def _venv_base(cfg: Path) -> Path:
    for line in cfg.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(os.path.dirname(os.path.abspath(value.strip())))
    return Path("/")


def _distributions(toolchain: Sequence[str] | None) -> list[Path]:
    return [d for site in site_dirs(toolchain) for d in sorted(site.glob("*.dist-info"))]


def declared_plugins(toolchain: Sequence[str] | None) -> list[str]:
    """The names of the pytest plugins the check environment declares (`pytest11` entry
    points of its distributions), read from their metadata without running anything."""
    names: list[str] = []
    for dist in _distributions(toolchain):
        points = dist / "entry_points.txt"
        if not points.is_file():
            continue
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read_string(points.read_text(errors="replace"))
        except configparser.Error:
            continue
        if parser.has_section("pytest11"):
            for name in parser.options("pytest11"):
                if re.fullmatch(r"[\w.\-]+", name) and name not in names:
                    names.append(name)
    return sorted(names)


@cache
def _top_level(dist: Path, mtime: float) -> frozenset[str]:
    names: set[str] = set()
    top = dist / "top_level.txt"
    if top.is_file():
        names.update(n.strip() for n in top.read_text(errors="replace").splitlines() if n.strip())
    record = dist / "RECORD"
    if record.is_file():
        for line in record.read_text(errors="replace").splitlines():
            first = line.split(",", 1)[0].split("/", 1)
            head = first[0]
            if head.startswith("..") or head.endswith((".dist-info", ".data", ".pth")):
                continue
            if head == "__pycache__" or not head:
                continue
            name = head.split(".", 1)[0] if len(first) == 1 else head
            if len(first) == 1 and not head.endswith((".py", ".so", ".pyd", ".pyc")):
                continue
            if name.isidentifier():
                names.add(name)
    return frozenset(names)


def guarded_names(toolchain: Sequence[str] | None) -> frozenset[str]:
    """Names a workspace module must not take: the standard library's, the runner's, and every
    top-level module of a distribution installed in the check environment."""
    names = set(sys.stdlib_module_names) | RUNNER_NAMES
    for dist in _distributions(toolchain):
        try:
            names |= _top_level(dist, dist.stat().st_mtime)
        except OSError:
            continue
    names.discard("__future__")
    return frozenset(names)


ROOT_FILES = frozenset({"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py"})


def flat_layout(workspace: Path) -> bool:
    """Whether the project's own modules sit at the workspace's root (imported from there, so
    the root must stay on the path; the scan of agents/check_settings.py guards it)."""
    try:
        entries = list(Path(workspace).iterdir())
    except OSError:
        return False
    return any(
        (e.suffix == ".py" and e.name not in ROOT_FILES and not e.name.startswith("test"))
        or (e.is_dir() and (e / "__init__.py").is_file() and e.name not in TEST_FOLDERS)
        for e in entries
    )


def check_env(
    kind: str, report_dir: str, toolchain: Sequence[str] | None, *, safe_path: bool = True
) -> dict[str, str]:
    """The environment variables a suite check runs with (on top of the sandbox's).
    `safe_path`: the workspace is not put first on sys.path by `python -m` (not for a flat
    layout, whose modules are imported from the root)."""
    env = {
        **({"PYTHONSAFEPATH": "1"} if safe_path else {}),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPYCACHEPREFIX": os.path.join(report_dir, "pycache"),
    }
    if kind in ("pytest", "tox", "nox"):
        plugins = " ".join(f"-p {name}" for name in declared_plugins(toolchain))
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        env["PYTEST_ADDOPTS"] = (
            f"{plugins} --junitxml={os.path.join(report_dir, REPORT)} -p no:cacheprovider".strip()
        )
    return env


# --- the runner's result ---------------------------------------------------------------------
_SUMMARY_LINE = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+)(?: in [\d.]+s.*?)?\s*=*\s*$", re.M)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)")


def _summary_counts(output: str) -> dict[str, int] | None:
    """pytest's closing summary ("3 failed, 781 passed, 2 deselected in 1.2s"), if any."""
    found = None
    for m in _SUMMARY_LINE.finditer(output):
        counts = dict.fromkeys(("passed", "failed", "errors", "skipped", "deselected"), 0)
        counts |= {"xfailed": 0, "xpassed": 0}
        words = _COUNT.findall(m.group(1))
        if not words or not any(
            w
            in (
                "passed",
                "failed",
                "error",
                "errors",
                "skipped",
                "deselected",
                "xfailed",
                "xpassed",
            )
            for _, w in words
        ):
            continue  # fmt: skip
        for n, word in words:
            word = "errors" if word.startswith("error") else word
            if word in counts:
                counts[word] = int(n)
        found = counts
    return found


def _junit_counts(path: Path) -> dict[str, int] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped", "xfailed"), 0)
    cases = list(root.iter("testcase"))
    for case in cases:
        kids = {child.tag: child for child in case}
        if "error" in kids:
            counts["errors"] += 1
        elif "failure" in kids:
            counts["failed"] += 1
        elif "skipped" in kids:
            key = "xfailed" if kids["skipped"].get("type") == "pytest.xfail" else "skipped"
            counts[key] += 1
        else:
            counts["passed"] += 1
    # Collection errors have no testcase of their own in some versions: the suite says so.
    suite_errors = sum(int(s.get("errors", 0) or 0) for s in root.iter("testsuite"))
    counts["errors"] = max(counts["errors"], suite_errors)
    return counts


_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$", re.M)
_UNITTEST_END = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.M)


def _unittest_counts(output: str) -> dict[str, int] | None:
    ran = list(_UNITTEST_RAN.finditer(output))
    end = list(_UNITTEST_END.finditer(output))
    if not ran or not end:
        return None
    details = dict.fromkeys(("failures", "errors", "skipped", "expected failures",
                             "unexpected successes"), 0)  # fmt: skip
    for part in (end[-1].group(2) or "").split(","):
        key, _, value = part.strip().partition("=")
        if key in details and value.isdigit():
            details[key] = int(value)
    total = int(ran[-1].group(1))
    bad = details["failures"] + details["errors"]
    xfailed, xpassed = details["expected failures"], details["unexpected successes"]
    return {
        "tests": total,
        "passed": max(0, total - bad - details["skipped"] - xfailed - xpassed),
        "failed": details["failures"],
        "errors": details["errors"],
        "skipped": details["skipped"],
        "xfailed": xfailed,
        "xpassed": xpassed,
        "deselected": 0,
    }


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_result(kind: str, report_dir: str | None, output: str) -> dict[str, Any] | None:
    """What the runner counted, {tests, passed, failed, errors, skipped, xfailed, xpassed,
    deselected, source}; None when it left no result the harness can read. Colours
    (`--color=yes` in a project's addopts) are taken out of the output first."""
    output = _ANSI.sub("", output)
    if kind == "unittest":
        counts = _unittest_counts(output)
        return {**counts, "source": "unittest output"} if counts else None
    junit = _junit_counts(Path(report_dir) / REPORT) if report_dir else None
    summary = _summary_counts(output)
    if junit is None:
        if kind == "pytest" or summary is None:
            return None  # pytest always writes its report when it gets to the end
        counts, source = summary, "summary line"
    else:
        counts, source = junit, "junit report"
        # xpassed (counted as passed in JUnit) and deselected are only in the summary line.
        if summary is not None:
            counts["xpassed"] = summary["xpassed"]
            counts["passed"] = max(0, counts["passed"] - summary["xpassed"])
            counts["deselected"] = summary["deselected"]
        counts.setdefault("xpassed", 0)
        counts.setdefault("deselected", 0)
    counts["tests"] = sum(
        counts[k] for k in ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
    )
    return {**{k: counts.get(k, 0) for k in COUNTED}, "source": source}


def compare(now: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """Why a suite check cannot pass on what it counted ([] when it can)."""
    if now is None:
        return [
            "the test runner left no result the harness can read (no report, no summary): "
            "a test-suite check passes only on a result it can count"
        ]
    reasons = []
    if now["failed"] or now["errors"]:
        reasons.append(f"{now['failed']} failed and {now['errors']} errors")
    if base is None:
        return reasons
    if now["tests"] < base["tests"]:
        reasons.append(
            f"fewer tests ran than at the run's start ({now['tests']}, was {base['tests']})"
        )
    for key in MUST_NOT_GROW:
        if now.get(key, 0) > base.get(key, 0):
            reasons.append(
                f"more tests {key} than at the run's start ({now[key]}, was {base[key]})"
            )
    return reasons


def describe(counts: dict[str, Any] | None) -> str:
    if counts is None:
        return "no result"
    return ", ".join(f"{counts[k]} {k}" for k in COUNTED if counts.get(k)) or "0 tests"


# --- default protection ----------------------------------------------------------------------
TEST_FOLDERS = frozenset({"tests", "test", "testing"})
_SKIP = frozenset({".git", "node_modules", "__pycache__", ".venv", "venv", ".tox", ".nox"})


def test_paths(workspace: Path) -> list[str]:
    """The test folders (tests/, test/, testing/ anywhere) and test files outside them
    (test_*.py, *_test.py) a suite check depends on, as protected paths."""
    workspace = Path(workspace)
    found: list[str] = []
    for here, dirs, files in os.walk(workspace):
        if "pyvenv.cfg" in files:
            dirs[:] = []
            continue
        rel_here = Path(here).relative_to(workspace)
        keep = []
        for d in sorted(dirs):
            if d in _SKIP or os.path.islink(os.path.join(here, d)):
                continue
            if d in TEST_FOLDERS:
                found.append((rel_here / d).as_posix() + "/")
            else:
                keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            testy = name.startswith("test_") or name.endswith("_test.py")
            if name.endswith(".py") and testy and not os.path.islink(os.path.join(here, name)):
                found.append((rel_here / name).as_posix())
    return found
