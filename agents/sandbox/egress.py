"""Egress under policy: an HTTP(S) proxy per run that asks before every connection.

A sandboxed command has no network of its own. `EgressProxy` makes the run's network namespace,
which holds nothing but a loopback interface and the proxy's own listener on 127.0.0.1:3128, and
run_command(..., egress=proxy) starts each command of the run into it (relay.py: no relay process,
nothing started per command) and points HTTP_PROXY/HTTPS_PROXY/ALL_PROXY at it. Where the worker
may not make a namespace, a command gets a new empty one and a tiny relay inside that forwards
127.0.0.1:3128 to the proxy's Unix socket (in a per-run folder outside the workspace, bound into
the sandbox); the proxy listens on that socket in either case.

For every connection (a CONNECT tunnel for HTTPS, or a plain HTTP request in absolute form) the
proxy asks `decide(host, port)`:
- "allow": it connects and relays; TLS is not intercepted, only tunnelled;
- "deny": 403 at once, "... are denied by this run's policy";
- "ask": 403 at once, "... need a person's approval; one has been asked for — retry after it is
  decided". Nothing waits mid-command for a person: the command fails fast and the model retries.
Every attempt is reported, when it is over (or when its command ends: `end_command`), to
`record(host, port, decision, bytes_up, bytes_down, reason)` (bytes as the sandbox sent and
received them, headers included).

Under abuse (agents/sandbox/addresses.py does the checks):
- a host name no one could decide about (not ASCII, not LDH labels, too long, bad IDNA) or a
  port outside 1-65535 is refused as "invalid", with the reason, and never asked about;
- an allowed name is resolved once per connection, by the proxy, and the connection goes to
  that checked address only: a name that does not resolve is refused ("unresolved"), and with
  block_private (the default) one that resolves to a loopback, private, link-local or otherwise
  non-public address is refused too ("blocked"), so neither "allow example.com" nor a DNS answer
  that changes between the check and the connection is a way to the machine's own services or a
  cloud metadata endpoint;
- at most MAX_OPEN connections are open at once and MAX_PER_COMMAND are made per command (more
  are answered 503 at once, without a thread, and counted), a request head is cut off after
  MAX_REQUEST_HEAD bytes, at most MAX_BUFFERED bytes wait for a side that does not read (each
  way), and a connection idle for `timeout` seconds is closed.

The HTTP machinery is proxy.py's (its HttpProtocolHandler and plugin hooks, run in threads of
this process so the callbacks are plain Python calls). Pure Python, no Django: the runtime wires
the callbacks to the run's allow-list, approvals and event log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.common.flag import FlagParser
from proxy.common.logger import Logger
from proxy.core.work.threaded import start_threaded_work
from proxy.http.exception import HttpRequestRejected
from proxy.http.handler import HttpProtocolHandler
from proxy.http.proxy import HttpProxyBasePlugin

from agents.sandbox import addresses
from agents.sandbox.relay import RELAY_PORT, SOCKET_NAME, RunNet

Decide = Callable[[str, int], str]
# record(host, port, decision, bytes_up, bytes_down, reason)
Record = Callable[[str, int, str, int, int, str], None]
DECISIONS = ("allow", "deny", "ask")
# What one run's proxy costs the worker, whatever the command does: connections open at once
# (each is a thread of this process), connections one command may make, the bytes of a request's
# head held before it is decided, and the length of a host name kept in a refusal's record.
MAX_OPEN = 32
MAX_PER_COMMAND = 256
MAX_REQUEST_HEAD = 64 * 1024
MAX_BUFFERED = 1024 * 1024  # bytes held for a side that does not read, each way
MAX_RECORDED_HOST = 300

log = logging.getLogger(__name__)


def refusal(host: str, port: int, decision: str, reason: str = "") -> str:
    """The 403 body a command sees."""
    where = f"{host}:{port}"
    if decision == "ask":
        return (
            f"Shiftlog: connections to {where} need a person's approval; one has been asked "
            "for — retry after it is decided\n"
        )
    if decision == "blocked":
        return (
            f"Shiftlog: connections to {where} are refused: it resolves to an address on this "
            "machine or a private network\n"
        )
    if decision == "unresolved":
        return f"Shiftlog: connections to {where} are refused: {reason or 'it does not resolve'}\n"
    if decision == "invalid":
        return f"Shiftlog: the connection is refused: {reason}\n"
    if decision == "error":
        return f"Shiftlog: the run's egress policy could not decide about {where}\n"
    return f"Shiftlog: connections to {where} are denied by this run's policy\n"


def _busy(reason: str) -> bytes:
    body = f"Shiftlog: the connection is refused: {reason}\n".encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class EgressProxy:
    """One run's egress proxy. Use as a context manager, or start() and stop()."""

    def __init__(
        self,
        socket_dir: str | os.PathLike[str],
        decide: Decide,
        record: Record,
        *,
        block_private: bool = True,
        timeout: float = 30.0,
        max_open: int = MAX_OPEN,
        max_per_command: int = MAX_PER_COMMAND,
        run_net: bool = True,
    ) -> None:
        self.socket_dir = Path(socket_dir)
        self.socket_path = self.socket_dir / SOCKET_NAME
        self.decide = decide
        self.record = record
        self.block_private = block_private
        self.timeout = timeout  # a connection idle this long (nothing sent either way) is closed
        self.max_open = max_open
        self.max_per_command = max_per_command
        self.want_run_net = run_net  # False: always the in-sandbox relay (relay.py)
        self.net: RunNet | None = None  # the run's network namespace, when one could be made
        self.net_problem = ""  # why there is none
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._flags: Any = None
        self._lock = threading.Condition()
        self._accepting = threading.Lock()
        self._open: set[_Counted] = set()
        self._command = 0  # connections accepted since the command began
        self._limited: dict[str, int] = {}  # refused at a cap since the command began, by reason

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> EgressProxy:
        if self._server is not None:
            return self

        # proxy.py's flag parsing also configures the root logger and the process's open-file
        # limit, as its command line does: not ours to change in a worker.
        setup, Logger.setup = Logger.setup, staticmethod(lambda *a, **k: None)
        try:
            self._flags = FlagParser.initialize(
                [],
                plugins=[_PolicyPlugin],
                work_klass=_Handler,
                threaded=True,
                threadless=False,
                num_acceptors=1,
                timeout=max(1, int(self.timeout)),
                enable_events=False,
                open_file_limit=0,
            )
        finally:
            Logger.setup = setup
        logging.getLogger("proxy").setLevel(logging.WARNING)
        # Each refusal is reported through record(); proxy.py would log it as a warning too.
        logging.getLogger("proxy.http.handler").setLevel(logging.ERROR)
        logging.getLogger("proxy.http.proxy.server").setLevel(logging.ERROR)
        self._flags.shiftlog_egress = self
        if len(os.fsencode(self.socket_path)) > 107:  # sun_path holds 108 bytes with its NUL
            raise ValueError(f"socket path too long for a Unix socket: {self.socket_path}")
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.socket_path))
        # The sandbox runs as another uid of a user namespace; the folder is the gate.
        os.chmod(self.socket_path, 0o666)
        server.listen(128)
        server.setblocking(False)  # accept() only after select() says one waits
        self._server = server
        self.net, self.net_problem = None, "not asked for"
        if self.want_run_net:
            try:
                self.net = RunNet.make(RELAY_PORT)
                self.net_problem = ""
            except OSError as e:  # no CAP_SYS_ADMIN here: the relay inside each sandbox
                self.net_problem = str(e)
                log.info("egress: no network namespace per run (%s); relaying per command", e)
        self._thread = threading.Thread(target=self._accept, name="egress-accept", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.end_command()
        net, self.net = self.net, None
        if net is not None:
            net.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def netns_fds(self) -> tuple[int, ...] | None:
        """The run's namespaces for setns(2) (relay.RunNet.fds), or None (then the relay runs
        inside each sandbox)."""
        net = self.net
        return net.fds if net is not None and self._server is not None else None

    def _listeners(self) -> list[socket.socket]:
        server, net = self._server, self.net
        found = [server] if server is not None else []
        if net is not None:
            found.append(net.listener)
        return found

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        while self._server is not None:
            listeners = self._listeners()
            try:
                # stop() shuts the listeners down, which ends the wait at once: the timeout is
                # only a backstop (300 runs' proxies waking 5 times a second cost a busy worker
                # 1,500 GIL hand-offs a second).
                ready = _waiting(listeners, 5.0)
            except (OSError, ValueError):
                return  # closed by stop()
            # Taken and registered under _accepting: end_command knows when none is in between.
            for server in ready:
                with self._accepting:
                    try:
                        conn, _ = server.accept()
                    except BlockingIOError:
                        continue
                    except OSError:
                        return  # closed by stop()
                    conn.setblocking(True)
                    self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        with self._lock:
            if len(self._open) >= self.max_open:
                limit = f"more than {self.max_open} connections open at once"
            elif self._command >= self.max_per_command:
                limit = f"more than {self.max_per_command} connections in one command"
            else:
                limit = ""
                counted = _Counted(conn, self)
                self._open.add(counted)
                self._command += 1
            if limit:
                self._limited[limit] = self._limited.get(limit, 0) + 1
        if limit:  # answered here, without a thread: the cost of a refusal stays flat
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(_busy(limit))
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            return
        # proxy.py's HTTP handler, in a thread of its own; the address is only for its logs.
        try:
            start_threaded_work(self._flags, counted, ("sandbox", 0))  # type: ignore[arg-type]
        except Exception:  # no thread to be had: the connection ends here, reported
            log.exception("egress: could not start a connection's thread")
            counted.close()

    def _closed(self, conn: _Counted, *, over: bool = True) -> None:
        """Report a connection, once: when it closes, or when its command ends first (then it
        still counts as open until its thread lets go of it)."""
        with self._lock:
            reported, conn.reported = conn.reported, True
        if not reported:
            host, port = conn.target or ("", 0)
            decision = conn.decision or "incomplete"
            self.report(host, port, decision, conn.received, conn.sent, conn.reason)
        if over:
            with self._lock:
                self._open.discard(conn)
                self._lock.notify_all()

    def end_command(self, wait: float = 3.0) -> dict[str, int]:
        """The command that used the proxy has returned: its connections still open are closed
        and reported now (so each attempt is filed under the command that made it), the
        per-command count starts again, and what the caps refused is returned (reason: count)."""
        deadline = time.monotonic() + wait
        listeners = self._listeners()
        # A connection still waiting in the listen queue is the command's too: let it be taken.
        while listeners and time.monotonic() < deadline:
            with self._accepting:  # none is between accept() and its registration
                try:
                    ready = _waiting(listeners, 0)
                except (OSError, ValueError):
                    break
            if not ready:
                break
            time.sleep(0.005)
        with self._lock:
            ending = list(self._open)
            limited, self._limited = self._limited, {}
            self._command = 0
        for conn in ending:
            with contextlib.suppress(OSError):
                conn.raw.shutdown(socket.SHUT_RDWR)
        with self._lock:
            while any(c in self._open for c in ending) and time.monotonic() < deadline:
                self._lock.wait(0.05)
            late = [c for c in ending if c in self._open]
        for conn in late:  # its thread is stuck (a slow lookup or connect): report it now
            self._closed(conn, over=False)
        return limited

    def ask(self, host: str, port: int) -> str:
        try:
            decision = self.decide(host, port)
        except Exception:  # a broken policy refuses; it never lets a connection through
            log.exception("egress decide(%s, %s) failed", host, port)
            return "error"
        return decision if decision in DECISIONS else "error"

    def report(
        self, host: str, port: int, decision: str, up: int, down: int, reason: str = ""
    ) -> None:
        try:
            self.record(host, port, decision, up, down, reason)
        except Exception:
            log.exception("egress record(%s, %s) failed", host[:100], port)


def _waiting(servers: list[socket.socket], timeout: float) -> list[socket.socket]:
    """The listeners a connection waits on to be accepted (poll: any fd number, unlike select);
    a closed one raises."""
    poller = select.poll()
    by_fd = {}
    for server in servers:
        fd = server.fileno()
        if fd < 0:
            raise ValueError("closed")
        by_fd[fd] = server
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(timeout * 1000) if fd in by_fd]


