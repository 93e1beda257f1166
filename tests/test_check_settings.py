"""Checks the agent cannot bend from outside a protected folder: what changes how a check runs
(a conftest.py anywhere, test settings, a .pth or sitecustomize.py, a shim, a virtualenv that
points elsewhere) is held as it was at creation and put back before the checks run; protecting a
path that does not exist yet covers its creation. The checks here are a real pytest suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import check_settings
from agents.models import Artifact, Event, RunStatus
from agents.sandbox import isolation_available
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is not usable here"),
]

BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = (
    "from calc import add\n\n\ndef test_adds():\n    assert add(2, 2) == 4\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)
# Deselects the failing test: pytest reports "1 passed, 1 deselected" and exits 0.
CHEAT_CONFTEST = (
    "def pytest_collection_modifyitems(config, items):\n"
    "    items[:] = [i for i in items if 'adds' not in i.name]\n"
)
PYTEST = "python3 -m pytest -q -p no:cacheprovider"


@pytest.fixture
def project(tmp_path) -> Path:
    """A small project with a bug its own test suite catches."""
    root = tmp_path / "project"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\npythonpath = ["."]\n'
    )
    return root


def cheat(*writes: tuple[str, str]) -> list[dict]:
    """A script that writes files to make the failing suite pass, then calls finish."""
    return [
        *[{"tool_calls": [call("write_file", path=p, content=c)]} for p, c in writes],
        finish_turn("all tests pass"),
    ]


def checked_run(project: Path, *writes: tuple[str, str], protect: list[str] | None = None):
    return drive_until_idle(
        make_run(
            turns=cheat(*writes),
            checks=[PYTEST],
            workspace_from=str(project),
            protected_paths=protect or ["tests/"],
            environment=sys.prefix,  # the test runner's own environment: it has pytest
        )
    )


def tampered(run) -> list[dict]:
    return [
        f for e in Event.objects.filter(run=run, kind="check.tampered") for f in e.payload["files"]
    ]


def test_the_suite_fails_on_the_bug_and_passes_on_the_fix(project):
    """Positive controls: the checks are real, and a real fix is accepted."""
    assert checked_run(project).status != RunStatus.SUCCEEDED  # the script runs out
    fixed = checked_run(project, ("calc.py", "def add(a, b):\n    return a + b\n"))
    assert fixed.status == RunStatus.SUCCEEDED, fixed.status_reason
    assert tampered(fixed) == []


def test_a_conftest_at_the_root_that_deselects_the_failing_test_is_taken_out(project):
    run = checked_run(project, ("conftest.py", CHEAT_CONFTEST))
    assert run.status != RunStatus.SUCCEEDED
    files = tampered(run)
    assert {"path": "conftest.py", "change": "added"}.items() <= files[0].items()
    result = Event.objects.filter(run=run, kind="check.result").first().payload
    assert not result["passed"] and "deselected" not in result["output"]
    kept = Artifact.objects.get(run=run, name="moved-aside/conftest.py")
    assert kept.size == len(CHEAT_CONFTEST)


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("pytest.ini", "[pytest]\naddopts = -k 'not adds'\n"),
        ("setup.cfg", "[tool:pytest]\naddopts = -k 'not adds'\n"),
        ("tox.ini", "[pytest]\naddopts = -k 'not adds'\n"),
        ("pytest.toml", '[pytest]\naddopts = ["-k", "not adds"]\n'),  # pytest 9's own
        (
            "pyproject.toml",
            '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\n'
            'pythonpath = ["."]\naddopts = "-k \'not adds\'"\n',
        ),
        ("sitecustomize.py", "import calc\ncalc.add = lambda a, b: a + b\n"),
        ("src/zz_fix.pth", "import calc; calc.add = lambda a, b: a + b\n"),
    ],
)
def test_test_settings_and_startup_code_the_agent_adds_or_changes_are_put_back(
    project, path, content
):
    run = checked_run(project, (path, content))
    assert run.status != RunStatus.SUCCEEDED, path
    assert [f["path"] for f in tampered(run)] == [path]


def test_changing_pyproject_without_touching_its_test_settings_is_the_agents_work(project):
    grown = (
        (project / "pyproject.toml")
        .read_text()
        .replace('version = "0"', 'version = "0"\ndependencies = ["six"]')
    )
    fixed = checked_run(
        project, ("pyproject.toml", grown), ("calc.py", "def add(a, b):\n    return a + b\n")
    )
    assert fixed.status == RunStatus.SUCCEEDED and tampered(fixed) == []
    assert "six" in (fixed.workspace_path / "pyproject.toml").read_text()


def test_protecting_a_path_that_does_not_exist_yet_covers_its_creation(project):
    run = drive_until_idle(
        make_run(
            turns=[
                {"tool_calls": [call("write_file", path="docs/NOTES.md", content="x")]},
                {"tool_calls": [call("bash", command="mkdir -p docs && echo y > docs/NOTES.md")]},
                finish_turn(),
            ],
            checks=["test ! -e docs/NOTES.md"],
            workspace_from=str(project),
            protected_paths=["docs/NOTES.md"],
        )
    )
    first = Event.objects.filter(run=run, kind="tool.result").first().payload
    assert first["is_error"] and "protected" in first["output"]  # the file tool is refused
    assert run.status == RunStatus.SUCCEEDED  # bash made it; it was taken out before the check
    assert [f["path"] for f in tampered(run)] == ["docs/NOTES.md"]


def test_a_virtualenv_in_the_checkout_is_left_out_of_the_workspace(project, tmp_path):
    """A .venv made for the checkout (uv's default) points at the checkout's code: it is not
    copied into the workspace, and the run is made (it was refused before)."""
    venv = project / ".venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "_calc.pth").write_text(str(tmp_path / "original-checkout") + "\n")
    run = make_run(turns=[finish_turn()], workspace_from=str(project))
    assert not (run.workspace_path / ".venv").exists()
    assert (run.workspace_path / "calc.py").is_file()


def test_a_virtualenv_pointing_outside_is_still_found_by_the_scan(tmp_path):
    venv = tmp_path / "env"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "_calc.pth").write_text("/elsewhere/checkout\n")
    with pytest.raises(check_settings.OutsidePointer, match="points at code outside"):
        check_settings.fingerprint(tmp_path)


def test_the_scan_finds_what_it_should_and_nothing_else(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "conftest.py").write_text("")
    (tmp_path / "bin").mkdir()
    shim = tmp_path / "bin" / "pytest"
    shim.write_text("#!/bin/sh\nexit 0\n")
    shim.chmod(0o755)
    (tmp_path / "bin" / "notes.txt").write_text("")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no test settings
    (tmp_path / "app.py").write_text("")
    found = check_settings.scan(tmp_path)
    assert sorted(found) == ["bin/pytest", "pkg/conftest.py"]
