"""The egress proxy under abuse (issue 31): DNS that fails and then points at this machine, host
names no one could decide about, and more connections than a run should cost.

Real parts throughout: the proxy, its Unix socket, a real command in the sandbox where the
sandbox matters, and a real listener on this machine's loopback that must not be reached. Only
name resolution is played, in-process (`socket.getaddrinfo` answers for one made-up name), which
is where an attacker's DNS server would answer.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.sandbox import Workspace, addresses, isolation_available, run_command
from agents.sandbox.egress import MAX_OPEN, EgressProxy
from tests.sandboxing import host_folder, remove_folder

pytestmark = [pytest.mark.no_services]
needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap" or shutil.which("curl") is None,
    reason="egress needs bubblewrap, and these tests curl",
)

REBIND = "rebind.example"


class Policy:
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[tuple[str, int]] = []
        self.records: list[tuple[str, int, str, int, int, str]] = []

    def decide(self, host: str, port: int) -> str:
        self.asked.append((host, port))
        return self.table.get(host, "ask")

    def record(self, host: str, port: int, decision: str, up: int, down: int, reason="") -> None:
        self.records.append((host, port, decision, up, down, reason))

    def wait_records(self, n: int) -> list[tuple[str, int, str, int, int, str]]:
        deadline = time.monotonic() + 10
        while len(self.records) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.records


class Listener:
    """A TCP server on 127.0.0.1 that answers like Redis and counts who reached it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reached = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.reached += 1
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                conn.recv(4096)
                conn.sendall(b"+PONG\r\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    started = Listener()
    yield started
    started.close()


@pytest.fixture
def folder() -> Iterator[Path]:
    path = host_folder("shiftlog-egress-abuse-")
    try:
        yield path
    finally:
        remove_folder(path)


class Rebinding:
    """DNS for one name: it fails (NXDOMAIN) the first `failures` times, then answers
    `address`. Every other name is resolved as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: list[list[str] | None]) -> None:
        self.answers = answers
        self.lookups = 0
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            name = host.decode() if isinstance(host, bytes) else host
            if name != REBIND:
                return real(host, port, *args, **kwargs)
            answer = self.answers[min(self.lookups, len(self.answers) - 1)]
            self.lookups += 1
            if answer is None:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [
                (
                    socket.AF_INET6 if ":" in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (a, int(port or 0)),
                )
                for a in answer
            ]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def sandboxed(command: str, folder: Path, proxy: EgressProxy) -> str:
    ws = Workspace(folder / "ws")
    result = run_command(command, workspace=ws, isolation="bwrap", egress=proxy, timeout=30)
    return result.output


# --- 1. DNS rebinding through a failed lookup ---------------------------------------------------
@pytest.mark.parametrize("how", ["http", "connect"])
@pytest.mark.parametrize("block_private", [True, False], ids=["default", "allow-private"])
@needs_bwrap
def test_a_name_that_fails_to_resolve_then_points_at_loopback_reaches_nothing(
    monkeypatch, folder: Path, listener: Listener, how: str, block_private: bool
) -> None:
    # NXDOMAIN to the proxy's check, 127.0.0.1 to whoever asks next (the proxy library).
    Rebinding(monkeypatch, [None, ["127.0.0.1"]])
    policy = Policy({REBIND: "allow"})  # allowed, or approved for the run: the same decision
    url = f"http://{REBIND}:{listener.port}/"
    tunnel = "-p " if how == "connect" else ""
    with EgressProxy(
        folder / "egress", policy.decide, policy.record, block_private=block_private
    ) as proxy:
        out = sandboxed(f"curl -sS -i -m 10 {tunnel}{url}", folder, proxy)
        assert listener.reached == 0, out
        assert "403" in out and "PONG" not in out, out
        if how == "http":  # curl shows no body of a CONNECT's answer
            assert f"{REBIND} could not be resolved" in out, out
        [record] = policy.wait_records(1)
        assert record[:3] == (REBIND, listener.port, "unresolved")
        assert "could not be resolved" in record[5]
        if block_private:
            # Checked again on every connection: now it resolves, to this machine, and is refused.
            out = sandboxed(f"curl -sS -i -m 10 {tunnel}{url}", folder, proxy)
            assert "403" in out, out
            if how == "http":
                assert "resolves to an address on this machine" in out, out
            assert policy.wait_records(2)[1][2] == "blocked"
    assert listener.reached == 0


@pytest.mark.parametrize(
    "answer",
    [
        ["93.184.215.14", "127.0.0.1"],  # a public address first, this machine second
        ["::ffff:127.0.0.1"],
        ["64:ff9b::7f00:1"],  # NAT64 of 127.0.0.1
        ["2002:7f00:1::1"],  # 6to4 of 127.0.0.1
        ["169.254.169.254"],  # a cloud's metadata service
        ["fe80::1%lo"],
        ["100.64.0.1"],
        ["0.0.0.0"],
    ],
)
def test_every_address_a_name_resolves_to_is_checked(monkeypatch, answer: list[str]) -> None:
    monkeypatch.setattr(addresses, "resolve", lambda host, port: answer)
    with pytest.raises(addresses.Refused, match="an address on this machine or a private"):
        addresses.checked_address("somewhere.example", 443)
    monkeypatch.setattr(addresses, "resolve", lambda host, port: ["93.184.215.14"])
    assert addresses.checked_address("somewhere.example", 443) == "93.184.215.14"


# --- 4. host names no one can decide about ------------------------------------------------------
def exchange(proxy: EgressProxy, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes to the proxy's socket (as a command could, through the relay or the
    socket itself) and read the answer to its end."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(proxy.socket_path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)  # one refused at a cap is answered and closed before it is read
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


BAD_HOSTS = [
    b"<script>alert(1)</script>.example",
    b"evil\x1b[2J.example",
    "\ufffd.example".encode(),
    "b\u00fccher.example".encode(),  # Unicode, not an A-label
    b"a" * 19_210 + b".example",
    b"xn--zz.example",  # not valid IDNA
    b"ab--cd.example",
    b"-dash.example",
    b"a..b.example",
    b"x" * 64 + b".example",  # a label longer than 63
    b".".join([b"a" * 63] * 4) + b".example",  # longer than 253
    b"under_score.example",
    b"tab\t.example",
]


@pytest.mark.parametrize("method", ["CONNECT", "GET"])
@pytest.mark.parametrize("host", BAD_HOSTS, ids=range(len(BAD_HOSTS)))
def test_a_host_name_no_one_can_decide_about_is_refused_with_the_reason(
    folder: Path, host: bytes, method: str
) -> None:
    policy = Policy({})
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        if method == "CONNECT":
            request = b"CONNECT " + host + b":443 HTTP/1.1\r\nHost: " + host + b":443\r\n\r\n"
        else:
            request = b"GET http://" + host + b"/ HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
        answer = exchange(proxy, request)
        proxy.end_command()
    assert policy.asked == []  # never a question for a person
    [(recorded, _, decision, *_rest, reason)] = policy.records
    assert decision in ("invalid", "incomplete"), policy.records
    assert len(recorded) <= 300 and recorded.isprintable() and recorded.isascii()
    if decision == "invalid":
        assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
        assert b"Shiftlog: the connection is refused: " in answer, answer[-300:]
        assert reason.startswith("the host name") or reason.startswith("a label"), reason


@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "xn--bcher-kva.example",
        "a-b.c0.example.",
        ".".join(["a" * 63] * 3) + ".example",
        "127.0.0.1",
        "::1",
        "[::1]",
    ],
)
def test_a_host_name_that_can_be_decided_about_passes(host: str) -> None:
    assert addresses.host_problem(host) is None


@pytest.mark.parametrize("port", [b"0", b"70000", b"-1"])
def test_a_port_that_is_no_port_is_refused_too(folder: Path, port: bytes) -> None:
    policy = Policy({})
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        exchange(proxy, b"CONNECT example.com:" + port + b" HTTP/1.1\r\n\r\n")
        proxy.end_command()
    assert policy.asked == []
    assert policy.records and policy.records[0][2] in ("invalid", "incomplete")


# --- 2. what the proxy costs, whatever the command does -----------------------------------------
def test_held_connections_are_capped_and_cost_no_thread_each(folder: Path) -> None:
    policy = Policy({})
    held: list[socket.socket] = []
    threads_before = threading.active_count()
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        try:
            for _ in range(400):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(proxy.socket_path))
                held.append(s)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    s.sendall(b"CONNECT exam")  # a request that never ends (or refused first)
            deadline = time.monotonic() + 10
            while proxy.open_connections < MAX_OPEN and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            assert proxy.open_connections == MAX_OPEN
            assert threading.active_count() - threads_before <= MAX_OPEN + 2
            # The ones over the cap were answered at once, with the reason.
            last = held[-1]
            last.settimeout(5)
            answer = last.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert f"more than {MAX_OPEN} connections open at once".encode() in answer
            limited = proxy.end_command()
        finally:
            for s in held:
                s.close()
    assert limited == {f"more than {MAX_OPEN} connections open at once": 400 - MAX_OPEN}
    # Every held one is reported (the command ended while they were open).
    assert len(policy.records) == MAX_OPEN
    assert {r[2] for r in policy.records} == {"incomplete"}
    deadline = time.monotonic() + 5  # the threads end a moment after their connections
    while threading.active_count() - threads_before > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() - threads_before <= 0


def test_connections_per_command_are_capped_and_counted_again_per_command(folder: Path) -> None:
    policy = Policy({"denied.example": "deny"})
    request = b"GET http://denied.example/ HTTP/1.1\r\nHost: denied.example\r\n\r\n"
    with EgressProxy(folder / "egress", policy.decide, policy.record, max_per_command=5) as proxy:
        answers = [exchange(proxy, request) for _ in range(8)]
        assert all(a.startswith(b"HTTP/1.1 403") for a in answers[:5])
        assert all(a.startswith(b"HTTP/1.1 503") for a in answers[5:])
        assert b"more than 5 connections in one command" in answers[-1]
        assert proxy.end_command() == {"more than 5 connections in one command": 3}
        assert exchange(proxy, request).startswith(b"HTTP/1.1 403")  # the next command's
    assert [r[2] for r in policy.wait_records(6)] == ["deny"] * 6


def test_a_request_head_that_never_ends_is_cut_off(folder: Path) -> None:
    policy = Policy({})
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(proxy.socket_path))
            s.sendall(b"GET http://example.com/ HTTP/1.1\r\n")
            with contextlib.suppress(OSError):
                for _ in range(200):
                    s.sendall(b"X-Filler: " + b"y" * 1000 + b"\r\n")
            with contextlib.suppress(OSError):
                while s.recv(65536):
                    pass
        [record] = policy.wait_records(1)
    assert record[2] == "invalid" and "larger than 65,536 bytes" in record[5]
    assert policy.asked == []


def test_an_idle_connection_is_closed(folder: Path) -> None:
    policy = Policy({})
    with EgressProxy(folder / "egress", policy.decide, policy.record, timeout=1) as proxy:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(proxy.socket_path))
            started = time.monotonic()
            assert s.recv(100) == b""  # closed by the proxy, not by this test
            assert time.monotonic() - started < 5
        policy.wait_records(1)
        assert proxy.open_connections == 0
    assert policy.records[0][2] == "incomplete"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Flood:
    """A server on this machine's loopback that sends without end, or reads nothing."""

    def __init__(self, *, send: bool) -> None:
        self.server = socket.create_server(("127.0.0.2", 0))
        self.port = self.server.getsockname()[1]
        self.send = send
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        chunk = b"x" * (1024 * 1024)
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            self.conns.append(conn)
            while self.send:
                conn.sendall(chunk)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)


@pytest.mark.parametrize("way", ["down", "up"])
def test_a_side_that_does_not_read_costs_the_worker_no_memory(folder: Path, way: str) -> None:
    flood = Flood(send=way == "down")
    policy = Policy({"127.0.0.2": "allow"})
    try:
        with EgressProxy(
            folder / "egress", policy.decide, policy.record, block_private=False, timeout=5
        ) as proxy:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(proxy.socket_path))
                s.sendall(f"CONNECT 127.0.0.2:{flood.port} HTTP/1.1\r\n\r\n".encode())
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
                before = rss_mb()
                if way == "down":  # the upstream sends, the sandbox reads nothing
                    time.sleep(2)
                else:  # the sandbox sends, the upstream reads nothing
                    s.setblocking(False)
                    chunk = b"y" * (1024 * 1024)
                    deadline = time.monotonic() + 2
                    while time.monotonic() < deadline:
                        with contextlib.suppress(BlockingIOError):
                            s.send(chunk)
                grown = rss_mb() - before
            proxy.end_command()
    finally:
        flood.close()
    assert grown < 64, f"the worker grew by {grown:.0f} MB"
