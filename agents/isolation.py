"""How a run's commands are contained on this worker: which isolation, which limits, which
toolchain, and whether a run may start here at all.

Bubblewrap is the wall (agents/sandbox/view.py): the command sees its workspace and the toolchain,
nothing of the supervisor. Where bubblewrap cannot run, commands would run as plain subprocesses
with the worker's reach, so a run does not start there unless the operator opted in with
SHIFTLOG_ALLOW_UNISOLATED=1; such runs say so (a `run.isolation` event, a red badge everywhere).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from agents import sandbox
from agents.models import Run

MIB = 1024 * 1024
# The limits a run can set, with what each means, in the order the CLI and the page show them.
LIMIT_NAMES = {
    "memory_mb": "memory per command (MB)",
    "processes": "processes per command",
    "cpu_seconds": "CPU seconds per process",
    "workspace_mb": "workspace size (MB), watched while commands run and at every checkpoint",
}


def isolation() -> str:
    """The isolation this worker gives commands: forced by SHIFTLOG_ISOLATION, else the best."""
    return settings.SHIFTLOG["ISOLATION"] or sandbox.isolation_available()


def refusal() -> str:
    """Why no run may start on this worker ("" when runs may)."""
    if isolation() == "bwrap" or settings.SHIFTLOG["ALLOW_UNISOLATED"]:
        return ""
    if settings.SHIFTLOG["ISOLATION"] == "subprocess":
        why = "SHIFTLOG_ISOLATION=subprocess asks for no sandbox"
    else:
        why = sandbox.describe_isolation().get("bwrap_problem") or "bubblewrap does not run here"
    return (
        f"commands cannot be isolated on this worker ({why}): install bubblewrap, or set "
        "SHIFTLOG_ALLOW_UNISOLATED=1 to let runs' commands run with the worker's own reach"
    )


def default_limits() -> dict[str, int]:
    config = settings.SHIFTLOG
    return {name: int(config["LIMITS"][name]) for name in LIMIT_NAMES}


def limits_for(run: Run) -> sandbox.Limits:
    """The sandbox's per-command limits for a run (its own, else today's defaults)."""
    values = {**default_limits(), **(run.limits or {})}
    return sandbox.Limits(
        memory_bytes=values["memory_mb"] * MIB,
        processes=values["processes"],
        cpu_seconds=values["cpu_seconds"],
        workspace_bytes=values["workspace_mb"] * MIB or None,
        min_free_bytes=int(settings.SHIFTLOG["MIN_FREE_MB"]) * MIB or None,
    )


def workspace_cap(run: Run) -> int:
    """The most bytes the run's workspace may hold (0: no cap)."""
    return int({**default_limits(), **(run.limits or {})}["workspace_mb"]) * MIB


def upload_cap(run: Run | None) -> int:
    """The most bytes an uploaded .tar.gz of the run's workspace may be: its workspace cap, with
    room for the archive's headers, under SHIFTLOG_API_MAX_UPLOAD_MB."""
    cap = settings.SHIFTLOG["API_MAX_UPLOAD_MB"] * MIB
    run_cap = workspace_cap(run) if run is not None else 0
    if run_cap:
        cap = min(cap, run_cap + run_cap // 16 + MIB)
    return cap


def toolchain_for(run: Run) -> list[str] | None:
    """The folders the run's commands get (None: the sandbox's default, the base interpreter)."""
    return list(run.toolchain) or None


def describe() -> dict[str, Any]:
    """What /readyz reports: the isolation runs get here, and whether they may start."""
    return {
        **sandbox.describe_isolation(),
        "isolation": isolation(),
        "allow_unisolated": settings.SHIFTLOG["ALLOW_UNISOLATED"],
        "runs_may_start": not refusal(),
    }


# --- the environment checks run in ----------------------------------------------------------
class EnvironmentProblem(ValueError):
    """The environment named for a run cannot be used or built; the message says why."""


def interpreter_folders(path: str | Path) -> list[str]:
    """The read-only folders for an interpreter or a virtualenv: a venv's own folder plus its
    base interpreter's prefix (the sandbox adds that from pyvenv.cfg), an interpreter's prefix."""
    target = Path(path).expanduser()
    if not target.exists():
        raise EnvironmentProblem(f"{target} does not exist")
    if target.is_dir():
        if not (target / "bin").is_dir():
            raise EnvironmentProblem(f"{target} has no bin/ folder: not an interpreter or a venv")
        folder = target.resolve()
    elif target.is_file() and shutil.which(str(target)):
        folder = target.resolve().parent.parent  # .../bin/python3 -> ...: its prefix
    else:
        raise EnvironmentProblem(f"{target} is not an executable interpreter")
    # The folder is shown to the agent's commands: never one that holds the supervisor.
    data = Path(settings.DATA_DIR).resolve()
    if folder == Path("/") or folder == data or folder in data.parents or data in folder.parents:
        raise EnvironmentProblem(
            f"{folder} holds (or is inside) Shiftlog's data folder: the run's commands would see it"
        )
    return [str(folder)]


def build_venv(requirements: str | Path, where: Path) -> list[str]:
    """A virtualenv at `where` with the project's requirements installed, outside the agent's
    write reach (the sandbox binds it read-only)."""
    requirements = Path(requirements)
    if not requirements.is_file():
        raise EnvironmentProblem(f"{requirements} is not a requirements file")
    base = _base_python()
    steps = [
        [base, "-m", "venv", str(where)],
        [str(where / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(requirements)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            shutil.rmtree(where, ignore_errors=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise EnvironmentProblem(
                f"building the check environment failed ({' '.join(step[:3])}): " + " / ".join(tail)
            )
    return [str(where)]


@cache
def _base_python() -> str:
    """The interpreter Shiftlog runs on, not its virtualenv: the base of a run's venv."""
    return str(Path(sys.base_prefix) / "bin" / "python3")
