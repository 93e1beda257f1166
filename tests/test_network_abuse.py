"""A run's network under abuse (issue 31), through the runtime: what the proxy refuses reaches
the event log under the command that made it, and only host names someone can decide about
become approvals (on any database: a long valid name fits the approval's columns).
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.models import Approval, Event, Run, RunStatus
from agents.sandbox import isolation_available
from agents.sandbox.egress import MAX_OPEN
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is not usable here"),
]

CURL_ALLOWED = [{"tool": "bash", "action": "allow"}]
LONG_HOST = ".".join(c * 63 for c in "abc") + ".example"  # 199 characters, a valid name


def connections(run: Run) -> list[dict]:
    return list(
        Event.objects.filter(run=run, kind="network.connection")
        .order_by("seq")
        .values_list("payload", flat=True)
    )


def raw_requests(*hosts: bytes) -> str:
    """A command that sends each CONNECT through the sandbox's relay, as any program could."""
    lines = [
        "import socket",
        f"for host in {list(hosts)!r}:",
        "    s = socket.create_connection(('127.0.0.1', 3128))",
        "    s.sendall(b'CONNECT ' + host + b':443 HTTP/1.1\\r\\n\\r\\n')",
        "    print(s.recv(4096).decode('utf-8', 'replace').splitlines()[0])",
        "    s.close()",
    ]
    return "python3 - <<'EOF'\n" + "\n".join(lines) + "\nEOF"


