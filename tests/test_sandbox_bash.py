"""run_command on real processes: output, limits, timeouts, cancellation, env and isolation."""

from __future__ import annotations

import os
import random
import re
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.sandbox import Workspace, isolation_available, run_command

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer

BWRAP = isolation_available() == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap is not usable here")
# The subprocess path always runs; the bwrap path too wherever bubblewrap works.
ISOLATIONS = ["subprocess", pytest.param("bwrap", marks=needs_bwrap)]


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture(params=ISOLATIONS)
def isolation(request: pytest.FixtureRequest) -> str:
    return request.param


def _live_processes_with(marker: str) -> list[int]:
    """Host pids of processes (not zombies) whose command line contains marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        # Arguments in cmdline are NUL-separated.
        if marker.encode().replace(b" ", b"\0") in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _gone_soon(marker: str, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _live_processes_with(marker):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def sleep_marker() -> Iterator[str]:
    """A `sleep N` with an N no other process uses, so we can look for it in /proc."""
    marker = f"sleep {random.randint(10**8, 10**9)}"
    yield marker
    for pid in _live_processes_with(marker):  # never leave one behind if a test fails
        os.kill(pid, 9)


def test_isolation_available_is_stable() -> None:
    assert isolation_available() in ("bwrap", "subprocess")
    assert isolation_available() == isolation_available()


def test_runs_in_workspace_and_interleaves_output(ws: Workspace, isolation: str) -> None:
    result = run_command(
        "pwd; echo out; echo err >&2; echo out2 > made.txt; echo done",
        workspace=ws,
        isolation=isolation,
    )
    assert result.exit_code == 0
    assert result.output == f"{ws.path}\nout\nerr\ndone\n"
    assert (ws.path / "made.txt").read_text() == "out2\n"
    assert result.isolation == isolation
    assert not (result.timed_out or result.cancelled or result.truncated)
    assert result.duration_ms > 0


def test_exit_codes(ws: Workspace, isolation: str) -> None:
    assert run_command("exit 3", workspace=ws, isolation=isolation).exit_code == 3
    # Death by signal is reported the way a shell does: 128 + 9.
    assert run_command("kill -9 $$", workspace=ws, isolation=isolation).exit_code == 137


def test_stdin_is_empty(ws: Workspace, isolation: str) -> None:
    result = run_command("cat; echo after", workspace=ws, isolation=isolation, timeout=5)
    assert result.output == "after\n"


def test_python_on_path_is_the_base_interpreter_not_shiftlogs_venv(
    ws: Workspace, isolation: str
) -> None:
    result = run_command(
        "python3 -c 'import sys; print(sys.prefix)'", workspace=ws, isolation=isolation
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == sys.base_prefix
    if sys.prefix != sys.base_prefix:  # the tests run in a venv: it must not be the one found
        assert result.output.strip() != sys.prefix


def test_environment_is_built_from_scratch(
    ws: Workspace, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "SECRET_KEY", "DATABASE_URL", "REDIS_URL"):
        monkeypatch.setenv(name, f"leaked-{name}")
    result = run_command("env", workspace=ws, isolation=isolation, extra_env={"TASK_ID": "t-42"})
    env = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    assert "leaked" not in result.output
    for name in ("ANTHROPIC_API_KEY", "SECRET_KEY", "DATABASE_URL", "REDIS_URL"):
        assert name not in env
    # A private, empty HOME under bubblewrap; the workspace for a plain subprocess.
    assert env["HOME"] == ("/home/agent" if isolation == "bwrap" else str(ws.path))
    assert env["PATH"].endswith(":/usr/local/bin:/usr/bin:/bin")
    assert env["LANG"] == "C.UTF-8"
    assert env["TERM"] == "dumb"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["TASK_ID"] == "t-42"


def test_resource_limits(ws: Workspace, isolation: str) -> None:
    result = run_command("ulimit -c; ulimit -n", workspace=ws, isolation=isolation)
    core, files = result.output.split()
    assert core == "0"
    assert int(files) <= 1024


def test_timeout_kills_the_whole_group(ws: Workspace, isolation: str, sleep_marker: str) -> None:
    started = time.monotonic()
    result = run_command(
        f"{sleep_marker} & echo started; wait", workspace=ws, isolation=isolation, timeout=1
    )
    assert time.monotonic() - started < 10  # the 1 s timeout, not the sleep, ended it
    assert result.timed_out
    assert result.exit_code is None
    assert not result.cancelled
    assert result.output == "started\n"
    assert _gone_soon(sleep_marker), "the background child survived the timeout"


def test_background_child_does_not_outlive_a_normal_exit(
    ws: Workspace, isolation: str, sleep_marker: str
) -> None:
    result = run_command(f"{sleep_marker} > /dev/null 2>&1 &", workspace=ws, isolation=isolation)
    assert result.exit_code == 0
    assert _gone_soon(sleep_marker)


def test_should_stop_cancels(ws: Workspace, isolation: str, sleep_marker: str) -> None:
    calls = []

    def should_stop() -> bool:
        calls.append(time.monotonic())
        return len(calls) >= 3

    started = time.monotonic()
    result = run_command(
        f"{sleep_marker} & wait",
        workspace=ws,
        isolation=isolation,
        timeout=30,
        should_stop=should_stop,
        poll_interval=0.05,
    )
    assert time.monotonic() - started < 10  # stopped, not the 30 s timeout
    assert result.cancelled
    assert not result.timed_out
    assert result.exit_code is None
    assert len(calls) == 3
    assert _gone_soon(sleep_marker)


def test_error_in_should_stop_still_kills_the_group(ws: Workspace, sleep_marker: str) -> None:
    def should_stop() -> bool:
        raise RuntimeError("database went away")

    with pytest.raises(RuntimeError, match="database went away"):
        run_command(
            f"{sleep_marker} & wait",
            workspace=ws,
            isolation="subprocess",
            should_stop=should_stop,
            poll_interval=0.05,
        )
    assert _gone_soon(sleep_marker)


def test_fast_command_does_not_wait_for_poll_interval(ws: Workspace) -> None:
    result = run_command("true", workspace=ws, isolation="subprocess", poll_interval=5)
    assert result.duration_ms < 2000


def test_output_cap_keeps_head_and_tail(ws: Workspace, isolation: str) -> None:
    full = "".join(f"{n}\n" for n in range(1, 20001))
    result = run_command("seq 1 20000", workspace=ws, isolation=isolation, output_limit=1000)
    assert result.truncated
    match = re.fullmatch(r"(.*\n)\[\.\.\. (\d+) bytes cut \.\.\.\]\n(.*)", result.output, re.S)
    assert match, result.output
    head, cut, tail = match[1], int(match[2]), match[3]
    assert head.startswith("1\n2\n3\n")
    assert tail.endswith("19999\n20000\n")
    # Whole lines on both sides, and the count is exactly what was left out.
    assert full.startswith(head)
    assert full.endswith(tail)
    assert len(head) + cut + len(tail) == len(full)
    assert len(head) + len(tail) <= 1000


def test_huge_output_does_not_block(ws: Workspace) -> None:
    started = time.monotonic()
    result = run_command(
        "head -c 20000000 /dev/zero | tr '\\0' 'a'; echo; echo END",
        workspace=ws,
        isolation="subprocess",
        output_limit=2000,
        timeout=30,
    )
    assert time.monotonic() - started < 15  # loose: it ends, it does not block
    assert result.exit_code == 0
    assert result.truncated
    assert result.output.endswith("END\n")
    assert "bytes cut" in result.output


def test_non_utf8_output_is_replaced_not_fatal(ws: Workspace) -> None:
    result = run_command("printf 'ok \\377\\n'", workspace=ws, isolation="subprocess")
    assert result.output == "ok \ufffd\n"


def test_unknown_isolation_is_rejected(ws: Workspace) -> None:
    with pytest.raises(ValueError, match="isolation"):
        run_command("true", workspace=ws, isolation="docker")


@needs_bwrap
def test_bwrap_has_no_network(ws: Workspace) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    connect = f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\""
    try:
        # The same command reaches the listener without the sandbox, so the test means something.
        assert run_command(connect, workspace=ws, isolation="subprocess").exit_code == 0
        result = run_command(connect, workspace=ws, isolation="bwrap", timeout=5)
    finally:
        server.close()
    assert result.exit_code != 0
    assert "Error" in result.output


@needs_bwrap
def test_bwrap_root_is_read_only(ws: Workspace) -> None:
    target = Path(f"/shiftlog-ro-probe-{uuid.uuid4().hex}")
    result = run_command(f"touch {target}", workspace=ws, isolation="bwrap")
    assert result.exit_code != 0
    assert "Read-only file system" in result.output
    assert not target.exists()


@needs_bwrap
def test_bwrap_workspace_under_tmp_is_writable_and_host_tmp_is_hidden() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        ws = Workspace(Path(tmp) / "ws")
        (Path(tmp) / "host-only.txt").write_text("host")
        result = run_command(
            f"echo kept > out.txt && ls {tmp} && echo --- && ls /tmp",
            workspace=ws,
            isolation="bwrap",
        )
        assert result.exit_code == 0, result.output
        assert (ws.path / "out.txt").read_text() == "kept\n"
        # Only the paths down to the workspace (and to a Python living under /tmp, as in a CI
        # clone there) exist in the sandbox's fresh /tmp.
        inside, _, tmp_entries = result.output.partition("---")
        assert inside.split() == ["ws"]
        python_tops = {
            p.split("/")[2] for p in (sys.executable, sys.prefix) if p.startswith("/tmp/")
        }
        assert set(tmp_entries.split()) <= {Path(tmp).name, *python_tops}
        assert Path(tmp).name in tmp_entries.split()


@pytest.mark.parametrize("with_pidfd", [True, False])
def test_waiting_for_a_command_says_whether_it_exited_with_or_without_a_pidfd(with_pidfd):
    import subprocess

    from agents.sandbox.bash import _pidfd, _wait_for_exit

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    exit_fd = _pidfd(proc.pid) if with_pidfd else None
    assert (exit_fd is not None) == with_pidfd  # Linux 5.3 and later have pidfds
    try:
        assert not _wait_for_exit(proc, exit_fd, 0.05)  # still reading its input
        assert proc.returncode is None
        proc.stdin.close()  # now it ends
        assert _wait_for_exit(proc, exit_fd, 30)
        assert proc.returncode == 0  # reaped: no zombie left behind
    finally:
        if exit_fd is not None:
            os.close(exit_fd)
        proc.kill()
        proc.wait()
