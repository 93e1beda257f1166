"""The soak's deployment: its own Redis, a PostgreSQL database of its own, a data folder on a small
filesystem it can fill, two huey workers and one daphne, each restartable and signalable.

Every process is started in a session of its own and dies with this one (PR_SET_PDEATHSIG), so
nothing outlives the soak, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import PG_SERVER, pg_admin

ROOT = Path(__file__).resolve().parents[2]

PR_SET_PDEATHSIG = 1
LEASE_SECONDS = 6
DISK_MB = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dies_with_us() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def in_own_mount_namespace() -> bool:
    return os.environ.get("SHIFTLOG_CHAOS_NS") == "1"


def reexec_in_mount_namespace() -> int | None:
    """Run this script again in a private mount namespace (so it may mount a small filesystem to
    fill); None when that is not allowed here (the disk fault is then simulated)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return None
    env = {**os.environ, "SHIFTLOG_CHAOS_NS": "1"}
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv]
    return subprocess.call(argv, env=env)


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict, log: Path):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.popen: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_dies_with_us,
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the process and its session (tool processes a worker left)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=15)
        self.kill_group()


class Cluster:
    """With `hosts`, every process is a host of its own, as machines would be: its own data and
    workspace folders and SHIFTLOG_HOST, workspaces as its cache (SHIFTLOG_WORKSPACE_CACHE), and
    only PostgreSQL, Redis and the blob store shared; a worker restores a run's workspace from the
    store when another host drove it last. Without, every process shares one data folder."""

    def __init__(self, *, workers: int, threads: int, hosts: bool = True):
        self.home = Path(tempfile.mkdtemp(prefix="shiftlog-chaos-"))
        self.data = self.home / "data"
        self.data.mkdir()
        self.logs = self.home / "logs"
        self.logs.mkdir()
        self.ledger = self.home / "tool-ledger.txt"
        self.disk = "simulated"
        self.token = secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(40)
        self.database = f"shiftlog_chaos_{self.token}"
        self.redis_port = free_port()
        self.web_port = free_port()
        self.redis: Proc | None = None
        self.workers: list[Proc] = []
        self.web: Proc | None = None
        self.reaper: Proc | None = None
        self.n_workers, self.threads = workers, threads
        self.hosts = hosts

    # --- set-up ------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DJANGO_"))}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
                "PYTHONUNBUFFERED": "1",
                "DATABASE_URL": f"{PG_SERVER.rstrip('/')}/{self.database}",
                "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "SHIFTLOG_HUEY_NAME": f"chaos-{self.token}",
                "SHIFTLOG_DATA_DIR": str(self.data),
                "SHIFTLOG_TOOL_LEDGER": str(self.ledger),
                "SHIFTLOG_LEASE_SECONDS": str(LEASE_SECONDS),
                "SHIFTLOG_REAPER_INTERVAL": "2",
                "SHIFTLOG_CHECKPOINT_EVERY": "3",
                # The workspaces are on a 256 MB tmpfs the soak fills on purpose: the floor of
                # free space a command keeps (agents/sandbox/diskwatch.py) is scaled to it.
                "SHIFTLOG_MIN_FREE_MB": "8",
                "SHIFTLOG_DEBUG": "false",
                "SHIFTLOG_HUEY_IMMEDIATE": "false",
                "SECRET_KEY": self.secret_key,
            }
        )
        if os.environ.get("SHIFTLOG_ALLOW_UNISOLATED"):
            env["SHIFTLOG_ALLOW_UNISOLATED"] = os.environ["SHIFTLOG_ALLOW_UNISOLATED"]
        return self.on_host(env, "bench")

    def on_host(self, env: dict[str, str], host: str) -> dict[str, str]:
        """`env` for a process on a host of its own (see the class): its folders are under the
        data folder, so the disk fault fills them too; the blob store is the one shared folder."""
        if not self.hosts:
            return env
        folder = self.data / "hosts" / host
        return {
            **env,
            "SHIFTLOG_HOST": host,
            "SHIFTLOG_DATA_DIR": str(folder),
            "SHIFTLOG_WORKSPACES": str(folder / "workspaces"),
            "SHIFTLOG_BLOBS": str(self.data / "blobs"),
            "SHIFTLOG_WORKSPACE_CACHE": "1",
        }

    def mount_disk(self) -> None:
        """A small tmpfs under the data folder, so the soak can fill it (own namespace only)."""
        if not in_own_mount_namespace():
            return
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(self.data)],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            self.disk = f"tmpfs {DISK_MB} MB"

    def start(self) -> None:
        self.mount_disk()
        pg_admin(f'CREATE DATABASE "{self.database}"')
        env = self.env()
        self.redis = Proc(
            "redis",
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            env,
            self.logs / "redis.log",
        )
        self.redis.start()
        self.wait_port(self.redis_port, "redis")
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        for i in range(self.n_workers):
            argv = [*manage, "run_huey", "-w", str(self.threads), "-k", "thread", "-g", "TERM"]
            argv += ["-t", "30", "-d", "0.05", "-b", "1.1", "-m", "0.5"]
            name = f"worker{i + 1}"
            self.workers.append(
                Proc(name, argv, self.on_host(env, name), self.logs / f"{name}.log")
            )
        # The reaper from a timer too, as docs/deploy.md's Procfile runs it (the workers' own
        # periodic reaper passes once a minute).
        loop = f"while true; do {sys.executable} {ROOT / 'manage.py'} reap_runs >/dev/null; sleep 5; done"
        self.reaper = Proc("reaper", ["sh", "-c", loop], env, self.logs / "reaper.log")
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port)]
        web_env = self.on_host(env, "web")
        self.web = Proc(
            "web", [*daphne, "shiftlog.asgi:application"], web_env, self.logs / "web.log"
        )
        for p in [*self.workers, self.web, self.reaper]:
            p.start()
        self.wait_port(self.web_port, "daphne")

    def wait_port(self, port: int, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")

    # --- faults ------------------------------------------------------------------------------
    def restart(self, proc: Proc) -> None:
        proc.kill_group()
        proc.start()

    def restart_redis(self, down_seconds: float) -> None:
        self.redis.kill_group()
        time.sleep(down_seconds)
        self.redis.start()
        self.wait_port(self.redis_port, "redis")

    def drop_pg_connections(self) -> int:
        import psycopg

        with psycopg.connect(f"{PG_SERVER.rstrip('/')}/postgres", autocommit=True) as c:
            rows = c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [self.database],
            ).fetchall()
        return len(rows)

    def fill_disk(self) -> Path | None:
        """Fill the data folder's filesystem; the ballast file to delete, or None if simulated."""
        if not self.disk.startswith("tmpfs"):
            return None
        ballast = self.data / ".chaos-ballast"
        chunk = b"\0" * (1 << 20)
        # Write until the filesystem refuses (ENOSPC): that refusal is the point.
        with contextlib.suppress(OSError), ballast.open("wb") as f:
            while True:
                f.write(chunk)
        return ballast

    # --- tear-down ---------------------------------------------------------------------------
    def stop(self, keep: bool = False) -> None:
        for p in [self.reaper, self.web, *self.workers, self.redis]:
            if p is not None:
                p.stop()
        if keep:
            print(f"kept: database {self.database}, logs in {self.logs}", file=sys.stderr)
            return
        try:
            pg_admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        except Exception as e:
            print(f"could not drop database {self.database}: {e}", file=sys.stderr)
        if self.disk.startswith("tmpfs"):
            subprocess.run(["umount", "-l", str(self.data)], capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)
