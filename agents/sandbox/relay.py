"""How a sandboxed command, which has no network, reaches its run's egress proxy.

The usual way: one network namespace per run (`RunNet`), made by the worker when the run's proxy
starts and kept until it stops. It holds only a loopback interface, and on it, at
127.0.0.1:RELAY_PORT, a listening socket that belongs to the proxy itself: the worker made the
namespace from a short-lived thread of its own (unshare(CLONE_NEWNET) moves one thread), opened
the listener there and keeps both as descriptors. Every command of the run is started into that
namespace (the fork server's child joins it with setns before it execs bubblewrap, which then
keeps it: `--share-net`) instead of a new empty one. So there is no relay process at all: nothing
to start per command (a Python start-up was 15-55 ms of every egress command), nothing that can
outlive the run. The namespace lives as long as a descriptor or a process holds it: the proxy's
two descriptors (closed by stop(), and by the kernel when the worker dies, even by SIGKILL) and
the run's command while it runs (it dies with the worker: PR_SET_PDEATHSIG, --die-with-parent).

The namespace belongs to the worker's user namespace, not the command's: the command (uid 1000
of its own user namespace, no capabilities) cannot reconfigure it, and it shows nothing but the
listener. Making one in the worker's own user namespace needs CAP_SYS_ADMIN (a worker running as
root). An unprivileged worker (the container's user) has a helper make it instead: a short-lived
interpreter, started once per run, makes a user namespace of its own (the worker's uid and gid
mapped to themselves, nothing else) with the network namespace in it, brings loopback up, opens
the listener, hands the three descriptors back over a socket pair and exits. Each command's
starter then enters that user namespace and the network namespace (setns, as the namespace's
owner) before it execs bubblewrap, which nests the command's own user namespace inside. Where
neither way is allowed the proxy falls back to the relay inside the sandbox:

RELAY_CODE, run by the toolchain's python3 before the command: it listens on
127.0.0.1:RELAY_PORT in the command's own (new, empty) namespace, forks into the background once
it listens (so the command never races it) and forwards each connection to the proxy's Unix
socket, which is bound into the sandbox. It dies with the sandbox's PID namespace.

Either way each connection is the proxy's to decide, count and cap, and is filed under the
command that made it: a command's processes are all gone when its call returns (PID namespace,
cgroup), so none of them connects during the next command, and the proxy's end_command() takes
what is still in the listen queue first.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import threading

RELAY_PORT = 3128
SOCKET_NAME = "egress.sock"
CLONE_NEWNET = 0x40000000  # linux/sched.h
CLONE_NEWUSER = 0x10000000

# Run by an unprivileged worker's helper (`python -I -S -c HOLDER_CODE <socket fd> <port>`): a
# user namespace with a network namespace in it, loopback up, the listener; its three
# descriptors (user namespace, network namespace, listener) are sent back; then it exits.
HOLDER_CODE = r"""
import ctypes, fcntl, os, socket, struct, sys
s = socket.socket(fileno=int(sys.argv[1]))
try:
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                       ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as d:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(d, 0x8913, req))[1]
        fcntl.ioctl(d, 0x8914, struct.pack("16sh22x", b"lo", flags | 1))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[2])))
    listener.listen(128)
    fds = [os.open("/proc/self/ns/user", os.O_RDONLY), os.open("/proc/self/ns/net", os.O_RDONLY)]
    socket.send_fds(s, [b"ok"], fds + [listener.fileno()])
except Exception as e:
    s.sendall(("error: %s" % e).encode()[:500])