def test_a_long_valid_host_name_becomes_an_approval_that_fits() -> None:
    run = drive_until_idle(
        make_run(
            turns=[
                {"tool_calls": [call("bash", command=f"curl -sS http://{LONG_HOST}:8080/")]},
                finish_turn(),
            ],
            tool_policy=CURL_ALLOWED,
        )
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    asked = Approval.objects.get(run=run)
    assert asked.tool_input == {"host": LONG_HOST, "port": 8080}
    assert len(asked.tool_use_id) <= 100
    assert [c["decision"] for c in connections(run)] == ["ask"]


def test_host_names_no_one_can_decide_about_are_refused_not_asked() -> None:
    bad = [
        b"<img/src=x/onerror=alert(1)>.example",
        b"evil\x1b[31m.example",
        "\ufffd.example".encode(),
        b"a" * 19_210,
        b"xn--zz.example",
    ]
    run = drive_until_idle(
        make_run(
            turns=[{"tool_calls": [call("bash", command=raw_requests(*bad))]}, finish_turn()],
            tool_policy=CURL_ALLOWED,
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert not Approval.objects.filter(run=run).exists()
    output = Event.objects.filter(run=run, kind="tool.result").order_by("seq")[0].payload["output"]
    assert output.count("HTTP/1.1 403 Forbidden") == len(bad), output
    seen = connections(run)
    assert [c["decision"] for c in seen] == ["invalid"] * len(bad)
    assert all(c["reason"] and len(c["host"]) <= 300 for c in seen), seen
    assert all(c["host"].isprintable() and c["host"].isascii() for c in seen), seen
    # The proxy's threads record the connections in the order they end, not the order made.
    assert "evil\\x1b[31m.example" in [c["host"] for c in seen]


# --- every attempt is an event of the command that made it --------------------------------------
class Site:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow_dns(monkeypatch, settings):
    """slow.example resolves, after 1.5 s, to a site on this machine's loopback."""
    settings.SHIFTLOG = {**settings.SHIFTLOG, "EGRESS_ALLOW_PRIVATE": True}
    site = Site()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "slow.example":
            time.sleep(1.5)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", site.port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield site
    site.close()


def test_a_connection_still_under_way_when_its_command_returns_is_filed_under_it(slow_dns):
    site = slow_dns
    run = drive_until_idle(
        make_run(
            turns=[
                {
                    "tool_calls": [
                        call("bash", command=f"curl -sS -m 0.3 http://slow.example:{site.port}/")
                    ]
                },
                {"tool_calls": [call("bash", command="echo second")]},
                finish_turn(),
            ],
            allowed_hosts=["slow.example"],
            tool_policy=CURL_ALLOWED,
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    [seen] = Event.objects.filter(run=run, kind="network.connection")
    assert (seen.payload["host"], seen.payload["decision"]) == ("slow.example", "allow")
    first, second, _finish = Event.objects.filter(run=run, kind="tool.call").order_by("seq")
    assert first.seq < seen.seq < second.seq  # after the first command, before the second


def test_connections_over_the_cap_are_refused_and_logged() -> None:
    held = 60
    command = "\n".join(
        [
            "python3 - <<'EOF'",
            "import socket, time",
            "held = []",
            f"for _ in range({held}):",
            "    s = socket.create_connection(('127.0.0.1', 3128))",
            "    s.sendall(b'CONNECT exam')",
            "    held.append(s)",
            "time.sleep(1)",
            "EOF",
        ]
    )
    run = drive_until_idle(
        make_run(
            turns=[{"tool_calls": [call("bash", command=command)]}, finish_turn()],
            tool_policy=CURL_ALLOWED,
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    seen = connections(run)
    assert [c["decision"] for c in seen] == ["incomplete"] * MAX_OPEN + ["limited"]
    assert seen[-1]["count"] == held - MAX_OPEN
    assert seen[-1]["reason"] == f"more than {MAX_OPEN} connections open at once"


# --- DNS rebinding after "allow for this run" ---------------------------------------------------
class Listener:
    """A TCP server on 127.0.0.1 (where Redis would be) that counts who reached it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reached = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.reached += 1
            with conn:
                conn.sendall(b"+PONG\r\n")

    def close(self) -> None:
        self.server.close()


def test_a_host_allowed_for_the_run_whose_dns_fails_then_points_home_reaches_nothing(
    monkeypatch, supervisor
):
    from tests.helpers import client_for

    listener = Listener()
    lookups = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "rebind.example":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        if len(lookups) == 1:  # the proxy's check
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    fetch = f"curl -sS -m 10 http://rebind.example:{listener.port}/; echo"
    try:
        run = drive_until_idle(
            make_run(
                turns=[
                    {"tool_calls": [call("bash", command=fetch)]},
                    {"tool_calls": [call("bash", command=fetch)]},
                    finish_turn(),
                ],
                tool_policy=CURL_ALLOWED,
            )
        )
        asked = Approval.objects.get(run=run)
        client_for(supervisor).post(
            f"/approvals/{asked.pk}/decide",
            {"decision": "approve-for-run"},
            HTTP_HX_REQUEST="true",
        )
        run = drive_until_idle(run)
    finally:
        listener.close()
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert listener.reached == 0
    seen = connections(run)
    assert [c["decision"] for c in seen] == ["ask", "unresolved"], seen
    assert "could not be resolved" in seen[1]["reason"]


def test_a_command_puts_a_few_new_hosts_to_people_not_a_hundred() -> None:
    from agents.runtime.network import MAX_QUESTIONS

    fetch = "for i in $(seq 1 12); do curl -s -o /dev/null http://h$i.example/; done; true"
    run = drive_until_idle(
        make_run(
            turns=[{"tool_calls": [call("bash", command=fetch)]}, finish_turn()],
            tool_policy=CURL_ALLOWED,
        )
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    asked = Approval.objects.filter(run=run).order_by("pk")
    assert [a.tool_input["host"] for a in asked] == [f"h{i}.example" for i in range(1, 6)]
    assert MAX_QUESTIONS == 5
    seen = connections(run)
    assert len(seen) == 12 and {c["decision"] for c in seen} == {"ask"}
    assert [c.get("reason", "") for c in seen[5:]] == [
        "not asked: more than 5 new hosts in one command"
    ] * 7
