"""Running an agent's shell commands: confined, limited, time-boxed, output-capped.

With bubblewrap ("bwrap") a command sees only the filesystem view.build_view() lists, has no
network (or only the run's egress proxy), runs in its own PID namespace and dies with it. Without
it ("subprocess") it runs as a plain child process in the workspace. Either way it gets the
limits of limits.Limits, and every process it started is killed when the call returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from agents.sandbox import relay, spawner, view
from agents.sandbox.diskwatch import DiskWatch
from agents.sandbox.limits import (
    DEFAULT_LIMITS,
    CommandCgroup,
    Limits,
    address_space_limit,
    cgroup_support,
    mechanisms,
)
from agents.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from agents.sandbox.egress import EgressProxy

ISOLATIONS = ("bwrap", "subprocess")

# Kept for callers that read them; the defaults live in Limits now.
MAX_FILE_SIZE = DEFAULT_LIMITS.file_size
MAX_OPEN_FILES = DEFAULT_LIMITS.open_files


@dataclass
class CommandResult:
    exit_code: int | None  # None when we killed it (timeout or cancel)
    output: str  # stdout and stderr interleaved, capped
    timed_out: bool
    cancelled: bool
    truncated: bool
    duration_ms: float
    isolation: str  # "bwrap" or "subprocess"
    # Which mechanism enforced each limit: {"memory": "cgroup-v1", "processes": "cgroup-v1",
    # "cpu": "rlimit", "file_size": "rlimit", "open_files": "rlimit", "kill": "cgroup-v2",
    # "network": "none" | "egress-proxy" | "host"}.
    limits: dict[str, str] = field(default_factory=dict)
    # The limits that bit: "memory", "processes", "cpu", "file_size".
    exceeded: list[str] = field(default_factory=list)
    note: str = ""  # one line for the model about what was exceeded, or ""


@functools.cache
def _bwrap_binary() -> str | None:
    binary = shutil.which("bwrap")
    if binary is None:
        return None
    # Probe with the same namespaces and mounts a real run uses: in some containers
    # a plain bind works while --unshare-all, --uid or --proc do not, and then every
    # command would fail instead of falling back.
    try:
        with tempfile.TemporaryDirectory(prefix="shiftlog-probe-") as folder:
            probe = [*view.build_view(folder, bwrap=binary, toolchain=[], etc=()), "/usr/bin/true"]
            done = subprocess.run(
                probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env={}
            )
    except (OSError, subprocess.SubprocessError):
        return None
    return binary if done.returncode == 0 else None


@functools.cache
def _bwrap_problem() -> str:
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if _bwrap_binary() is None:
        return "bwrap is installed but cannot create namespaces here"
    return ""


def isolation_available() -> str:
    """ "bwrap" if bubblewrap works on this machine, else "subprocess". Probed once per process."""
    return "bwrap" if _bwrap_binary() else "subprocess"


def describe_isolation(limits: Limits | None = None) -> dict:
    """What this machine offers, for /readyz and the run's record."""
    limits = DEFAULT_LIMITS if limits is None else limits
    support = cgroup_support()
    bwrap = _bwrap_binary() is not None
    egress = bwrap and _egress_library()
    return {
        "isolation": isolation_available(),
        "bwrap": bwrap,
        "bwrap_problem": _bwrap_problem(),
        "limits": mechanisms(limits, support),
        "cgroup_notes": list(support.notes),
        "egress": "proxy" if egress else "unavailable",
        "egress_problem": ""
        if egress
        else ("needs bubblewrap" if not bwrap else "the proxy.py package is not installed"),
        "network": "none" if bwrap else "host",
    }


def _egress_library() -> bool:
    return importlib.util.find_spec("proxy") is not None


