"""Running an agent's shell commands: confined to the workspace, time-boxed, output-capped."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from agents.sandbox.workspace import Workspace

ISOLATIONS = ("bwrap", "subprocess")

# Big enough for builds and test runs, small enough that a runaway loop cannot fill the disk.
MAX_FILE_SIZE = 2 * 1024**3
MAX_OPEN_FILES = 1024


@dataclass
class CommandResult:
    exit_code: int | None  # None when we killed it (timeout or cancel)
    output: str  # stdout and stderr interleaved, capped
    timed_out: bool
    cancelled: bool
    truncated: bool
    duration_ms: float
    isolation: str  # "bwrap" or "subprocess"


@functools.cache
def _bwrap_binary() -> str | None:
    binary = shutil.which("bwrap")
    if binary is None:
        return None
    # Probe with the same namespaces and mounts a real run uses: in some containers
    # a plain bind works while --unshare-all or --proc do not, and then every
    # command would fail instead of falling back.
    probe = [
        binary,
        *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"),
        *("--unshare-all", "--die-with-parent", "true"),
    ]
    try:
        done = subprocess.run(
            probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env={}
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return binary if done.returncode == 0 else None


def isolation_available() -> str:
    """ "bwrap" if bubblewrap works on this machine, else "subprocess". Probed once per process."""
    return "bwrap" if _bwrap_binary() else "subprocess"


def command_env(workspace: Workspace, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment a command gets. Built from scratch so no secret of ours leaks in."""
    env = {
        "PATH": os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workspace.path),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra_env or {})
    return env


def _argv(command: str, workspace: Workspace, env: dict[str, str], isolation: str) -> list[str]:
    if isolation == "subprocess":
        return ["/bin/sh", "-c", command]
    ws = str(workspace.path)
    argv = [
        _bwrap_binary() or "bwrap",
        *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"),
        # After --tmpfs /tmp, so a Python or a workspace that lives under /tmp is not hidden.
        *_python_binds(),
        *("--bind", ws, ws, "--chdir", ws),
        *("--unshare-all", "--die-with-parent", "--clearenv"),
    ]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return [*argv, "/bin/sh", "-c", command]


def _python_binds() -> list[str]:
    """Read-only binds for the running Python's folders that /tmp's tmpfs would hide (a checkout
    or virtualenv under /tmp): tools are promised the venv's python on PATH."""
    folders = {os.path.dirname(sys.executable), sys.prefix, sys.base_prefix}
    binds: list[str] = []
    for folder in sorted(f for f in folders if f == "/tmp" or f.startswith("/tmp/")):
        if os.path.isdir(folder):
            binds += ["--ro-bind", folder, folder]
        real = os.path.realpath(folder)
        if real != folder and (real.startswith("/tmp/")) and os.path.isdir(real):
            binds += ["--ro-bind", real, real]
    return binds


def _limit(which: int, value: int) -> None:
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux
    _libc = None


def _set_limits(parent: int) -> None:
    # Runs in the child between fork and exec: keep it to plain system calls.
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, MAX_FILE_SIZE)
    _limit(resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
    # Die with the worker, as bwrap's --die-with-parent does: a killed worker's command must
    # not go on changing the workspace while the next worker drives the run ...
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # ... also when the worker died between the fork and the prctl.
        if os.getppid() != parent:
            os._exit(137)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


def read_capped(file: BinaryIO, limit: int) -> tuple[str, bool]:
    """The file's text, or its head and tail around a marker line if it is over `limit` bytes."""
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(0)
    if size <= limit:
        return file.read().decode("utf-8", errors="replace"), False
    head = file.read(limit // 2)
    file.seek(size - (limit - len(head)))
    tail = file.read()
    # Cut at line ends when that costs less than half of each part, so the model
    # does not see half a line on either side of the marker.
    newline = head.rfind(b"\n")
    if newline >= len(head) // 2:
        head = head[: newline + 1]
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) // 2:
        tail = tail[newline + 1 :]
    text = head.decode("utf-8", errors="replace")
    if not text.endswith("\n"):
        text += "\n"
    cut = size - len(head) - len(tail)
    return text + f"[... {cut} bytes cut ...]\n" + tail.decode("utf-8", errors="replace"), True


def run_command(
    command: str,
    *,
    workspace: Workspace,
    timeout: float = 120.0,
    output_limit: int = 30_000,
    should_stop: Callable[[], bool] | None = None,
    extra_env: dict[str, str] | None = None,
    isolation: str | None = None,
    poll_interval: float = 0.2,
) -> CommandResult:
    """Run `command` with sh in the workspace and wait for it, at most `timeout` seconds.

    The command runs in its own process group; on timeout or when `should_stop()`
    turns true the whole group is killed, and it is killed after a normal exit too,
    so no background process outlives the call.
    """
    if isolation is None:
        isolation = isolation_available()
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown isolation {isolation!r}; expected one of {ISOLATIONS}")
    if isolation == "bwrap" and not _bwrap_binary():
        raise ValueError("isolation 'bwrap' asked for, but bwrap does not work on this machine")

    env = command_env(workspace, extra_env)
    argv = _argv(command, workspace, env, isolation)
    timed_out = cancelled = False
    started = time.monotonic()
    deadline = started + timeout

    # A file, not a pipe: a command printing gigabytes cannot block on a full pipe,
    # and we only ever read its head and tail.
    with tempfile.TemporaryFile(prefix="shiftlog-cmd-") as out:
        proc = subprocess.Popen(
            argv,
            cwd=workspace.path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(_set_limits, os.getpid()),
        )
        try:
            while proc.poll() is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                try:
                    proc.wait(timeout=min(poll_interval, remaining))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if should_stop is not None and should_stop():
                    cancelled = True
                    break
        finally:
            # Also on a normal exit (background children) and on any exception in
            # should_stop or from a KeyboardInterrupt.
            _kill_group(proc.pid)
            proc.wait()
        duration_ms = (time.monotonic() - started) * 1000
        output, truncated = read_capped(out, output_limit)

    exit_code: int | None = None
    if not (timed_out or cancelled):
        # Report death by signal the way a shell would (128 + signal number).
        exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return CommandResult(
        exit_code=exit_code,
        output=output,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated=truncated,
        duration_ms=duration_ms,
        isolation=isolation,
    )
