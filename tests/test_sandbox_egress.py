"""Egress under policy, end to end: a real command in the sandbox, the relay, the proxy, and
servers on this machine's loopback (127.0.0.2, which the sandbox's NO_PROXY does not cover).
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import shutil
import ssl
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.sandbox import Workspace, isolation_available, run_command
from agents.sandbox.egress import EgressProxy
from tests.sandboxing import host_folder, live_processes_with, remove_folder

pytestmark = [
    pytest.mark.no_services,
    pytest.mark.skipif(isolation_available() != "bwrap", reason="egress needs bubblewrap"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
]

HOST = "127.0.0.2"
BODY = b"hello from the host\n" * 500  # 10 000 bytes: bigger than any header


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Server:
    port: int
    url: str


@contextlib.contextmanager
def serving(server: http.server.ThreadingHTTPServer, scheme: str) -> Iterator[Server]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield Server(port, f"{scheme}://{HOST}:{port}/")
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_server() -> Iterator[Server]:
    with serving(http.server.ThreadingHTTPServer((HOST, 0), _Handler), "http") as server:
        yield server


@pytest.fixture
def folder() -> Iterator[Path]:
    path = host_folder("shiftlog-egress-")
    try:
        yield path
    finally:
        remove_folder(path)


@pytest.fixture
def ws(folder: Path) -> Workspace:
    return Workspace(folder / "ws")


class Policy:
    """decide() from a table; record() keeps every report."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[tuple[str, int]] = []
        self.records: list[tuple[str, int, str, int, int]] = []

    def decide(self, host: str, port: int) -> str:
        self.asked.append((host, port))
        return self.table.get(host, "ask")

    def record(
        self, host: str, port: int, decision: str, up: int, down: int, reason: str = ""
    ) -> None:
        self.records.append((host, port, decision, up, down))

    def wait_records(self, n: int) -> list[tuple[str, int, str, int, int]]:
        deadline = time.monotonic() + 5
        while len(self.records) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.records


@pytest.fixture
def policy() -> Policy:
    return Policy({HOST: "allow", "denied.example": "deny"})


@pytest.fixture
def proxy(folder: Path, policy: Policy) -> Iterator[EgressProxy]:
    # Loopback is what the tests may use; the default refuses it (see test_private_...).
    with EgressProxy(folder / "egress", policy.decide, policy.record, block_private=False) as p:
        yield p


def sh(command: str, ws: Workspace, proxy: EgressProxy | None, **kwargs) -> tuple[int | None, str]:
    result = run_command(
        command, workspace=ws, isolation="bwrap", egress=proxy, timeout=30, **kwargs
    )
    return result.exit_code, result.output


def test_allowed_host_is_reached_and_recorded(
    ws: Workspace, proxy: EgressProxy, policy: Policy, http_server: Server
) -> None:
    code, out = sh(f"curl -sS -o body.txt -w '%{{http_code}}' {http_server.url}", ws, proxy)
    assert (code, out) == (0, "200"), out
    assert (ws.path / "body.txt").read_bytes() == BODY
    [(host, port, decision, up, down)] = policy.wait_records(1)
    assert (host, port, decision) == (HOST, http_server.port, "allow")
    assert 50 < up < 1000  # the request
    assert len(BODY) < down < len(BODY) + 1000  # the response with its headers
    assert policy.asked == [(HOST, http_server.port)]