def command_env(
    workspace: Workspace,
    extra_env: dict[str, str] | None = None,
    *,
    isolation: str = "subprocess",
    toolchain: Sequence[str] | None = None,
    egress: bool = False,
) -> dict[str, str]:
    """The whole environment a command gets. Built from scratch so no secret of ours leaks in.

    PATH has the toolchain's bin folders first (by default the base interpreter's, never the
    worker's virtualenv), then the system's. HOME is the workspace for a plain subprocess and a
    private, empty folder under bubblewrap.
    """
    env = {
        "PATH": view.toolchain_path(toolchain),
        "HOME": view.HOME if isolation == "bwrap" else str(workspace.path),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if isolation == "bwrap":
        env["USER"] = env["LOGNAME"] = "agent"
        env["TMPDIR"] = "/tmp"
    if egress:
        env.update(relay.proxy_env())
    env.update(extra_env or {})
    return env


def _argv(
    command: str,
    workspace: Workspace,
    env: dict[str, str],
    isolation: str,
    *,
    toolchain: Sequence[str] | None,
    limits: Limits,
    egress: EgressProxy | None,
    user_fds: tuple[int, int] | None,
    writable: Sequence[str] = (),
    run_net: bool = False,
    etc_folder: str | None = None,
) -> list[str]:
    if isolation == "subprocess":
        return ["/bin/sh", "-c", command]
    # With the run's network namespace (its starter joined it) the proxy's listener is there.
    relayed = egress is not None and not run_net
    argv = view.build_view(
        workspace.path,
        bwrap=_bwrap_binary() or "bwrap",
        toolchain=toolchain,
        env=env,
        egress_socket_dir=str(egress.socket_dir) if relayed else None,
        share_net=run_net,
        etc_folder=etc_folder,
        tmp_bytes=limits.tmp_bytes,
        passwd_fd=user_fds[0] if user_fds else None,
        group_fd=user_fds[1] if user_fds else None,
        writable=writable,
    )
    if not relayed:
        return [*argv, "/bin/sh", "-c", command]
    # No namespace of the run's (relay.py): start the relay (it returns once it listens), then become the command.
    sock = f"{view.EGRESS_DIR}/{relay.SOCKET_NAME}"
    script = (
        f'python3 -I -S -c "$1" {sock} {relay.RELAY_PORT} '
        '|| { echo "shiftlog: the egress relay did not start" >&2; exit 125; }; '
        'exec /bin/sh -c "$0"'
    )
    return [*argv, "/bin/sh", "-c", script, command, relay.RELAY_CODE]


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    hard = soft if hard is None else hard
    _cur_soft, cur_hard = resource.getrlimit(which)
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(which, (soft, hard))


PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux
    _libc = None


def _rlimits(
    limits: Limits, address_space: int | None, nproc: int | None
) -> tuple[tuple[int, int, int], ...]:
    """(resource, soft, hard) for every rlimit a command gets."""
    found = [(resource.RLIMIT_CORE, 0, 0)]
    if limits.file_size is not None:
        found.append((resource.RLIMIT_FSIZE, limits.file_size, limits.file_size))
    if limits.open_files is not None:
        found.append((resource.RLIMIT_NOFILE, limits.open_files, limits.open_files))
    if limits.cpu_seconds is not None:
        # SIGXCPU at the soft limit, SIGKILL at the hard one for a process that ignores it.
        found.append((resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 5))
    if address_space is not None:
        found.append((resource.RLIMIT_AS, address_space, address_space))
    if nproc is not None:
        found.append((resource.RLIMIT_NPROC, nproc, nproc))
    return tuple(found)


@dataclass(frozen=True)
class _ChildSetup:
    """What the child does between fork and exec: plain system calls only. For a slot's fork
    server (spawner.py) only RLIMIT_CORE: the server takes the commands' rlimits once it runs."""

    parent: int
    rlimits: tuple[tuple[int, int, int], ...]
    join: tuple[str, ...]
    netns: tuple[int, ...] | None = None  # the run's namespaces (relay.RunNet.fds); failing,
    # no exec

    def __call__(self) -> None:
        if self.netns is not None:
            relay.enter(self.netns)
        # Into the command's cgroups first, so everything it starts is counted and killable.
        for path in self.join:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for which, soft, hard in self.rlimits:
            _limit(which, soft, hard)
        # Die with the worker, as bwrap's --die-with-parent does: a killed worker's command must
        # not go on changing the workspace while the next worker drives the run ...
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # ... also when the worker died between the fork and the prctl.
            if os.getppid() != self.parent:
                os._exit(137)


def _dup(fds: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if fds is None else tuple(os.dup(fd) for fd in fds)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def describe_exceeded(exceeded: Sequence[str], limits: Limits) -> str:
    """One line for the model: which limit stopped the command and what it was."""
    parts = []
    for name in exceeded:
        if name == "memory":
            parts.append(f"killed: out of memory (limit {_size(limits.memory_bytes or 0)})")
        elif name == "processes":
            parts.append(f"process limit reached ({limits.processes} processes): forks refused")
        elif name == "cpu":
            parts.append(f"killed: CPU time limit ({limits.cpu_seconds} s) reached")
        elif name == "file_size":
            parts.append(f"file size limit ({_size(limits.file_size or 0)}) reached")
        elif name == "workspace":
            parts.append(
                f"killed: the workspace reached its cap of {_size(limits.workspace_bytes or 0)} "
                "while the command ran (free space in it, or ask for a bigger cap)"
            )
        elif name == "disk_free":
            parts.append(
                f"killed: the disk's free space fell below the {_size(limits.min_free_bytes or 0)} "
                "kept for the database"
            )
    return "; ".join(parts)


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


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process `pid` (our child, not yet waited for)
    exits; None where the kernel has none (before Linux 5.3)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait_for_exit(
    proc: subprocess.Popen | spawner.Remote, exit_fd: int | None, timeout: float
) -> bool:
    """Wait at most `timeout` seconds for the child to exit; True if it has. With a pidfd this
    wakes the moment it exits: Popen.wait(timeout) polls, sleeping up to 50 ms between looks,
    which every command (and every check) paid on top of its own time."""
    if exit_fd is None:
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    poller = select.poll()
    poller.register(exit_fd, select.POLLIN)
    if not poller.poll(max(0, int(timeout * 1000))):
        return False
    proc.wait()  # it has exited: this only reaps it
    return True


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
    limits: Limits | None = None,
    toolchain: Sequence[str] | None = None,
    egress: EgressProxy | None = None,
    writable: Sequence[str] = (),
) -> CommandResult:
    """Run `command` with sh in the workspace and wait for it, at most `timeout` seconds.

    `limits`: per-command limits (default DEFAULT_LIMITS). `toolchain`: read-only folders whose
    bin folders come first on PATH (default: the base interpreter's prefix). `egress`: a started
    EgressProxy through which HTTP(S) may leave the sandbox; without one a bwrap command has no
    network at all (under "subprocess" there is no network namespace: the command has the host's
    network, reported as limits["network"] == "host"). `writable`: folders outside the workspace
    the command may write (a check's report folder).

    Every process the command started is killed when the call returns (timeout, `should_stop()`
    turning true, an exception, or a normal exit with children left in the background): the
    command's cgroup is killed whole where there is one, its PID namespace ends under bwrap, and
    its process group is killed in any case.
    """
    if isolation is None:
        isolation = isolation_available()
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown isolation {isolation!r}; expected one of {ISOLATIONS}")
    if isolation == "bwrap" and not _bwrap_binary():
        raise ValueError("isolation 'bwrap' asked for, but bwrap does not work on this machine")
    limits = DEFAULT_LIMITS if limits is None else limits
    use_egress = egress if isolation == "bwrap" else None

    env = command_env(
        workspace,
        extra_env,
        isolation=isolation,
        toolchain=toolchain,
        egress=use_egress is not None,
    )
    support = cgroup_support()
    applied = mechanisms(limits, support)
    if isolation == "bwrap":
        applied["network"] = "egress-proxy" if use_egress is not None else "none"
        applied["kill"] = "pid-namespace+" + applied["kill"]
    else:
        applied["network"] = "host"
    rlimits = _rlimits(
        limits,
        address_space_limit(limits, support),
        limits.processes if applied.get("processes") == "rlimit-nproc" else None,
    )
    # The command's cgroups: a slot kept from command to command, whose fork server starts the
    # command inside them (spawner.py); without cgroups, a plain child.
    slot = None
    if support.hierarchies():
        server_setup = functools.partial(_ChildSetup, os.getpid(), ((resource.RLIMIT_CORE, 0, 0),))
        slot = spawner.POOL.take(limits, support, server_setup, rlimits)
    cgroup: CommandCgroup | None = slot.cgroup if slot is not None else None
    if cgroup is not None and cgroup.problems:  # fail closed: say what is not enforced
        applied["cgroup_problems"] = "; ".join(cgroup.problems)
    # /etc: one copy of the allowed entries, with the sandbox's passwd and group in it; without
    # one, the entries bound one by one and the user database passed in on two pipes.
    etc_folder = view.etc_copy() if isolation == "bwrap" else None
    user_fds = view.user_db_fds() if isolation == "bwrap" and etc_folder is None else None
    # The numbers bwrap finds them at: under a fork server, fixed low ones (it gives them those),
    # whatever numbers this process gave them; in a plain child, their own.
    user_numbers = (3, 4) if user_fds and slot is not None else user_fds
    # The run's network namespace (relay.RunNet), held by a descriptor of this call's own so it
    # cannot change under the command; None: a new empty one, with the relay inside.
    netns = _dup(use_egress.netns_fds) if use_egress is not None else None
    timed_out = cancelled = False
    emptied = False  # the command's cgroups held no process when it was over
    started = time.monotonic()
    deadline = started + timeout

    # A file, not a pipe: a command printing gigabytes cannot block on a full pipe,
    # and we only ever read its head and tail.
    try:
        with tempfile.TemporaryFile(prefix="shiftlog-cmd-") as out:
            argv = _argv(
                command,
                workspace,
                env,
                isolation,
                toolchain=toolchain,
                limits=limits,
                egress=use_egress,
                user_fds=user_numbers,
                writable=writable,
                run_net=netns is not None,
                etc_folder=etc_folder,
            )
            proc: subprocess.Popen | spawner.Remote
            if slot is not None:
                proc = spawner.start(
                    slot,
                    argv,
                    env,
                    str(workspace.path),
                    out.fileno(),
                    user_fds or (),
                    rlimits,
                    netns=netns,
                    numbers=user_numbers,
                    dies_with_server=isolation == "bwrap",  # (--die-with-parent)
                )
            else:
                proc = subprocess.Popen(
                    argv,
                    cwd=workspace.path,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_ChildSetup(os.getpid(), rlimits, (), netns),
                    pass_fds=user_fds or (),
                )
            if user_fds:
                for fd in user_fds:
                    os.close(fd)
                user_fds = None
            # Woken the moment it ends: by the fork server's message, or on the child's pidfd.
            exit_fd = proc.fileno() if isinstance(proc, spawner.Remote) else _pidfd(proc.pid)
            watch = DiskWatch(
                workspace.path,
                cap=limits.workspace_bytes,
                floor=limits.min_free_bytes,
                stop=functools.partial(_kill_group, proc.pid),
            ).start()
            try:
                while proc.poll() is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        timed_out = True
                        break
                    if _wait_for_exit(proc, exit_fd, min(poll_interval, remaining)):
                        break
                    if watch.reason:
                        break
                    if should_stop is not None and should_stop():
                        cancelled = True
                        break
            finally:
                watch.close()
                if exit_fd is not None and not isinstance(proc, spawner.Remote):
                    os.close(exit_fd)
                # Also on a normal exit (background children) and on any exception in
                # should_stop or from a KeyboardInterrupt.
                spare = slot.spare if slot is not None else None
                # (Empty once is empty for good: nothing outside starts a process in them.)
                left = cgroup is not None and bool(cgroup.pids(spare))
                if left:
                    cgroup.kill(spare)
                if not isinstance(proc, spawner.Remote) or proc.poll() is None:
                    _kill_group(proc.pid)  # (a reaped command's pid may be another's by now)
                proc.wait()
                emptied = cgroup is None or not left or cgroup.wait_empty(spare=spare)
                if not emptied:
                    applied["kill"] += " (processes left after 5 s)"
            duration_ms = (time.monotonic() - started) * 1000
            output, truncated = read_capped(out, output_limit)
        exceeded = cgroup.exceeded() if cgroup is not None else []
    finally:
        if slot is not None:
            if emptied:
                spawner.POOL.give_back(slot)
            else:
                spawner.POOL.discard(slot)
        for fd in user_fds or ():
            os.close(fd)
        for fd in netns or ():
            os.close(fd)

    exit_code: int | None = None
    if watch.reason:
        exceeded.append(watch.reason)  # killed by the watch: no exit code of its own
    elif not (timed_out or cancelled):
        # Report death by signal the way a shell would (128 + signal number).
        exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        if exit_code == 128 + signal.SIGXCPU:
            exceeded.append("cpu")
        elif exit_code == 128 + signal.SIGXFSZ:
            exceeded.append("file_size")
    return CommandResult(
        exit_code=exit_code,
        output=output,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated=truncated,
        duration_ms=duration_ms,
        isolation=isolation,
        limits=applied,
        exceeded=exceeded,
        note=describe_exceeded(exceeded, limits),
    )
