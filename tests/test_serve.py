"""`serve`, the embedded product, as a real process: web, worker and reaper together."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from agents import services
from agents.models import Run, RunStatus
from tests.helpers import approve_pending
from tests.procs import free_port, process_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


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


# --- serve's children never outlive it ------------------------------------------------------
def _serving(port: int) -> bool:
    try:
        urllib.request.build_opener(NoRedirect).open(f"http://127.0.0.1:{port}/", timeout=2)
    except urllib.error.HTTPError:
        return True  # it answered (a redirect to the login page)
    except OSError:
        return False
    return True


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def _wait(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _start_serve(tmp_path, *, background: bool) -> tuple[int, int, list[int], object]:
    """A real `manage.py serve`, up and answering; returns (serve pid, port, children, log).

    background: started as `nohup ... &` by a non-interactive shell, which starts it with
    SIGINT ignored, as a job put in the background is.
    """
    port = free_port()
    env = {**process_env(tmp_path), "SHIFTLOG_REAPER_INTERVAL": "0.5"}
    log = tmp_path / f"serve-{port}.log"
    argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
    if background:
        launcher = subprocess.run(
            ["/bin/sh", "-c", 'nohup "$@" > "$LOG" 2>&1 & echo $!', "sh", *argv],
            env={**env, "LOG": str(log)},
            capture_output=True,
            text=True,
            timeout=10,
            start_new_session=True,
        )
        pid = int(launcher.stdout.strip())
        handle = None
    else:
        with log.open("wb") as out:
            handle = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        pid = handle.pid
    try:
        _wait(lambda: _serving(port) and len(children_of(pid)) == 2, 60, "serving")
    except AssertionError:
        _kill_tree(pid)
        raise AssertionError(log.read_text(errors="replace")) from None
    return pid, port, children_of(pid), handle


def _kill_tree(pid: int) -> None:
    for child in children_of(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


@pytest.mark.timeout(120)
def test_serve_children_die_when_serve_is_killed(tmp_path):
    pid, port, kids, handle = _start_serve(tmp_path, background=False)
    try:
        os.kill(pid, signal.SIGKILL)  # serve alone: no chance to stop its children itself
        handle.wait(10)
        took = _wait(lambda: all(_gone(k) for k in kids), 5, "children gone")
        print(f"\nserve SIGKILLed: daphne and run_huey gone after {took:.2f} s")
        assert not _serving(port)
    finally:
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_in_the_background_stops_cleanly_on(tmp_path, signum):
    pid, port, kids, _ = _start_serve(tmp_path, background=True)
    try:
        # Started the way a shell starts a background job, a plain program ignores SIGINT
        # (the control); serve handles it all the same.
        control = subprocess.run(
            ["/bin/sh", "-c", "nohup sleep 30 > /dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        sleeper = int(control.stdout)
        try:
            assert _ignores_sigint(sleeper)
        finally:
            os.kill(sleeper, signal.SIGKILL)
        assert not _ignores_sigint(pid)
        os.kill(pid, signum)
        took = _wait(lambda: _gone(pid), 60, "serve stopped")
        _wait(lambda: all(_gone(k) for k in kids), 5, "children gone")
        log = (tmp_path / f"serve-{port}.log").read_text(errors="replace")
        assert "stopped" in log, log
        assert "did not stop in time" not in log, log
        print(f"\nserve stopped by {signal.Signals(signum).name} in {took:.2f} s")
    finally:
        _kill_tree(pid)


@pytest.mark.timeout(120)
def test_web_only_serves_without_a_worker_and_stops_cleanly(tmp_path):
    """`serve --workers 0` (`shiftlog web`, the web container): daphne alone, no huey consumer."""
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        handle = subprocess.Popen(
            [sys.executable, "-m", "shiftlog.cli", "web", "--port", str(port)],
            env=process_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait(lambda: _serving(port), 60, "serving")
        kids = children_of(handle.pid)
        commands = [
            subprocess.run(
                ["ps", "-o", "args=", "-p", str(k)], capture_output=True, text=True
            ).stdout
            for k in kids
        ]
        assert len(kids) == 1 and "daphne" in commands[0], commands
        handle.send_signal(signal.SIGTERM)
        assert handle.wait(30) == 0
        assert "stopped" in log.read_text(errors="replace")
    finally:
        _kill_tree(handle.pid)


def test_serve_refuses_a_negative_worker_count(tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "serve", "--workers", "-1"],
        env=process_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--workers must be 0 (web only) or more" in done.stderr
