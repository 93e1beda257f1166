"""Real processes for tests: huey consumers, the reaper and helper scripts, on the test database.

The in-process tests use tests.settings, whose huey lives in memory; these helpers start real
`manage.py` processes with the production settings (shiftlog.settings) pointed at the same
database (the SQLite file, or the PostgreSQL test database) and data folder as the test, and at a
queue of the test's own (a SqliteHuey file, or a RedisHuey name). That is a real deployment, only
with short timings, so what the tests see is what a real worker does.

Every process is started in its own session (process group) and `Procs.close()` kills the groups
and any tool processes they left behind, so a failing or timed-out test never leaks a worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from agents.models import Event, Run

BASE_DIR = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# The consumer polls its queue this often at most; huey's default backs off to 10 s when idle,
# which would make every hand-over between workers a long wait.
CONSUMER_POLL = ("-d", "0.05", "-b", "1.1", "-m", "0.2")


# --- waiting --------------------------------------------------------------------------------
def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll until `predicate()` is truthy and return it; fail with `what` and `details()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(interval)


# --- the event log, for assertions and their messages ----------------------------------------
def _cut(value: Any, limit: int = 160) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[: limit - 1] + "…"
    if isinstance(value, dict):
        return {k: _cut(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, limit) for v in value]
    return value


def events(run_id: int) -> list[Event]:
    return list(Event.objects.for_run(run_id))


def dump_events(run_id: int) -> str:
    """The run's log as `tail_run --json` prints it (long strings cut), for failure messages."""
    run = Run.objects.filter(pk=run_id).values("status", "status_reason", "lease_owner").first()
    lines = [f"run {run_id}: {run}"]
    for e in events(run_id):
        lines.append(
            json.dumps(
                {
                    "seq": e.seq,
                    "kind": e.kind,
                    "session": e.session_id,
                    "actor": e.actor,
                    "payload": _cut(e.payload),
                },
                ensure_ascii=False,
            )
        )
    return "\n".join(lines)


# --- processes ------------------------------------------------------------------------------
# Runs a command so that it gets SIGKILL when the test process dies, however it dies (a killed
# pytest leaves no server or worker behind): the death signal survives the exec. No preexec_fn,
# which is not safe in a process with threads (Playwright's).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_us(argv: list[str]) -> list[str]:
    """`argv`, started so that it dies with this process."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def process_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a real process (worker, web server, command) that must share this
    test's database, data folder and backends: SQLite or PostgreSQL, SqliteHuey or Redis."""
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
            "SHIFTLOG_DATA_DIR": str(settings.DATA_DIR),
            "SHIFTLOG_WORKSPACES": str(settings.SHIFTLOG["WORKSPACE_ROOT"]),
            "SHIFTLOG_BLOBS": str(settings.SHIFTLOG["BLOB_ROOT"]),
            # The test's own address: a `serve` another test ran on this data folder recorded
            # its own there (shiftlog/settings.py), which a later process would read instead.
            "SHIFTLOG_BASE_URL": settings.SHIFTLOG_BASE_URL,
        }
    )
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else "")
        env["DATABASE_URL"] = f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    else:
        if not Path(db["NAME"]).exists():
            raise RuntimeError(
                f"{db['NAME']} is not a database file: real processes need "
                "@pytest.mark.django_db(transaction=True)"
            )
        env["SHIFTLOG_DB"] = str(db["NAME"])
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
        # A queue of the test's own: another test's leftover tasks never reach its workers.
        env["SHIFTLOG_HUEY_NAME"] = f"shiftlog-test-{os.getpid()}-{tmp_path.name}"
    else:
        env["SHIFTLOG_HUEY_DB"] = str(tmp_path / "huey.sqlite3")
    return env


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone
    # The command name is in parentheses and may contain spaces: split after the last ")".
    return text.rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every live process below `pid` (children, grandchildren, ...) as (pid, start time).

    The start time tells a process from a later one that got the same pid, so `Procs.close()`
    never signals a process it did not start.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def alive(process: tuple[int, str]) -> bool:
    """True while the process runs (a zombie counts as gone: it runs nothing any more)."""
    fields = _stat(process[0])
    return fields is not None and fields[19] == process[1] and fields[0] not in {"Z", "X"}


