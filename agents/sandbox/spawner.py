"""Commands started straight into a cgroup made once and kept, by a process already inside it.

Moving a process into a cgroup (a write to cgroup.procs) waits for an RCU grace period in the
kernel (cgroup_threadgroup_rwsem): 8-17 ms on this kind of machine whenever the last move was
more than a few milliseconds ago, i.e. on nearly every agent command; making four cgroup folders
and removing them again per command cost more on top. So a process keeps a few *slots*, one per
command running at once. A slot is the command's cgroups (made once, with its limits) and a
*fork server*: a small interpreter started into those cgroups once (the only move), dying with
the worker, that forks each command from inside. A command is a message to it over a socket
(argv, environment, folder, rlimits, and the output file and other descriptors passed along); its
child starts a session, takes the rlimits and the descriptors, and execs the command. So the
command is born in its cgroups, counted and limited from its first instruction, without a fork
of the (large) worker and without a move. The server reports the pid at once and the exit status
when the command ends: the caller wakes on that message, it does not poll.

After the command the caller kills whatever is left in the slot's cgroups (every process but the
server: frozen first where there is a freezer; where there is none, `cgroup.kill`, which ends the
server too and the slot gets a new one), waits until they hold only the server, and gives the
slot back. A slot that could not be emptied is removed. The folders keep the per-command naming
(`cmd-<worker pid>-<start time>-<n>`, limits.py), so a killed worker's slots are stale and are
cleaned up like any per-command cgroup; its servers die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agents.sandbox.limits import CgroupSupport, CommandCgroup, Limits, cleanup_stale_cgroups

MARK = "shiftlog-fork-server"  # in every server's argv: tests and operators can tell it apart
STALE_EVERY_S = 60.0  # look for killed workers' cgroups at most this often
IDLE_SLOTS = 8  # idle slots kept per set of limits

# Runs as `python -I -S -c SERVER MARK <socket fd>`, in the slot's cgroups.
SERVER = r"""
import ctypes, fcntl, json, os, resource, signal, socket, struct, sys
s = socket.socket(fileno=int(sys.argv[2]))
libc = ctypes.CDLL(None, use_errno=True)
def adj(v):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(v)
    except OSError:
        pass
adj("-1000")  # the OOM killer takes the command that went over, never the server
def child(req, fds):
    os.setsid()
    adj("0")
    ns = req.get("netns", 0)
    if ns:  # the last descriptors: the run's namespaces (relay.RunNet.fds), never the worker's
        ours, fds = fds[-ns:], fds[:-ns]
        kinds = [0x40000000] if ns == 1 else [0x10000000, 0x40000000]  # (user,) net
        for fd, kind in zip(ours, kinds):
            if libc.setns(fd, kind) != 0:
                os.write(fds[0], b"shiftlog: cannot enter the run's network namespace\n")
                os._exit(125)
            os.close(fd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as Popen's restore_signals: Python ignores them
        signal.signal(sig, signal.SIG_DFL)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: dies with the server
    # Out of the way of every number the command must find its fds at (the worker's numbers,
    # often above 200 in a busy worker): a copy landing on a target would be overwritten by the
    # shuffle, or keep its close-on-exec flag when dup2 is asked to copy it onto itself.
    low = max([200, *req["fds"]]) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low) for fd in fds]
    for fd in fds:
        os.close(fd)
    fd0 = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd0, 0)
    os.dup2(high[0], 1)
    os.dup2(high[0], 2)
    for fd, target in zip(high[1:], req["fds"]):
        os.dup2(fd, target)  # inheritable: a copy onto another number drops close-on-exec
    for which, soft, hard in req["rlimits"]:  # last: a low RLIMIT_NOFILE would stop the dup
        cur = resource.getrlimit(which)[1]
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(which, (soft, hard))
    try:
        os.chdir(req["cwd"])
        os.execvpe(req["argv"][0], req["argv"], req["env"])
    except OSError as e:
        os.write(2, ("shiftlog: cannot start %s: %s\n" % (req["argv"][0], e.strerror)).encode())
    os._exit(127)