"""

RELAY_CODE = r"""
import os, socket, sys, threading
path, port = sys.argv[1], int(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(128)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def serve(client):
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    other = threading.Thread(target=pump, args=(client, upstream), daemon=True)
    other.start()
    pump(upstream, client)
    other.join()
    client.close()
    upstream.close()

while True:
    client, _ = server.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
"""

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux
    _libc = None

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _loopback_up() -> None:
    """Bring `lo` up in the calling thread's network namespace (a new one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


class RunNet:
    """A run's network namespace (loopback only) and the proxy's listener in it. `fd` is what a
    command's starter passes to setns(2); `listener` is accepted on by the proxy."""

    def __init__(self, fd: int, listener: socket.socket, userns_fd: int | None = None) -> None:
        self.fd = fd
        self.listener = listener
        self.userns_fd = userns_fd  # the helper's user namespace, entered first (or None)
        self.inode = os.fstat(fd).st_ino  # the namespace's identity (as in "net:[inode]")

    @property
    def fds(self) -> tuple[int, ...]:
        """What a command's starter enters, in order (see enter())."""
        return (self.fd,) if self.userns_fd is None else (self.userns_fd, self.fd)

    @classmethod
    def make(cls, port: int = RELAY_PORT, *, helper: bool | None = None) -> RunNet:
        """A new namespace with a listener on 127.0.0.1:`port`: made by this process where it
        may (CAP_SYS_ADMIN), else by a helper in a user namespace of its own (`helper`: force
        one way). OSError where neither works (then the in-sandbox relay is used)."""
        if _libc is None:
            raise OSError("no libc: network namespaces need Linux")
        if helper:
            return cls._by_helper(port)
        try:
            return cls._here(port)
        except OSError as here:
            if helper is False:
                raise
            try:
                return cls._by_helper(port)
            except OSError as there:
                raise OSError(f"{here}; a helper's user namespace: {there}") from there

    @classmethod
    def _by_helper(cls, port: int) -> RunNet:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            helper = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HOLDER_CODE, str(theirs.fileno()), str(port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={},
            )
            theirs.close()
            ours.settimeout(30)
            try:
                message, fds, _, _ = socket.recv_fds(ours, 600, 3)
            finally:
                helper.wait()
        finally:
            theirs.close()
            ours.close()
        if len(fds) != 3 or message != b"ok":
            for fd in fds:
                os.close(fd)
            raise OSError(message.decode(errors="replace") or "the helper gave nothing back")
        userns, netns, listen = fds
        for fd in (userns, netns):
            os.set_inheritable(fd, False)
        listener = socket.socket(fileno=listen)
        listener.setblocking(False)
        return cls(netns, listener, userns)

    @classmethod
    def _here(cls, port: int) -> RunNet:
        assert _libc is not None
        made: list[RunNet] = []
        failed: list[BaseException] = []

        def inside() -> None:  # a thread of its own: only it enters the new namespace
            try:
                own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                failed.append(e)
                return
            try:
                _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
                fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _loopback_up()
                    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        listener.bind(("127.0.0.1", port))
                        listener.listen(128)
                        listener.setblocking(False)  # accept() only after poll() says one waits
                    except BaseException:
                        listener.close()
                        raise
                except BaseException:
                    os.close(fd)
                    raise
                made.append(cls(fd, listener))
            except BaseException as e:
                failed.append(e)
            finally:
                # Back where it came from (the thread ends now anyway).
                with contextlib.suppress(Exception):
                    _libc.setns(own, CLONE_NEWNET)
                os.close(own)

        thread = threading.Thread(target=inside, name="egress-netns", daemon=True)
        thread.start()
        thread.join()
        if failed:
            error = failed[0]
            raise error if isinstance(error, OSError) else OSError(str(error))
        return made[0]

    def close(self) -> None:
        """Let go of the namespace: it ends once no command of the run is left in it."""
        with contextlib.suppress(OSError):
            self.listener.close()
        for name in ("fd", "userns_fd"):
            fd = getattr(self, name)
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def enter(fds: tuple[int, ...]) -> None:
    """Enter the run's namespaces (RunNet.fds: the network namespace, after the helper's user
    namespace if there is one) in a single-threaded child between fork and exec; raises when
    refused: a command must never fall back to the worker's own network."""
    if _libc is None:
        raise OSError("no libc: network namespaces need Linux")
    if len(fds) == 2:
        _check(_libc.setns(fds[0], CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
    _check(_libc.setns(fds[-1], CLONE_NEWNET), "setns(CLONE_NEWNET)")


def proxy_env(port: int = RELAY_PORT) -> dict[str, str]:
    """Environment that points HTTP clients (curl, pip, git, npm, urllib, requests) at the relay."""
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    # The sandbox's own loopback (servers a command starts itself) is reached directly.
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env