def test_python_urllib_uses_the_proxy_from_the_environment(
    ws: Workspace, proxy: EgressProxy, policy: Policy, http_server: Server
) -> None:
    code, out = sh(
        "env | grep -i _proxy= | sort; "
        f"python3 -c \"import urllib.request as u; print(len(u.urlopen('{http_server.url}').read()))\"",
        ws,
        proxy,
    )
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-1] == str(len(BODY))
    names = {line.split("=", 1)[0] for line in lines[:-1]}
    assert names >= {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy"}


def test_denied_host_is_refused_at_once_with_the_reason(
    ws: Workspace, proxy: EgressProxy, policy: Policy
) -> None:
    _, out = sh("curl -sS -i http://denied.example/", ws, proxy)
    assert "403 Forbidden" in out
    assert "Shiftlog: connections to denied.example:80 are denied by this run's policy" in out
    [record] = policy.wait_records(1)
    assert record[:3] == ("denied.example", 80, "deny") and record[4] > 0


def test_asking_refuses_at_once_and_is_recorded_as_asked(
    ws: Workspace, proxy: EgressProxy, policy: Policy
) -> None:
    started = time.monotonic()
    _, out = sh("curl -sS -i http://unknown.example:8080/x", ws, proxy)
    assert time.monotonic() - started < 15  # no compute waits for a person
    assert (
        "Shiftlog: connections to unknown.example:8080 need a person's approval; one has been "
        "asked for — retry after it is decided" in out
    ), out
    assert policy.wait_records(1)[0][:3] == ("unknown.example", 8080, "ask")


def test_direct_connections_fail_without_the_proxy(
    ws: Workspace, proxy: EgressProxy, policy: Policy, http_server: Server
) -> None:
    direct = f"curl -sS --noproxy '*' -o /dev/null -w '%{{http_code}}' {http_server.url}"
    code, out = sh(direct, ws, proxy)
    assert code == 7 and "Couldn't connect to server" in out, out
    assert policy.records == []  # the proxy never saw it
    # Positive control: the same command outside the sandbox reaches the server.
    result = run_command(direct, workspace=ws, isolation="subprocess", timeout=30)
    assert result.output == "200"


def test_dns_does_not_work_inside(ws: Workspace, proxy: EgressProxy) -> None:
    code, out = sh(
        "python3 -c \"import socket; print(socket.getaddrinfo('localhost', 80)[0][4][0])\"; "
        "python3 -c \"import socket; socket.getaddrinfo('example.com', 80)\"",
        ws,
        proxy,
    )
    assert out.splitlines()[0] in ("127.0.0.1", "::1"), out  # /etc/hosts works (control)
    assert "gaierror" in out and code != 0, out


def test_without_egress_there_is_no_network_and_no_proxy(
    ws: Workspace, http_server: Server
) -> None:
    _, out = sh(f"env | grep -ci proxy; curl -sS {http_server.url}", ws, None)
    assert out.startswith("0\n") and "Couldn't connect to server" in out, out


def test_the_relay_does_not_outlive_the_command(
    folder: Path, ws: Workspace, policy: Policy, http_server: Server
) -> None:
    # The relay inside the sandbox: what a worker that cannot make the run's network namespace
    # uses (with one there is no relay process at all: tests/test_egress_run_net.py).
    with EgressProxy(
        folder / "relayed", policy.decide, policy.record, block_private=False, run_net=False
    ) as relayed:
        _, out = sh(
            f"curl -sS -o /dev/null -w '%{{http_code}} ' {http_server.url}; "
            "cat /proc/[0-9]*/comm | grep -c python; sleep 0.2; echo done",
            ws,
            relayed,
        )
    assert out == "200 1\ndone\n", out
    assert live_processes_with("/run/shiftlog/egress.sock") == []


def test_private_addresses_are_blocked_by_default(
    folder: Path, ws: Workspace, http_server: Server
) -> None:
    policy = Policy({HOST: "allow"})
    with EgressProxy(folder / "egress2", policy.decide, policy.record) as proxy:
        _, out = sh(f"curl -sS -i {http_server.url}", ws, proxy)
    assert "403 Forbidden" in out and "resolves to an address on this machine" in out, out
    assert policy.wait_records(1)[0][:3] == (HOST, http_server.port, "blocked")


def test_a_failing_policy_refuses(folder: Path, ws: Workspace, http_server: Server) -> None:
    records = []

    def decide(host: str, port: int) -> str:
        raise RuntimeError("database is locked")

    with EgressProxy(
        folder / "egress3", decide, lambda *r: records.append(r), block_private=False
    ) as proxy:
        _, out = sh(f"curl -sS -i {http_server.url}", ws, proxy)
    assert "403 Forbidden" in out and "could not decide" in out, out


# --- HTTPS through CONNECT ----------------------------------------------------------------------
def _certificate(folder: Path) -> tuple[Path, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shiftlog-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def https_server(folder: Path) -> Iterator[Server]:
    cert, key = _certificate(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer((HOST, 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with serving(server, "https") as info:
        yield info


def test_https_through_connect_when_allowed(
    folder: Path, ws: Workspace, proxy: EgressProxy, policy: Policy, https_server: Server
) -> None:
    (ws.path / "ca.pem").write_bytes((folder / "cert.pem").read_bytes())
    code, out = sh(
        f"curl -sS --cacert ca.pem -o body.txt -w '%{{http_code}}' {https_server.url}", ws, proxy
    )
    assert (code, out) == (0, "200"), out
    assert (ws.path / "body.txt").read_bytes() == BODY
    [(host, port, decision, up, down)] = policy.wait_records(1)
    assert (host, port, decision) == (HOST, https_server.port, "allow")
    assert down > len(BODY)  # encrypted, tunnelled, counted
    assert up > 300  # CONNECT plus the TLS handshake and the request

    policy.table[HOST] = "deny"
    code, out = sh(f"curl -sS --cacert ca.pem {https_server.url}", ws, proxy)
    assert code != 0 and "403" in out, out
    assert policy.wait_records(2)[1][2] == "deny"


# --- what it costs ------------------------------------------------------------------------------
@pytest.mark.slow
def test_overhead_of_the_proxy_and_the_relay(folder: Path, ws: Workspace, policy: Policy) -> None:
    started = time.monotonic()
    proxy = EgressProxy(folder / "egress4", policy.decide, policy.record).start()
    start_ms = (time.monotonic() - started) * 1000
    try:

        def median_ms(egress: EgressProxy | None) -> float:
            times = []
            for _ in range(10):
                result = run_command("true", workspace=ws, isolation="bwrap", egress=egress)
                assert result.exit_code == 0, result.output
                times.append(result.duration_ms)
            return statistics.median(times)

        plain, relayed = median_ms(None), median_ms(proxy)
    finally:
        started = time.monotonic()
        proxy.stop()
        stop_ms = (time.monotonic() - started) * 1000
    print(
        f"\negress overhead: proxy start {start_ms:.1f} ms, stop {stop_ms:.1f} ms; "
        f"command without egress {plain:.1f} ms, with the relay {relayed:.1f} ms "
        f"(+{relayed - plain:.1f} ms)"
    )
    assert relayed - plain < 1000
    assert not proxy.socket_path.exists()


def test_a_socket_path_too_long_is_refused(folder: Path, policy: Policy) -> None:
    proxy = EgressProxy(folder / ("x" * 120), policy.decide, policy.record)
    with pytest.raises(ValueError, match="too long"):
        proxy.start()