def _drain(conn: Any, timeout: float) -> bool:
    """Send what `conn` (a proxy.py connection) holds until at most MAX_BUFFERED is left;
    False when its peer has read nothing for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while sum(len(chunk) for chunk in conn.buffer) > MAX_BUFFERED:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        poller = select.poll()
        poller.register(conn.connection, select.POLLOUT)
        if not poller.poll(left * 1000):
            return False
        try:
            conn.flush()
        except OSError:
            return False
    return True


class _Handler(HttpProtocolHandler):  # type: ignore[misc]
    """proxy.py's HTTP handler, telling the connection who handles it (its plugin holds the
    upstream connection, whose backlog the connection's reads wait on)."""

    def initialize(self) -> None:
        super().initialize()
        conn = self.work.connection
        if isinstance(conn, _Counted):
            conn.handler = self


def _plugin_base() -> type:
    return HttpProxyBasePlugin


class _PolicyPlugin(_plugin_base()):  # type: ignore[misc]
    """proxy.py plugin: one instance per client connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.egress: EgressProxy = self.flags.shiftlog_egress
        self.address: str | None = None

    def before_upstream_connection(self, request: Any) -> Any:
        conn = self.client.connection
        counted = conn if isinstance(conn, _Counted) else _Counted(conn, None)
        raw = request.host or b""
        host = raw.decode("ascii", errors="backslashreplace")
        try:
            default = 443 if request.is_https_tunnel else 80
            port = int(request.port if request.port is not None else default)
        except (TypeError, ValueError):
            port = 0
        problem = addresses.host_problem(host)
        if problem is None and not 0 < port < 65536:
            problem = f"{port} is not a port (1-65535)"
        if problem is not None:
            # Kept escaped and short: the log and the terminals that show it get no control
            # characters and no 19 kB name.
            shown = host.encode("unicode_escape").decode("ascii")[:MAX_RECORDED_HOST]
            counted.settle(shown, port, "invalid", problem)
            raise _rejected(shown, port, "invalid", problem)
        host = addresses.normal_host(host)
        decision = self.egress.ask(host, port)
        reason = ""
        if decision == "allow":
            # Resolved here, once per connection, and the address checked is the one connected
            # to (resolve_dns hands it to proxy.py): DNS answering differently in between, or
            # not at all the first time, cannot send the connection elsewhere.
            try:
                self.address = addresses.checked_address(
                    host, port, allow_private=not self.egress.block_private
                )
            except addresses.Refused as refused:
                decision, reason = refused.decision, str(refused)
        counted.settle(host, port, decision, reason)
        if decision != "allow":
            raise _rejected(host, port, decision, reason)
        return request

    def resolve_dns(self, host: str, port: int) -> tuple[str | None, Any]:
        if self.address is None:  # never reached without a checked address; refuse all the same
            raise OSError("no checked address for this connection")
        return self.address, None

    def handle_upstream_chunk(self, chunk: Any) -> Any:
        # proxy.py reads the upstream whether or not the sandbox reads what it was sent: hold
        # at most MAX_BUFFERED for it, waiting (this connection's own thread) for it to read.
        if not _drain(self.client, self.egress.timeout):
            with contextlib.suppress(OSError):
                self.client.connection.raw.shutdown(socket.SHUT_RDWR)
            return None
        return chunk

    def on_access_log(self, context: dict[str, Any]) -> dict[str, Any] | None:
        return None  # no access log line of proxy.py's own; the report is made on close

    def on_upstream_connection_close(self) -> None:
        pass


def _rejected(host: str, port: int, decision: str, reason: str = "") -> Exception:
    return HttpRequestRejected(
        status_code=403,
        reason=b"Forbidden",
        headers={b"Content-Type": b"text/plain; charset=utf-8"},
        body=refusal(host[:MAX_RECORDED_HOST], port, decision, reason).encode(),
    )


class _Counted:
    """The sandbox's connection, counting what it sends (received) and gets (sent), and what
    was decided about it; reported to the proxy when it closes."""

    def __init__(self, raw: socket.socket, proxy: EgressProxy | None) -> None:
        self.raw = raw
        self.proxy = proxy
        self.received = 0
        self.sent = 0
        self.target: tuple[str, int] | None = None
        self.decision = ""
        self.reason = ""
        self.reported = False
        self.closed = False
        self.handler: Any = None  # proxy.py's handler of this connection (see _Handler)

    def settle(self, host: str, port: int, decision: str, reason: str = "") -> None:
        self.target, self.decision, self.reason = (host, port), decision, reason

    def recv(self, size: int, *flags: int) -> bytes:
        # The same the other way: an upstream that does not read holds up the sandbox's side.
        upstream = getattr(getattr(self.handler, "plugin", None), "upstream", None)
        live = upstream is not None and not upstream.closed and self.proxy is not None
        if live and not _drain(upstream, self.proxy.timeout):  # type: ignore[union-attr]
            return b""
        data = self.raw.recv(size, *flags)
        self.received += len(data)
        if self.target is None and self.received > MAX_REQUEST_HEAD:
            # A request that never ends is held in memory by proxy.py: it ends here.
            self.decision = "invalid"
            self.reason = f"the request's head is larger than {MAX_REQUEST_HEAD:,} bytes"
            return b""
        return data

    def send(self, data: Any, *flags: int) -> int:
        sent = self.raw.send(data, *flags)
        self.sent += sent
        return sent

    def sendall(self, data: Any, *flags: int) -> None:
        self.raw.sendall(data, *flags)
        self.sent += len(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.raw.close()
        if self.proxy is not None:
            self.proxy._closed(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
