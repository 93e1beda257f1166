"""Egress under policy: an HTTP(S) proxy per run that asks before every connection.

A sandboxed command has no network of its own. `EgressProxy` listens on a Unix socket in a
per-run folder outside the workspace; run_command(..., egress=proxy) binds that folder into the
sandbox and starts a tiny relay inside (see relay.py) that listens on 127.0.0.1:3128 and
forwards to the socket, and points HTTP_PROXY/HTTPS_PROXY/ALL_PROXY at it.

For every connection (a CONNECT tunnel for HTTPS, or a plain HTTP request in absolute form) the
proxy asks `decide(host, port)`:
- "allow": it connects and relays; TLS is not intercepted, only tunnelled;
- "deny": 403 at once, "... are denied by this run's policy";
- "ask": 403 at once, "... need a person's approval; one has been asked for — retry after it is
  decided". Nothing waits mid-command for a person: the command fails fast and the model retries.
Every attempt is reported, when it is over, to `record(host, port, decision, bytes_up,
bytes_down)` (bytes as the sandbox sent and received them, headers included). With
block_private (the default) an allowed name that resolves to a loopback, private, link-local or
otherwise non-public address is refused too (decision "blocked"), so "allow example.com" cannot
be turned into a way to the machine's own services or a cloud metadata endpoint by DNS.

The HTTP machinery is proxy.py's (its HttpProtocolHandler and plugin hooks, run in threads of
this process so the callbacks are plain Python calls). Pure Python, no Django: the runtime wires
the callbacks to the run's allow-list, approvals and event log.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.common.flag import FlagParser
from proxy.common.logger import Logger
from proxy.core.work.threaded import start_threaded_work
from proxy.http.exception import HttpRequestRejected
from proxy.http.handler import HttpProtocolHandler
from proxy.http.proxy import HttpProxyBasePlugin

from agents.sandbox.relay import SOCKET_NAME

Decide = Callable[[str, int], str]
Record = Callable[[str, int, str, int, int], None]
DECISIONS = ("allow", "deny", "ask")

log = logging.getLogger(__name__)


def refusal(host: str, port: int, decision: str) -> str:
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
    if decision == "error":
        return f"Shiftlog: the run's egress policy could not decide about {where}\n"
    return f"Shiftlog: connections to {where} are denied by this run's policy\n"


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


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
    ) -> None:
        self.socket_dir = Path(socket_dir)
        self.socket_path = self.socket_dir / SOCKET_NAME
        self.decide = decide
        self.record = record
        self.block_private = block_private
        self.timeout = timeout
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._flags: Any = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

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
                work_klass=HttpProtocolHandler,
                threaded=True,
                threadless=False,
                num_acceptors=1,
                timeout=int(self.timeout),
                enable_events=False,
                open_file_limit=0,
            )
        finally:
            Logger.setup = setup
        logging.getLogger("proxy").setLevel(logging.WARNING)
        # Each refusal is reported through record(); proxy.py would log it as a warning too.
        logging.getLogger("proxy.http.handler").setLevel(logging.ERROR)
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
        self._server = server
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
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        while self._server is not None:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                self._open.add(conn)
            # proxy.py's HTTP handler, in a thread of its own; the address is only for its logs.
            start_threaded_work(self._flags, _Counted(conn), ("sandbox", 0))  # type: ignore[arg-type]

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.discard(conn)

    def ask(self, host: str, port: int) -> str:
        try:
            decision = self.decide(host, port)
        except Exception:  # a broken policy refuses; it never lets a connection through
            log.exception("egress decide(%s, %s) failed", host, port)
            return "error"
        return decision if decision in DECISIONS else "error"

    def report(self, host: str, port: int, decision: str, up: int, down: int) -> None:
        try:
            self.record(host, port, decision, up, down)
        except Exception:
            log.exception("egress record(%s, %s) failed", host, port)


def _plugin_base() -> type:
    return HttpProxyBasePlugin


class _PolicyPlugin(_plugin_base()):  # type: ignore[misc]
    """proxy.py plugin: one instance per client connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.egress: EgressProxy = self.flags.shiftlog_egress
        self.target: tuple[str, int] | None = None
        self.decision = ""
        self.address: str | None = None
        self.up = 0
        self.down = 0
        self.reported = False

    def before_upstream_connection(self, request: Any) -> Any:
        host = (request.host or b"").decode("ascii", errors="replace").lower()
        port = int(request.port or (443 if request.is_https_tunnel else 80))
        self.target = (host, port)
        self.decision = self.egress.ask(host, port) if host else "deny"
        if self.decision == "allow" and self.egress.block_private:
            # Resolve once, here: the address checked is the address connected to (resolve_dns
            # hands it to proxy.py), so DNS cannot answer differently in between.
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                infos = []  # proxy.py's own resolution fails too, and answers 502
            if infos:
                self.address = str(infos[0][4][0])
                if not _public(self.address):
                    self.decision = "blocked"
        if self.decision != "allow":
            raise _rejected(host, port, self.decision)
        return request

    def resolve_dns(self, host: str, port: int) -> tuple[str | None, Any]:
        return self.address, None

    def on_access_log(self, context: dict[str, Any]) -> dict[str, Any] | None:
        self._report()
        return None  # no access log line of proxy.py's own

    def on_upstream_connection_close(self) -> None:
        pass

    def _report(self) -> None:
        if self.reported or self.target is None:
            return
        self.reported = True
        conn = self.client.connection
        if isinstance(conn, _Counted):
            self.egress._closed(conn.raw)
            self.up, self.down = conn.received, conn.sent
        self.egress.report(*self.target, self.decision, self.up, self.down)


def _rejected(host: str, port: int, decision: str) -> Exception:
    return HttpRequestRejected(
        status_code=403,
        reason=b"Forbidden",
        headers={b"Content-Type": b"text/plain; charset=utf-8"},
        body=refusal(host, port, decision).encode(),
    )


class _Counted:
    """The sandbox's connection, counting what it sends (received) and gets (sent)."""

    def __init__(self, raw: socket.socket) -> None:
        self.raw = raw
        self.received = 0
        self.sent = 0

    def recv(self, size: int, *flags: int) -> bytes:
        data = self.raw.recv(size, *flags)
        self.received += len(data)
        return data

    def send(self, data: Any, *flags: int) -> int:
        sent = self.raw.send(data, *flags)
        self.sent += sent
        return sent

    def sendall(self, data: Any, *flags: int) -> None:
        self.raw.sendall(data, *flags)
        self.sent += len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
