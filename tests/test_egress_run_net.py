"""The run's network namespace (agents/sandbox/relay.py): made once when the run's proxy starts,
every command of the run started into it, no relay process per command; it ends with the proxy
and with a killed worker, a command that cannot enter it never runs, and each connection is still
filed under the command that made it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.sandbox import Workspace, isolation_available, run_command
from agents.sandbox.egress import EgressProxy
from agents.sandbox.relay import RELAY_PORT, RunNet
from tests.sandboxing import gone_within, host_folder, marker, remove_folder


def _run_net_possible() -> bool:
    try:
        RunNet.make(0).close()
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.no_services,
    pytest.mark.skipif(isolation_available() != "bwrap", reason="egress needs bubblewrap"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="these tests curl"),
    pytest.mark.skipif(not _run_net_possible(), reason="no network namespace can be made here"),
]

ROOT = Path(__file__).resolve().parent.parent
# How a helper-made namespace is forced (as an unprivileged worker gets it), in this process or
# in a worker started by a test.
FORCE_HELPER = (
    "from agents.sandbox.relay import RunNet\n"
    "_make = RunNet.make.__func__\n"
    "RunNet.make = classmethod(lambda cls, port=3128, helper=None: _make(cls, port, helper=True))\n"
)


@pytest.fixture(autouse=True, params=["worker", "helper"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Made by the worker itself (it has CAP_SYS_ADMIN), or by a helper in a user namespace of
    its own (what an unprivileged worker does)."""
    if request.param == "helper":
        make = RunNet.make.__func__  # type: ignore[attr-defined]

        def forced(cls: type[RunNet], port: int = RELAY_PORT, helper: bool | None = None) -> RunNet:
            return make(cls, port, helper=True)

        monkeypatch.setattr(RunNet, "make", classmethod(forced))
    return request.param


class Policy:
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.records: list[tuple[str, int, str]] = []

    def decide(self, host: str, port: int) -> str:
        return self.table.get(host, "deny")

    def record(self, host: str, port: int, decision: str, up: int, down: int, reason="") -> None:
        self.records.append((host, port, decision))


@pytest.fixture
def folder() -> Iterator[Path]:
    path = host_folder("shiftlog-runnet-")
    try:
        yield path
    finally:
        remove_folder(path)


@pytest.fixture
def ws(folder: Path) -> Workspace:
    return Workspace(folder / "ws")


def sh(command: str, ws: Workspace, proxy: EgressProxy | None, **kwargs) -> tuple[int | None, str]:
    result = run_command(
        command, workspace=ws, isolation="bwrap", egress=proxy, timeout=30, **kwargs
    )
    return result.exit_code, result.output


def holders(inode: int) -> list[str]:
    """Every process (thread) in network namespace `inode`, and every descriptor open on it."""
    link = f"net:[{inode}]"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for tid in _listed(f"/proc/{pid}/task"):
            if _points_at(f"/proc/{pid}/task/{tid}/ns/net", link):
                found.append(f"process {pid} (thread {tid})")
        for fd in _listed(f"/proc/{pid}/fd"):
            if _points_at(f"/proc/{pid}/fd/{fd}", link):
                found.append(f"descriptor {fd} of process {pid}")
    return found


