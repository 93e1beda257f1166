"""`serve`, the embedded product, as a real process: web, worker and reaper together."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from agents import services
from agents.models import Run, RunStatus
from tests.conftest import approve_pending
from tests.procs import process_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_status(run, status, timeout=60):
    deadline = time.monotonic() + timeout
    current = None
    while time.monotonic() < deadline:
        current = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
        if current == status:
            return
        time.sleep(0.2)
    raise AssertionError(f"run {run.pk} is {current}, not {status}, after {timeout}s")


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.timeout(120)
def test_serve_runs_a_lost_run_to_success_and_ctrl_c_stops_everything(tmp_path, decider):
    # Created here, the run's task goes to the tests' in-memory queue and is lost: exactly
    # the case the reaper inside `serve` exists for.
    run = services.create_demo_run(turn_delay_seconds=0)
    port = free_port()
    env = {
        **process_env(tmp_path),
        "SHIFTLOG_REQUEUE_AFTER_SECONDS": "0.5",
        "SHIFTLOG_REAPER_INTERVAL": "0.5",
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_status(run, RunStatus.AWAITING_APPROVAL)
        approve_pending(run, decider)  # its enqueue goes to the tests' queue: lost again
        wait_for_status(run, RunStatus.SUCCEEDED)
        # The web server answers, and asks for a login.
        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as info:
            opener.open(f"http://127.0.0.1:{port}/", timeout=10)
        assert info.value.code == 302 and "login" in info.value.headers["Location"]
        kids = children_of(proc.pid)
        assert len(kids) == 2  # daphne and the huey consumer
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "stopped" in output
        for pid in kids:
            assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), (
                f"child {pid} still running"
            )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