while True:
    try:
        head, fds, _, _ = socket.recv_fds(s, 8, 16)
    except OSError:
        break
    if len(head) != 8:
        break
    size = int.from_bytes(head, "big")
    data = bytearray()
    while len(data) < size:
        chunk = s.recv(size - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    req = json.loads(data)
    pid = os.fork()
    if pid == 0:
        try:
            s.close()
            child(req, fds)
        finally:
            os._exit(127)
    for fd in fds:
        os.close(fd)
    s.sendall(struct.pack(">q", pid))
    _, status = os.waitpid(pid, 0)
    s.sendall(struct.pack(">q", os.waitstatus_to_exitcode(status)))
"""


class ServerGone(Exception):
    """The slot's fork server died (it is started again)."""


class Remote:
    """A command the fork server started: what bash.py needs of a Popen. Its exit arrives as a
    message on `fileno()`."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.returncode: int | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.sock], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("command", timeout or 0)
            self._read()
        assert self.returncode is not None
        return self.returncode

    def _read(self) -> None:
        data = b""
        while len(data) < 8:
            chunk = self.sock.recv(8 - len(data))
            if not chunk:  # the server died: the command died with it
                self.returncode = -9
                return
            data += chunk
        self.returncode = int.from_bytes(data, "big", signed=True)


@dataclass(eq=False)
class Slot:
    key: tuple
    cgroup: CommandCgroup
    setup: Callable[[], None]  # joins the cgroups, dies with this thread (preexec)
    server: subprocess.Popen | None = None
    sock: socket.socket | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def spare(self) -> int | None:
        """The server's pid: in the cgroups, but not the command's."""
        return self.server.pid if self.server is not None else None

    def warm(self) -> None:
        """Start the fork server in the slot's cgroups (the one slow move)."""
        self.ready.clear()
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", SERVER, MARK, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self.setup,
                pass_fds=(theirs.fileno(),),
                env={},
            )
            self.sock = ours
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            self.ready.set()

    def alive(self) -> bool:
        return self.server is not None and self.server.poll() is None and self.sock is not None

    def start(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        cwd: str,
        out: int,
        fds: Sequence[int],
        rlimits: Sequence[tuple[int, int, int]],
        netns: Sequence[int] | None = None,
    ) -> Remote:
        """The command, forked by the server. `fds` keep their numbers in it. `netns`: the run's
        namespaces (relay.RunNet.fds), entered before it execs (it exits with 125 if it cannot)."""
        if not self.ready.wait(30) or not self.alive():
            raise ServerGone("the fork server is not running")
        assert self.sock is not None
        payload = json.dumps(
            {
                "argv": list(argv),
                "env": env,
                "cwd": cwd,
                "fds": list(fds),
                "rlimits": rlimits,
                "netns": len(netns or ()),
            }
        ).encode()
        passed = [out, *fds, *(netns or ())]
        try:
            socket.send_fds(self.sock, [len(payload).to_bytes(8, "big")], passed)
            self.sock.sendall(payload)
            pid = b""
            while len(pid) < 8:
                chunk = self.sock.recv(8 - len(pid))
                if not chunk:
                    raise ServerGone("the fork server ended")
                pid += chunk
        except OSError as e:
            raise ServerGone(f"the fork server is gone ({e.strerror})") from None
        return Remote(int.from_bytes(pid, "big", signed=True), self.sock)

    def close(self) -> None:
        """Stop the server (between commands)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                self.server.kill()
            self.server.wait()
            self.server = None


class Pool:
    """This process's slots, by limits. Thread-safe; one thread starts every fork server, so
    they die with the process (PR_SET_PDEATHSIG is per thread, and this one lives as long)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple, list[Slot]] = {}
        self._calls: list[tuple[Callable[[], None], threading.Event]] = []
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stale_at = 0.0

    def _starter(self) -> None:
        while True:
            with self._wake:
                while not self._calls:
                    self._wake.wait()
                call, done = self._calls.pop(0)
            try:
                call()
            except Exception:  # the caller finds the server missing and says so
                pass
            finally:
                done.set()

    def _on_starter(self, call: Callable[[], None]) -> None:
        done = threading.Event()
        with self._wake:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._starter, name="sandbox-fork-servers", daemon=True
                )
                self._thread.start()
            self._calls.append((call, done))
            self._wake.notify()
        done.wait()

    def take(
        self,
        limits: Limits,
        support: CgroupSupport,
        setup: Callable[[tuple[str, ...]], Callable[[], None]],
    ) -> Slot:
        """A slot for a command with these limits: an idle one, or a new one (made here: the
        first command of each concurrent slot pays the move once)."""
        key = (limits,)
        with self._lock:
            idle = self._idle.get(key)
            slot = idle.pop() if idle else None
        if time.monotonic() - self._stale_at > STALE_EVERY_S:  # a killed worker's leftovers
            self._stale_at = time.monotonic()
            cleanup_stale_cgroups()
        if slot is None:
            cgroup = CommandCgroup(limits, support, extra_pids=1)
            slot = Slot(key, cgroup, setup(tuple(cgroup.join_paths)))
        if not slot.alive():
            self._on_starter(slot.warm)
        slot.cgroup.mark()
        return slot

    def give_back(self, slot: Slot) -> None:
        """After its command, with only the server left in the cgroups: kept for the next."""
        with self._lock:
            idle = self._idle.setdefault(slot.key, [])
            keep = len(idle) < IDLE_SLOTS and not slot.cgroup.problems and slot.alive()
            if keep:
                idle.append(slot)
        if not keep:
            self.discard(slot)

    def discard(self, slot: Slot) -> None:
        slot.close()
        slot.cgroup.kill()
        slot.cgroup.wait_empty()
        slot.cgroup.remove()

    def drain(self) -> None:
        """Stop every idle server and remove the idle slots' cgroups (at exit, and in tests)."""
        with self._lock:
            slots = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for slot in slots:
            slot.close()
            for _, folder in slot.cgroup.folders:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # never killing: a process left in it is worth seeing


POOL = Pool()
atexit.register(POOL.drain)


def start(
    slot: Slot,
    argv: Sequence[str],
    env: dict[str, str],
    cwd: str,
    out: int,
    fds: Sequence[int],
    rlimits: Sequence[tuple[int, int, int]],
    netns: Sequence[int] | None = None,
) -> Remote:
    """Run the command through the slot's fork server; a server that died meanwhile is
    started again once."""
    try:
        return slot.start(argv, env, cwd, out, fds, rlimits, netns)
    except ServerGone:
        POOL._on_starter(slot.warm)
        return slot.start(argv, env, cwd, out, fds, rlimits, netns)
