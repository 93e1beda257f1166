"""Commands started straight into a cgroup made once and kept, by a process already inside it.

Moving a process into a cgroup (a write to cgroup.procs) waits for an RCU grace period in the
kernel (cgroup_threadgroup_rwsem): 8-17 ms on this kind of machine whenever the last move was
more than a few milliseconds ago, i.e. on nearly every agent command; making four cgroup folders
and removing them again per command cost more on top. So a process keeps a few *slots*, one per
command running at once. A slot is the command's cgroups (made once, with its limits) and a
*fork server*: a small interpreter started into those cgroups once (the only move), dying with
the worker, that forks each command from inside. A command is a message to it over a socket
(argv, environment, folder, rlimits, and the output file and other descriptors passed along). So
the command is born in its cgroups, counted and limited from its first instruction, without a
fork of the (large) worker and without a move. The server reports the pid at once and the exit
status when the command ends: the caller wakes on that message, it does not poll.

The server holds the slot's rlimits itself (slots are kept by them), so a bubblewrap command,
which dies with its parent by itself (--die-with-parent), is started with posix_spawn: a new
session, default SIGPIPE and SIGXFSZ, its descriptors and folder, no copy of the server (a fork
of even this small interpreter, then Python in the copy, cost 1.5-2 ms of a ~10 ms command). Any
other command (no bubblewrap, a network namespace to enter) is forked: the child takes
PR_SET_PDEATHSIG, the namespaces, the descriptors and the rlimits, and execs. Nothing of the
server's but what it passes on purpose is inheritable. The server's own CPU time counts against
RLIMIT_CPU too, so it retires between commands at half the limit (the slot starts another).

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
import functools
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

# Runs as `python -I -S -c SERVER MARK <socket fd> <rlimits as JSON>`, in the slot's cgroups.
SERVER = r"""
import ctypes, fcntl, json, os, resource, signal, socket, struct, sys
s = socket.socket(fileno=int(sys.argv[2]))
os.set_inheritable(s.fileno(), False)  # never into a command: it could ask for commands itself
libc = ctypes.CDLL(None, use_errno=True)
def adj(v):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(v)
    except OSError:
        pass
# The OOM killer takes the command that went over, never the server. Kept open (close-on-exec)
# to put the command's own value in place around a spawn, where it can be set back after.
adj_fd = None
try:
    adj_fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    os.write(adj_fd, b"-1000")
except OSError:  # not allowed here (no CAP_SYS_RESOURCE): commands inherit our value as it is
    if adj_fd is not None:
        os.close(adj_fd)
    adj_fd = None
def set_adj(v):
    if adj_fd is not None:
        try:
            os.write(adj_fd, v)
        except OSError:
            pass
# The slot's rlimits, held by the server itself, so a spawned command inherits them: every
# command of the slot has these (spawner.Pool keys slots by them).
own = [tuple(r) for r in json.loads(sys.argv[3])]
def limit(rlimits):
    for which, soft, hard in rlimits:
        cur = resource.getrlimit(which)[1]
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(which, (soft, hard))
try:
    limit(own)
except (OSError, ValueError):  # then every command is forked and takes them itself
    own = None
# Our own CPU time counts against RLIMIT_CPU too: the server retires (between commands) at half.
cpu_cap = min([soft for which, soft, _ in own or () if which == resource.RLIMIT_CPU] or [0])
def above(req):  # where copies of the passed descriptors go: past 0-2 and every target number
    return max([2, *req["fds"]]) + 1
# Our own network namespace, to come back to after starting a command in a run's.
try:
    home_net = os.open("/proc/self/ns/net", os.O_RDONLY)
except OSError:
    home_net = None
NEWNET, NEWUSER = 0x40000000, 0x10000000  # CLONE_NEWNET, CLONE_NEWUSER
# The command started straight from here with posix_spawn (no copy of this process) where it
# needs nothing done before exec but what posix_spawn does: a bubblewrap command (it dies with
# this server itself: --die-with-parent) with the rlimits the server holds already. A run's
# network namespace alone (made where we may: relay.RunNet) is entered by the server for the
# spawn and left at once; a user namespace cannot be left, so that command is forked. None:
# it cannot (the caller forks instead, and the child says why).
def spawn(req, fds):
    ns = req.get("netns", 0)
    if not req.get("dies_with_server") or ns > 1 or (ns and home_net is None):
        return None
    if [tuple(r) for r in req["rlimits"]] != own:
        return None
    if not req["argv"][0].startswith("/"):
        return None
    net = fds[-1] if ns else None
    fds = fds[:-1] if ns else fds
    high = []
    ready = entered = False
    try:
        for fd in fds:
            high.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above(req)))
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, high[0], 1),
            (os.POSIX_SPAWN_DUP2, high[0], 2),
            *((os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(high[1:], req["fds"])),
        ]
        os.chdir(req["cwd"])
        entered = net is not None and libc.setns(net, NEWNET) == 0
        ready = entered == (net is not None)
    except OSError:
        pass
    # Once it is started, nothing here may turn the answer into None: it would run twice.
    try:
        if ready:
            set_adj(b"0")
            try:
                return os.posix_spawn(
                    req["argv"][0], req["argv"], req["env"], file_actions=actions, setsid=True,
                    setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                )
            except OSError:
                pass
        return None
    finally:
        set_adj(b"-1000")
        if entered and libc.setns(home_net, NEWNET) != 0:
            os._exit(1)  # never serve another run from this one's network
        # Out of the workspace again: a server kept there would pin a deleted workspace, and a
        # watch on it would never hear that it was deleted (a new one at its path not seen).
        os.chdir("/")
        for fd in high:
            os.close(fd)
