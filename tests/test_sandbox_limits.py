"""Hard limits on real hostile commands: fork bombs, huge allocations, output floods, escapes.

Each one must end with the caller healthy, the command reported clearly and no process of it
left on the machine. The limits are set small where the default would only make the test slow
(the defaults are checked by the 20 GB allocation).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.sandbox import Workspace, describe_isolation, isolation_available, run_command, spawner
from agents.sandbox.limits import (
    CgroupSupport,
    Limits,
    MiB,
    cgroup_support,
    cleanup_stale_cgroups,
)
from tests.sandboxing import (
    gone_within,
    host_folder,
    kill_all_with,
    live_processes_with,
    load_average,
    marker,
    remove_folder,
)

pytestmark = pytest.mark.no_services

BWRAP = isolation_available() == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap is not usable here")
ISOLATIONS = ["subprocess", pytest.param("bwrap", marks=needs_bwrap)]
SUPPORT = cgroup_support()
needs_memory_cgroup = pytest.mark.skipif(SUPPORT.memory is None, reason="no memory cgroup here")
needs_pids_cgroup = pytest.mark.skipif(SUPPORT.pids is None, reason="no pids cgroup here")
needs_cgroup = pytest.mark.skipif(not SUPPORT.hierarchies(), reason="no usable cgroup here")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws() -> Iterator[Workspace]:
    folder = host_folder("shiftlog-limits-")
    try:
        yield Workspace(folder / "ws")
    finally:
        remove_folder(folder)


@pytest.fixture(params=ISOLATIONS)
def isolation(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def mark() -> Iterator[str]:
    text = marker()
    yield text
    kill_all_with(text)


def our_cgroups() -> list[Path]:
    """Command cgroups of this process that still exist once the idle slots are given up (their
    fork servers stopped, their folders removed without killing anything): a folder left holds a
    process some command left behind."""
    spawner.POOL.drain()
    prefix = f"cmd-{os.getpid()}-"
    found = []
    for hierarchy in SUPPORT.hierarchies():
        found += [p for p in hierarchy.base.iterdir() if p.name.startswith(prefix)]
    return found


def healthy(ws: Workspace, isolation: str) -> None:
    """The caller and the machine can still run a command at once."""
    started = time.monotonic()
    result = run_command("echo ok", workspace=ws, isolation=isolation, timeout=30)
    # Bounds here are loose on purpose (the machine may be busy with other tests): they tell
    # "ends" from "hangs", they do not time anything.
    assert result.output == "ok\n" and time.monotonic() - started < 15
    assert result.exceeded == []  # what bit the command before is not this one's
    assert our_cgroups() == []


def report(what: str, started: float, result) -> None:
    print(
        f"\n{what}: {time.monotonic() - started:.2f} s, exit {result.exit_code}, "
        f"timed out {result.timed_out}, exceeded {result.exceeded}, note {result.note!r}, "
        f"load {load_average():.2f}"
    )


# --- what the machine offers ---------------------------------------------------------------------
def test_describe_isolation_reports_every_mechanism() -> None:
    info = describe_isolation()
    assert info["isolation"] == isolation_available()
    assert info["bwrap"] == BWRAP
    assert info["bwrap_problem"] == ("" if BWRAP else info["bwrap_problem"]) and (
        BWRAP or info["bwrap_problem"]
    )
    limits = info["limits"]
    assert set(limits) >= {"memory", "processes", "cpu", "file_size", "open_files", "kill"}
    assert limits["memory"] in ("cgroup-v1", "cgroup-v2", "rlimit-as")
    assert limits["memory"].startswith("cgroup") == (SUPPORT.memory is not None)
    assert limits["processes"].startswith("cgroup") == (SUPPORT.pids is not None)
    assert info["egress"] in ("proxy", "unavailable")


def test_result_says_which_mechanism_applied(ws: Workspace, isolation: str) -> None:
    result = run_command("true", workspace=ws, isolation=isolation)
    assert result.limits["cpu"] == "rlimit"
    assert result.limits["memory"] == describe_isolation()["limits"]["memory"]
    assert result.limits["network"] == ("none" if isolation == "bwrap" else "host")
    assert result.exceeded == [] and result.note == ""
    assert our_cgroups() == []  # removed after the command


def test_rlimits_are_applied(ws: Workspace, isolation: str) -> None:
    limits = Limits(cpu_seconds=77, file_size=3 * MiB, open_files=99, address_space_bytes=None)
    result = run_command(
        "ulimit -t; ulimit -f; ulimit -n; ulimit -c",
        workspace=ws,
        isolation=isolation,
        limits=limits,
    )
    # dash (/bin/sh) counts ulimit -f in 512-byte blocks.
    assert result.output.split() == ["77", "6144", "99", "0"], result.output


# --- memory --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_20_gb_allocation_fails_fast_with_the_default_limits(
    ws: Workspace, isolation: str
) -> None:
    started = time.monotonic()
    result = run_command(
        'python3 -c "x = bytearray(20 * 1024**3)"', workspace=ws, isolation=isolation, timeout=60
    )
    report("20 GB allocation", started, result)
    assert time.monotonic() - started < 30
    assert result.exit_code not in (0, None)
    # Refused at once by the address-space limit (16 GiB) or killed at the cgroup's 2 GiB.
    assert "MemoryError" in result.output or result.exceeded == ["memory"], result.output
    healthy(ws, isolation)


@needs_memory_cgroup
@pytest.mark.slow
def test_the_memory_cgroup_kills_a_command_over_its_limit(ws: Workspace, isolation: str) -> None:
    limits = Limits(memory_bytes=256 * MiB)
    started = time.monotonic()
    # 1 GiB touched page by page: under the address-space limit, over the cgroup's.
    result = run_command(
        'python3 -c "x = bytearray(1024**3)"; echo "python exited $?"',
        workspace=ws,
        isolation=isolation,
        limits=limits,
        timeout=60,
    )
    report("1 GiB over a 256 MiB cgroup", started, result)
    assert time.monotonic() - started < 30
    assert result.limits["memory"].startswith("cgroup")
    assert "python exited 137" in result.output  # SIGKILL from the OOM killer
    assert result.exceeded == ["memory"]
    assert result.note == "killed: out of memory (limit 256 MiB)"
    # Positive control: the same program under the limit runs.
    ok = run_command(
        'python3 -c "x = bytearray(64 * 1024**2)"', workspace=ws, isolation=isolation, limits=limits
    )
    assert ok.exit_code == 0 and ok.exceeded == [], ok.output
    healthy(ws, isolation)


def test_without_a_cgroup_memory_falls_back_to_the_address_space(
    ws: Workspace, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agents.sandbox.bash.cgroup_support", lambda: CgroupSupport())
    limits = Limits(memory_bytes=256 * MiB)
    result = run_command(
        'python3 -c "x = bytearray(1024**3)"', workspace=ws, isolation=isolation, limits=limits
    )
    assert result.limits["memory"] == "rlimit-as"
    assert result.exit_code == 1 and "MemoryError" in result.output, result.output
    ok = run_command(
        'python3 -c "x = bytearray(64 * 1024**2)"', workspace=ws, isolation=isolation, limits=limits
    )
    assert ok.exit_code == 0, ok.output


# --- processes -----------------------------------------------------------------------------------
@needs_pids_cgroup
@pytest.mark.slow
def test_a_shell_fork_bomb_ends_the_command_not_the_machine(
    ws: Workspace, isolation: str, mark: str
) -> None:
    limits = Limits(processes=64)
    started = time.monotonic()
    # The bomb's first shell returns at once and leaves its children forking in the
    # background; the command waits a little so they reach the limit before it ends.
    result = run_command(
        f"bash -c ':(){{ :|:& }};:' bomb-{mark}; sleep 2; echo bomb returned",
        workspace=ws,
        isolation=isolation,
        limits=limits,
        timeout=30,
    )
    report("shell fork bomb", started, result)
    assert time.monotonic() - started < 30
    assert "processes" in result.exceeded
    assert "process limit reached (64 processes)" in result.note
    assert gone_within(f"bomb-{mark}", 5.0), "fork bomb processes left behind"
    healthy(ws, isolation)


@needs_pids_cgroup
@pytest.mark.slow
def test_a_python_fork_loop_is_held_at_the_limit_and_killed(
    ws: Workspace, isolation: str, mark: str
) -> None:
    (ws.path / "forkloop.py").write_text(
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    started = time.monotonic()
    result = run_command(
        f"python3 forkloop.py forkloop-{mark}",
        workspace=ws,
        isolation=isolation,
        limits=Limits(processes=48),
        timeout=3,
    )
    report("python fork loop", started, result)
    assert result.timed_out and time.monotonic() - started < 20
    assert "processes" in result.exceeded
    assert gone_within(f"forkloop-{mark}", 5.0)
    healthy(ws, isolation)


# --- output --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("flood", ["head -c 1G /dev/zero", "yes | head -c 1G"])
def test_a_1_gb_output_flood_is_capped(ws: Workspace, isolation: str, flood: str) -> None:
    started = time.monotonic()
    result = run_command(
        f"{flood}; echo; echo END", workspace=ws, isolation=isolation, timeout=60, output_limit=4000
    )
    report(f"1 GB flood ({flood})", started, result)
    assert result.exit_code == 0
    assert result.truncated and len(result.output) < 4100
    assert result.output.endswith("END\n") and "bytes cut" in result.output
    healthy(ws, isolation)


def test_output_past_the_file_size_limit_stops_the_command(ws: Workspace, isolation: str) -> None:
    result = run_command(
        "head -c 3M /dev/zero", workspace=ws, isolation=isolation, limits=Limits(file_size=1 * MiB)
    )
    assert result.exit_code == 128 + signal.SIGXFSZ
    assert result.exceeded == ["file_size"] and "file size limit (1 MiB)" in result.note
    assert result.truncated  # what was written before is still read


def test_cpu_time_limit(ws: Workspace, isolation: str) -> None:
    started = time.monotonic()
    result = run_command(
        "python3 -c 'while True: pass'",
        workspace=ws,
        isolation=isolation,
        limits=Limits(cpu_seconds=1),
        timeout=40,
    )
    assert time.monotonic() - started < 20
    assert result.exit_code == 128 + signal.SIGXCPU
    assert result.exceeded == ["cpu"] and "CPU time limit (1 s)" in result.note


# --- nothing left behind -------------------------------------------------------------------------
ESCAPES = {
    "nohup": "nohup sleep {n} > /dev/null 2>&1 &",
    "setsid": "setsid sleep {n} > /dev/null 2>&1 &",
    "subshell": "( sleep {n} > /dev/null 2>&1 & )",
    "double fork": (
        "python3 -c 'import os, sys\n"
        "if os.fork(): sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): sys.exit(0)\n"
        'os.execvp("sleep", ["sleep", sys.argv[1]])\' {n}'
    ),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_background_processes_do_not_outlive_the_call(
    ws: Workspace, isolation: str, mark: str, escape: str
) -> None:
    command = ESCAPES[escape].format(n=mark) + "\nsleep 0.3; echo started"
    result = run_command(command, workspace=ws, isolation=isolation, timeout=20)
    assert result.exit_code == 0 and result.output.endswith("started\n"), result.output
    # Gone when the call returns, not some time later.
    assert live_processes_with(f"sleep {mark}") == []
    assert our_cgroups() == []
    # Positive control: the same line outside run_command leaves a process behind.
    subprocess.run(
        ["/bin/sh", "-c", ESCAPES[escape].format(n=mark)],
        env={"PATH": f"{sys.base_prefix}/bin:/usr/bin:/bin"},
        timeout=20,
        check=True,
    )
    deadline = time.monotonic() + 5
    while not live_processes_with(f"sleep {mark}", exact=True):
        assert time.monotonic() < deadline, "the escape did not start its sleep"
        time.sleep(0.02)
    time.sleep(0.5)
    assert live_processes_with(f"sleep {mark}", exact=True), "it did not outlive its shell"
    kill_all_with(f"sleep {mark}")


WORKER = """
import sys
from agents.sandbox import Workspace, run_command
ws, isolation, command = sys.argv[1:4]
run_command(command, workspace=Workspace(ws), isolation=isolation, timeout=120)
"""


@pytest.mark.slow
def test_a_killed_worker_leaves_no_process_behind(ws: Workspace, isolation: str, mark: str) -> None:
    n = mark
    command = (
        f"nohup sleep {n} > /dev/null 2>&1 & setsid sleep {n} > /dev/null 2>&1 & "
        f"( sleep {n} > /dev/null 2>&1 & ); sleep {n}"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(ws.path), isolation, command],
        cwd=REPO,
        env={"PATH": os.environ["PATH"]},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while len(sleeps := live_processes_with(f"sleep {n}", exact=True)) < 4:
            assert time.monotonic() < deadline, sleeps
            time.sleep(0.05)
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, as the OOM killer would
        worker.wait(10)
        started = time.monotonic()
        if isolation == "bwrap":
            # Its PID namespace dies with it: bwrap dies with its parent, and with bwrap all.
            assert gone_within(f"sleep {n}", 5.0), live_processes_with(f"sleep {n}")
        else:
            # The shell dies with the worker (PDEATHSIG); what it put in the background lives on
            # in its cgroup until the next command (any worker's) cleans stale cgroups up.
            if not SUPPORT.hierarchies():
                pytest.skip("no cgroup: a plain subprocess's escaped children outlive the worker")
            assert cleanup_stale_cgroups() >= 1
            assert gone_within(f"sleep {n}", 5.0), live_processes_with(f"sleep {n}")
        print(f"\nkilled worker ({isolation}): all gone after {time.monotonic() - started:.2f} s")
        stale = [
            p
            for h in SUPPORT.hierarchies()
            for p in h.base.iterdir()
            if p.name.startswith(f"cmd-{worker.pid}-")
        ]
        if isolation == "bwrap":
            cleanup_stale_cgroups()  # the worker could not remove its cgroups: the next one does
        assert [p for p in stale if p.exists()] == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@needs_cgroup
def test_stale_cgroups_are_found_by_name_and_removed(mark: str) -> None:
    sleeper = subprocess.Popen(["sleep", mark])
    live: list[Path] = []
    try:
        made = []
        for hierarchy in SUPPORT.hierarchies():
            folder = hierarchy.base / "cmd-999999999-1-1"  # no such worker
            folder.mkdir()
            (folder / "cgroup.procs").write_text(str(sleeper.pid))
            made.append(folder)
        # A folder named like one of this (live) process's is left alone, even when empty.
        own_start = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
        live = [h.base / f"cmd-{os.getpid()}-{own_start}-999999" for h in SUPPORT.hierarchies()]
        for folder in live:
            folder.mkdir()
        # Ours, and any another test run's dead worker left; a reaper of another test run on
        # this machine may also have taken some of ours first (found in CI): what counts is
        # that none is left and the process in them was killed.
        removed = cleanup_stale_cgroups()
        assert removed >= 0 and not any(folder.exists() for folder in made)
        assert sleeper.wait(5) == -signal.SIGKILL
        assert not any(folder.exists() for folder in made)
        assert all(folder.exists() for folder in live)
    finally:
        for folder in live:
            folder.rmdir()
        if sleeper.poll() is None:
            sleeper.kill()


def test_the_bash_tool_passes_limits_on_and_reports_what_bit(ws: Workspace) -> None:
    from agents.sandbox import execute

    result = execute(
        ws,
        "bash",
        {"command": "head -c 3M /dev/zero > big"},
        limits=Limits(file_size=1 * MiB),
        isolation="subprocess",
    )
    assert result.is_error
    assert result.output.endswith("[exit code 153; file size limit (1 MiB) reached]")
    assert result.data["exceeded"] == ["file_size"]
    assert result.data["limits"]["file_size"] == "rlimit"


@needs_cgroup
def test_commands_start_inside_a_slot_kept_for_them(ws: Workspace, isolation: str) -> None:
    """The command is forked inside cgroups made once (spawner.py), not moved into new ones per
    command: a second command runs in the first one's cgroups (named as per-command ones, so
    stale cleanup finds them), and between commands they hold the slot's fork server only."""
    spawner.POOL.drain()

    def folders() -> list[Path]:
        return sorted(p for h in SUPPORT.hierarchies() for p in h.base.glob(f"cmd-{os.getpid()}-*"))

    def held(folder: Path) -> set[int]:
        return {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}

    assert run_command("true", workspace=ws, isolation=isolation).exit_code == 0
    slot = folders()
    assert slot, "the slot's cgroups were removed after the command"
    server = set.union(*(held(f) for f in slot))
    assert len(server) == 1 and spawner.MARK in Path(f"/proc/{min(server)}/cmdline").read_text()
    results = []
    second = threading.Thread(
        target=lambda: results.append(run_command("sleep 2", workspace=ws, isolation=isolation))
    )
    second.start()
    try:
        deadline = time.monotonic() + 20
        while not all(held(f) - server for f in slot):  # the command's processes, inside
            assert second.is_alive() and time.monotonic() < deadline, "not run in the slot"
            time.sleep(0.01)
    finally:
        second.join(60)
    assert results[0].exit_code == 0
    assert folders() == slot and set.union(*(held(f) for f in slot)) == server
    assert our_cgroups() == []  # given up: the server stopped, the folders removed


