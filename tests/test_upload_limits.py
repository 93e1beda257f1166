"""Workspace uploads to a real daphne (issue 30: a 600 MB body grew daphne from 153 to 779 MB and
got its 413 only once all of it had arrived). A body over its run's cap is refused while it
arrives, with or without a Content-Length, and one under the cap reaches the application a chunk
at a time: in neither case does the server's peak memory (VmHWM) grow by the body's size."""

from __future__ import annotations

import contextlib
import select
import socket
import sys

import pytest

from agents import services
from agents.runspec import RunSpec
from api.models import ApiToken
from tests.helpers import user_with
from tests.procs import Procs, free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

MIB = 1024 * 1024
BIG = 160 * MIB  # the body each test sends (or begins to)
MARGIN = BIG // 3  # the server may grow by this much at most


def peak_kib(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def put(port: int, path: str, token: str, total: int, *, chunked: bool) -> tuple[int, int]:
    """PUT `total` bytes (with a Content-Length, or chunked without one), stopping as soon as
    the server answers: (the answer's status, the bytes of body sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/gzip\r\n"
        + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n")
        + "\r\n"
    )
    block = b"\0" * MIB
    sent = 0
    answer = b""
    with s:
        s.sendall(head.encode())
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < total and not select.select([s], [], [], 0)[0]:
                s.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                sent += len(block)
            if sent >= total and chunked:
                s.sendall(b"0\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n\r\n" not in answer and (piece := s.recv(65536)):
                answer += piece
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1]), sent


@pytest.fixture
def server(tmp_path):
    procs = Procs(tmp_path)
    port = free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    web = procs.spawn("daphne", [*argv, "shiftlog.asgi:application"], procs.env())

    def up() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return True
        return False

    try:
        wait_for(up, timeout=60, what="daphne to listen", details=web.log)
        yield port, web
    finally:
        procs.close()


def upload_run(workspace_mb: int) -> tuple[str, str]:
    person = user_with("dev")
    run = services.create_run(
        RunSpec(
            goal="upload",
            checks=["true"],
            provider="external",
            limits={"workspace_mb": workspace_mb},
        ),
        created_by=person,
    )
    _, token = ApiToken.for_run(person, run)
    return f"/api/v1/runs/{run.pk}/workspace", token


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_upload_over_the_runs_cap_is_refused_as_it_arrives(server, chunked):
    port, web = server
    path, token = upload_run(workspace_mb=1)
    # Warm up (imports, the first request's allocations), then measure.
    assert put(port, path, token, 1024, chunked=chunked)[0] == 422  # not a .tar.gz
    before = peak_kib(web.pid)
    status, sent = put(port, path, token, BIG, chunked=chunked)
    grew = (peak_kib(web.pid) - before) * 1024
    print(f"\n413 after {sent / MIB:.0f} MB sent of {BIG / MIB:.0f}; peak grew {grew / MIB:.1f} MB")
    assert status == 413
    assert sent < BIG // 2, "the server read on past the cap"
    assert grew < MARGIN, f"the server grew by {grew / MIB:.0f} MB"
    assert "Traceback" not in web.log(), web.log()


def test_an_upload_under_the_cap_reaches_the_application_a_chunk_at_a_time(server):
    port, web = server
    path, token = upload_run(workspace_mb=1024)
    assert put(port, path, token, 1024, chunked=False)[0] == 422
    before = peak_kib(web.pid)
    status, sent = put(port, path, token, BIG, chunked=False)
    grew = (peak_kib(web.pid) - before) * 1024
    print(f"\n{BIG / MIB:.0f} MB taken whole ({status}); peak grew {grew / MIB:.1f} MB")
    assert status == 422 and sent == BIG  # all of it read, then found not to be a .tar.gz
    assert grew < MARGIN, f"the server grew by {grew / MIB:.0f} MB"


def answers(port: int, path: str, token: str, length: int) -> list[int]:
    """The statuses a client that sends `Expect: 100-continue`, and then no body, hears until the
    server closes (or 10 s of silence: a server waiting for the body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        heard = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while piece := s.recv(65536):
                heard += piece
    return [int(line.split()[1]) for line in heard.split(b"\r\n") if line.startswith(b"HTTP/1.")]


def test_a_client_that_expects_100_continue_is_refused_before_it_sends_a_byte(server):
    port, _ = server
    path, token = upload_run(workspace_mb=1)
    assert answers(port, path, token, 100 * MIB) == [413]  # over the run's cap
    assert answers(port, path, token, 600 * MIB) == [413]  # over every upload's