def _listed(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:  # the process ended meanwhile
        return []


def _points_at(path: str, link: str) -> bool:
    try:
        return os.readlink(path) == link
    except OSError:
        return False


def test_every_command_of_a_run_is_in_its_network_and_no_relay_is_started(
    folder: Path, ws: Workspace, way: str
) -> None:
    policy = Policy({"denied.example": "deny"})
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        assert proxy.net is not None and proxy.net_problem == ""
        assert (proxy.net.userns_fd is not None) == (way == "helper")
        seen = []
        for _ in range(3):
            _code, out = sh(
                "readlink /proc/self/ns/net; "
                "curl -sS -o /dev/null -w '%{http_code}\\n' http://denied.example/; "
                "cat /proc/[0-9]*/comm | tr '\\n' ' '; echo; ls /run/shiftlog",
                ws,
                proxy,
            )
            proxy.end_command()
            lines = out.splitlines()
            seen.append(lines[0])
            assert lines[1] == "403", out  # the proxy answered, through the run's listener
            assert "python" not in lines[2], out  # no relay process beside the command
            assert "sh" in lines[2].split(), out  # (control: the command's own processes)
            assert "No such file or directory" in out, out  # no socket bound in either
        assert seen == [f"net:[{proxy.net.inode}]"] * 3
        # Started into the run's network, a command still holds only its own three descriptors
        # (none of the namespaces' nor the fork server's).
        _, out = sh("ls /proc/$$/fd", ws, proxy)
        assert out.split() == ["0", "1", "2"]
        assert [r[2] for r in policy.records] == ["deny"] * 3

        # Another run's proxy has a namespace of its own: the two never meet.
        with EgressProxy(folder / "egress2", policy.decide, policy.record) as other:
            assert other.net is not None and other.net.inode != proxy.net.inode
            _, out = sh("readlink /proc/self/ns/net", ws, other)
            assert out.strip() == f"net:[{other.net.inode}]"

        # Without egress a command still gets a new, empty namespace of its own.
        _, out = sh("readlink /proc/self/ns/net", ws, None)
        assert out.strip() not in (f"net:[{proxy.net.inode}]", "")
        # And the fork server that started the run's commands is back in the worker's own (a
        # plain subprocess from the same slot has the host's network).
        plain = run_command("readlink /proc/self/ns/net", workspace=ws, isolation="subprocess")
        assert plain.output.strip() == os.readlink("/proc/self/ns/net")


def test_the_run_network_ends_with_the_proxy(folder: Path, ws: Workspace) -> None:
    policy = Policy({})
    proxy = EgressProxy(folder / "egress", policy.decide, policy.record).start()
    try:
        net = proxy.net
        assert net is not None
        _code, out = sh("readlink /proc/self/ns/net", ws, proxy)
        assert out.strip() == f"net:[{net.inode}]"
        assert holders(net.inode) == [f"descriptor {net.fd} of process {os.getpid()}"]
    finally:
        proxy.stop()
    assert proxy.net is None and proxy.netns_fds is None
    assert net.fd == -1 and net.listener.fileno() == -1
    assert holders(net.inode) == []


def test_a_killed_worker_leaves_no_command_and_no_network_behind(
    folder: Path, ws: Workspace, way: str
) -> None:
    mark = marker()
    worker = (FORCE_HELPER if way == "helper" else "") + textwrap.dedent(
        f"""
        from agents.sandbox import Workspace, run_command
        from agents.sandbox.egress import EgressProxy
        proxy = EgressProxy({str(folder / "egress")!r}, lambda h, p: "deny", lambda *a: None)
        proxy.start()
        run_command(
            "readlink /proc/self/ns/net > ns.tmp && mv ns.tmp ns.txt; sleep {mark}",
            workspace=Workspace({str(ws.path)!r}), isolation="bwrap", egress=proxy, timeout=600,
        )
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", worker], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not (ws.path / "ns.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        link = (ws.path / "ns.txt").read_text().strip()
        inode = int(link.removeprefix("net:[").removesuffix("]"))
        assert holders(inode), "the command should be in the run's namespace while it runs"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert gone_within(f"sleep {mark}", 10)
        deadline = time.monotonic() + 10
        while holders(inode) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holders(inode) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_connections_stay_filed_under_the_command_that_made_them(
    folder: Path, ws: Workspace
) -> None:
    policy = Policy({})
    curl = "curl -sS -o /dev/null --max-time 5 http://{}/"
    with EgressProxy(folder / "egress", policy.decide, policy.record) as proxy:
        # The first command leaves a job behind that would connect a second later.
        sh(
            f"(sleep 1; {curl.format('late.example')}) >/dev/null 2>&1 & "
            f"{curl.format('first.example')}",
            ws,
            proxy,
        )
        proxy.end_command()
        first, policy.records = policy.records, []
        _code, _ = sh(f"sleep 2; {curl.format('second.example')}", ws, proxy)
        proxy.end_command()
        second = policy.records
    assert first == [("first.example", 80, "deny")]
    # The job died with its command: nothing of it reached the proxy during the next one.
    assert second == [("second.example", 80, "deny")]


def test_a_command_that_cannot_enter_the_run_network_does_not_run(
    folder: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy({})
    with (
        EgressProxy(folder / "egress", policy.decide, policy.record) as proxy,
        open(folder / "not-a-namespace", "w") as wrong,
    ):
        monkeypatch.setattr(EgressProxy, "netns_fds", property(lambda self: (wrong.fileno(),)))
        code, out = sh("touch ran; echo ran", ws, proxy)
    assert code == 125 and "cannot enter the run's network namespace" in out, out
    assert not (ws.path / "ran").exists()


def test_without_a_run_network_the_relay_inside_still_works(folder: Path, ws: Workspace) -> None:
    policy = Policy({})
    with EgressProxy(folder / "egress", policy.decide, policy.record, run_net=False) as proxy:
        assert proxy.net is None and proxy.netns_fds is None
        _code, out = sh("curl -sS -o /dev/null -w '%{http_code}' http://denied.example/", ws, proxy)
        proxy.end_command()
    assert out == "403", out
    assert policy.records == [("denied.example", 80, "deny")]