@needs_cgroup
@needs_bwrap
@pytest.mark.parametrize("etc", ["copied", "bound entry by entry"])
def test_a_command_finds_its_user_database_whatever_numbers_the_worker_gave_its_fds(
    ws: Workspace, etc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a busy worker the pipes holding the sandbox's /etc/passwd and /etc/group get numbers
    above 200, where the fork server used to park its own copies: a copy landed on its target
    and kept close-on-exec, and bwrap failed ("Can't write data to file /etc/passwd: Bad file
    descriptor"), failing a run's done-conditions for nothing (seen with 300 runs at once).
    The pipes are used where there is no copy of /etc (view.etc_copy)."""
    if etc != "copied":
        monkeypatch.setattr("agents.sandbox.view.etc_copy", lambda *args: None)
    spawner.POOL.drain()
    held = []
    try:
        while True:  # take every number below 201: the user database's pipes get 201 and 202
            fd = os.open("/dev/null", os.O_RDONLY)
            if fd >= 200:
                held.append(fd)
                break
            held.append(fd)
        result = run_command(
            "cat /etc/passwd /etc/group", workspace=ws, isolation="bwrap", timeout=30
        )
    finally:
        for fd in held:
            os.close(fd)
    assert result.exit_code == 0, result.output
    assert "agent:x:" in result.output and "nogroup:x:" in result.output


@pytest.mark.parametrize("etc", ["copied", "bound entry by entry"])
def test_a_command_holds_no_descriptor_but_its_own(
    ws: Workspace, isolation: str, etc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only stdin, stdout and stderr reach the command: never the fork server's socket (through
    which it could ask for commands outside the sandbox), nor a descriptor passed to the server
    for bubblewrap (the user database's pipes), nor one of the worker's."""
    if etc != "copied":
        monkeypatch.setattr("agents.sandbox.view.etc_copy", lambda *args: None)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    held = os.open("/dev/null", os.O_RDONLY)  # inheritable in the worker: still not passed on
    os.set_inheritable(held, True)
    try:
        # (No pipe: the shell holds a pipeline's ends for a moment while it starts its parts.)
        result = run_command("ls /proc/$$/fd; id -un", workspace=ws, isolation=isolation)
        again = run_command("ls /proc/$$/fd", workspace=ws, isolation=isolation)
    finally:
        os.close(held)
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["0", "1", "2", "agent" if isolation == "bwrap" else user]
    assert again.output.split() == ["0", "1", "2"]  # (a second command, from the same server)


@needs_cgroup
def test_a_fork_server_keeps_nothing_of_a_workspace_open(ws: Workspace, isolation: str) -> None:
    """Between commands the slot's server holds no folder of theirs: a server left in a
    workspace pinned it after it was deleted, so a change feed's watch on it never heard of the
    deletion and took a new workspace at the same path for the old one (checkpoints saw no
    change)."""
    spawner.POOL.drain()
    assert run_command("true", workspace=ws, isolation=isolation).exit_code == 0
    servers = [slot.spare for idle in spawner.POOL._idle.values() for slot in idle]
    assert servers and None not in servers
    for pid in servers:
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