def child(req, fds):
    os.setsid()
    adj("0")
    ns = req.get("netns", 0)
    if ns:  # the last descriptors: the run's namespaces (relay.RunNet.fds), never the worker's
        ours, fds = fds[-ns:], fds[:-ns]
        kinds = [NEWNET] if ns == 1 else [NEWUSER, NEWNET]
        for fd, kind in zip(ours, kinds):
            if libc.setns(fd, kind) != 0:
                os.write(fds[0], b"shiftlog: cannot enter the run's network namespace\n")
                os._exit(125)
            os.close(fd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as Popen's restore_signals: Python ignores them
        signal.signal(sig, signal.SIG_DFL)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: dies with the server
    # (A copy landing on a target would be overwritten by the shuffle, or keep its close-on-exec
    # flag when dup2 is asked to copy it onto itself.)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above(req)) for fd in fds]
    for fd in fds:
        os.close(fd)
    fd0 = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd0, 0)
    os.dup2(high[0], 1)
    os.dup2(high[0], 2)
    for fd, target in zip(high[1:], req["fds"]):
        os.dup2(fd, target)  # inheritable: a copy onto another number drops close-on-exec
    limit(req["rlimits"])  # (the server's own, unless the request differs)
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
    for fd in fds:
        os.set_inheritable(fd, False)  # (received as inheritable) only the copies made for it
    pid = spawn(req, fds)
    if pid is None:
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
    if cpu_cap and sum(os.times()[:2]) * 2 > cpu_cap:
        break
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
    rlimits: tuple[tuple[int, int, int], ...] = ()  # its commands', held by the server itself
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
                [
                    sys.executable,
                    *("-I", "-S", "-c", SERVER, MARK),
                    str(theirs.fileno()),
                    json.dumps(self.rlimits),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self.setup,
                pass_fds=(theirs.fileno(),),
                env={},
                cwd="/",  # it holds no folder of anyone's
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
        *,
        numbers: Sequence[int] | None = None,
        dies_with_server: bool = False,
    ) -> Remote:
        """The command, started by the server. `fds` get `numbers` in it (default: their own).
        `netns`: the run's namespaces (relay.RunNet.fds), entered before it execs (it exits with
        125 if it cannot). `dies_with_server`: the command ends itself when its parent does
        (bubblewrap's --die-with-parent), so the server may start it with posix_spawn, without a
        copy of itself, when it needs nothing else done before exec (SERVER's spawn())."""
        if not self.ready.wait(30) or not self.alive():
            raise ServerGone("the fork server is not running")
        assert self.sock is not None
        payload = json.dumps(
            {
                "argv": list(argv),
                "env": env,
                "cwd": cwd,
                "fds": list(fds if numbers is None else numbers),
                "rlimits": rlimits,
                "netns": len(netns or ()),
                "dies_with_server": dies_with_server,
            }
        ).encode()
        passed = [out, *fds, *(netns or ())]
        try:
            # One message (the server reads the head, then the rest), one wake-up of the server.
            message = len(payload).to_bytes(8, "big") + payload
            sent = socket.send_fds(self.sock, [message], passed)
            if sent < len(message):  # (cut short by a signal)
                self.sock.sendall(message[sent:])
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
        rlimits: Sequence[tuple[int, int, int]] = (),
    ) -> Slot:
        """A slot for a command with these limits and rlimits: an idle one, or a new one (made
        here: the first command of each concurrent slot pays the move once)."""
        key = (limits, tuple(rlimits))
        with self._lock:
            idle = self._idle.get(key)
            slot = idle.pop() if idle else None
        if time.monotonic() - self._stale_at > STALE_EVERY_S:  # a killed worker's leftovers
            self._stale_at = time.monotonic()
            cleanup_stale_cgroups()
        if slot is None:
            cgroup = CommandCgroup(limits, support, extra_pids=1)
            slot = Slot(key, cgroup, setup(tuple(cgroup.join_paths)), tuple(rlimits))
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
    *,
    numbers: Sequence[int] | None = None,
    dies_with_server: bool = False,
) -> Remote:
    """Run the command through the slot's fork server (Slot.start); a server that died meanwhile
    is started again once."""
    call = functools.partial(
        slot.start,
        argv,
        env,
        cwd,
        out,
        fds,
        rlimits,
        netns,
        numbers=numbers,
        dies_with_server=dies_with_server,
    )
    try:
        return call()
    except ServerGone:
        POOL._on_starter(slot.warm)
        return call()