class Proc:
    """One started process, its output going to a log file next to the test's other files."""

    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path):
        self.name, self.popen, self.log_path = name, popen, log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        """Signal the process itself (not its group): what a supervisor or the OOM killer does."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def log(self, last: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-last:]


class Procs:
    """Starts real processes against the test database; `close()` kills whatever is left."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: list[Proc] = []
        # Tool processes a killed worker may leave behind (they run in sessions of their own).
        self.strays: set[tuple[int, str]] = set()

    def env(self, **extra: str | float) -> dict[str, str]:
        env = process_env(self.tmp_path)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "SHIFTLOG_HUEY_IMMEDIATE": "false",
                # The periodic reaper runs once a minute; tests run the reaper themselves.
                "SHIFTLOG_REAPER_INTERVAL": "0",
                "SHIFTLOG_LOG_LEVEL": "INFO",
            }
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log_path = self.tmp_path / f"{name}-{len(self.started)}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                dying_with_us(argv),
                cwd=BASE_DIR,
                env=env or self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.started.append(proc)
        return proc

    def consumer(
        self, *, workers: int = 2, args: Iterable[str] = (), name: str = "consumer", **env: Any
    ) -> Proc:
        """A real `manage.py run_huey` with thread workers, without its periodic tasks."""
        argv = [sys.executable, "manage.py", "run_huey", "-w", str(workers), "-k", "thread"]
        argv += [*CONSUMER_POLL, "--no-periodic", *args]
        return self.spawn(name, argv, self.env(**env))

    def python(self, name: str, code: str, *args: str, **env: Any) -> Proc:
        """`python -c code args...` with Django set up first (production settings)."""
        prelude = "import django; django.setup()\n"
        return self.spawn(name, [sys.executable, "-c", prelude + code, *args], self.env(**env))

    def manage(self, *args: str, timeout: float = 30, **env: Any) -> str:
        """Run a management command to completion and return its output; fail if it fails."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=self.env(**env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def enqueue(self, *run_ids: int, times: int = 1) -> None:
        """Put slices of the runs on the real queue, through agents.jobs.enqueue itself.

        Runs created in the test process were queued on tests.settings' in-memory huey, which no
        worker reads. Outside a transaction enqueue's on_commit fires at once, so a plain
        `manage.py shell -c` queues the tasks into the queue the consumers read.
        """
        code = (
            "from agents.jobs import enqueue\n"
            f"for _ in range({times}):\n    for run_id in {list(run_ids)}: enqueue(run_id)"
        )
        self.manage("shell", "-c", code)

    def reap_until_requeued(self, run_id: int, *, timeout: float, **env: Any) -> None:
        """Run `manage.py reap_runs` until it queues this run again (its lease must expire)."""

        def reaped() -> bool:
            out = self.manage("reap_runs", **env)
            return str(run_id) in out.split(":", 1)[-1].replace(",", " ").split()

        wait_for(
            reaped,
            timeout=timeout,
            interval=0.3,
            what=f"the reaper to queue run {run_id} again",
            details=lambda: dump_events(run_id),
        )

    def kill_hard(self, proc: Proc, timeout: float = 10) -> list[tuple[int, str]]:
        """SIGKILL the process alone, as the OOM killer would; returns what it had started.

        Its tool processes run in sessions of their own, so they are not in its group: whether
        they die with it is up to the sandbox. They are remembered for `close()` either way.
        """
        below = descendants(proc.pid)
        self.strays.update(below)
        proc.signal(signal.SIGKILL)
        proc.wait(timeout)
        return below

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.log()}" for p in self.started)

    def close(self) -> None:
        for proc in self.started:
            if proc.popen.poll() is None:
                self.strays.update(descendants(proc.pid))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for stray in self.strays:
            if alive(stray):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(stray[0], signal.SIGKILL)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)


def free_port() -> int:
    """A TCP port on loopback nobody listens on (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
