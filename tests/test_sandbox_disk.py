"""A run's workspace cap and the host's free-space floor hold while a command runs
(agents/sandbox/diskwatch.py), not only at checkpoints: a command writing past either is killed
near it, and the result says why. Real commands, real files, in both isolations."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agents.sandbox import Workspace, isolation_available, run_command
from agents.sandbox.diskwatch import free_bytes, tree_bytes
from agents.sandbox.limits import Limits, MiB
from tests.sandboxing import host_folder, remove_folder

pytestmark = [pytest.mark.no_services, pytest.mark.slow]

BWRAP = isolation_available() == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap is not usable here")
ISOLATIONS = ["subprocess", pytest.param("bwrap", marks=needs_bwrap)]
CAP = 48 * MiB
# What a command may write past the cap before it is stopped: a few looks at the disk at page-cache
# speed, on a machine other work may hold up (the command writes 1.5 GB if nothing stops it).
SLACK = 500 * MiB

ONE_BIG_FILE = "dd if=/dev/zero of=big bs=1M count=1500 status=none; rm -f big; echo finished"
MANY_FILES = (
    "mkdir -p d; for i in $(seq 1 1500); do head -c 1048576 /dev/zero > d/f$i; done; "
    "rm -rf d; echo finished"
)


@pytest.fixture
def ws() -> Iterator[Workspace]:
    folder = host_folder("shiftlog-disk-")
    try:
        yield Workspace(folder / "ws")
    finally:
        remove_folder(folder)


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("command", [ONE_BIG_FILE, MANY_FILES], ids=["one-file", "many-files"])
def test_a_command_writing_past_the_workspace_cap_is_killed_near_it(ws, isolation, command):
    started = time.monotonic()
    result = run_command(
        command,
        workspace=ws,
        isolation=isolation,
        timeout=120,
        limits=Limits(workspace_bytes=CAP, file_size=None),
    )
    assert result.exceeded == ["workspace"], (result.output, result.exceeded)
    assert result.exit_code is None and "finished" not in result.output
    assert "the workspace reached its cap of 48 MiB" in result.note
    assert result.limits["workspace"] == "watch"
    assert tree_bytes(ws.path) < CAP + SLACK  # stopped near the cap, not at 1.5 GB
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_command_under_the_cap_runs_as_before(ws, isolation):
    result = run_command(
        "head -c 8M /dev/zero > f; echo finished",
        workspace=ws,
        isolation=isolation,
        timeout=60,
        limits=Limits(workspace_bytes=CAP, min_free_bytes=1 * MiB),
    )
    assert result.exit_code == 0 and result.output == "finished\n" and result.exceeded == []


def test_a_workspace_over_its_cap_already_may_be_cleaned_but_not_grown(ws):
    (ws.path / "old").write_bytes(b"\0" * (CAP + MiB))
    limits = Limits(workspace_bytes=CAP, file_size=None)
    grow = run_command(
        ONE_BIG_FILE, workspace=ws, isolation="subprocess", timeout=60, limits=limits
    )
    assert grow.exceeded == ["workspace"] and "finished" not in grow.output
    clean = run_command(
        "rm -f old big; echo cleaned",
        workspace=ws,
        isolation="subprocess",
        timeout=60,
        limits=limits,
    )
    assert clean.output == "cleaned\n" and clean.exceeded == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_command_going_below_the_hosts_free_space_floor_is_killed(ws, isolation):
    floor = free_bytes(ws.path) - 64 * MiB  # 64 MiB from the floor
    result = run_command(
        ONE_BIG_FILE,
        workspace=ws,
        isolation=isolation,
        timeout=120,
        limits=Limits(min_free_bytes=floor, file_size=None),
    )
    assert result.exceeded == ["disk_free"], (result.output, result.exceeded)
    assert "finished" not in result.output and "kept for the database" in result.note
    assert tree_bytes(ws.path) < 64 * MiB + SLACK


def test_the_bash_tool_says_why_the_command_was_stopped(ws):
    from agents.sandbox import execute

    result = execute(
        ws,
        "bash",
        {"command": ONE_BIG_FILE},
        limits=Limits(workspace_bytes=CAP, file_size=None),
        isolation="subprocess",
    )
    assert result.is_error and result.data["exceeded"] == ["workspace"]
    assert result.output.endswith(
        "[stopped; killed: the workspace reached its cap of 48 MiB while the command ran "
        "(free space in it, or ask for a bigger cap)]"
    )
