from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command

from agents.management.base import BaseCommand, fail
from agents.reaper import reap
from agents.schedules import cron as schedules

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(libc: ctypes.CDLL, parent: int) -> None:
    """In a child, between fork and exec: get SIGKILL when `parent` (serve) dies, however it
    dies (a SIGKILL or the OOM killer gives it no chance to stop its children)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # serve died between the fork and the prctl
        os._exit(1)


# Listening on every address: links name this machine's loopback instead.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "*": "127.0.0.1", "": "127.0.0.1"}


def served_url(host: str, port: int) -> str:
    """The http:// address of a server listening on `host`:`port`."""
    host = WILDCARDS.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def record_base_url(url: str) -> None:
    """Keep the server's address in the data folder (shiftlog/settings.py reads it)."""
    path = settings.DATA_DIR / "server_url"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(url + "\n")
    tmp.replace(path)


def manage_command() -> list[str]:
    """How to run a management command in a child: manage.py in a checkout, else the
    installed package's own entry point."""
    manage = settings.BASE_DIR / "manage.py"
    if manage.exists():
        return [sys.executable, str(manage)]
    return [sys.executable, "-m", "shiftlog.cli", "manage"]


class Command(BaseCommand):
    help = "Run the embedded product in the foreground: daphne, a huey worker and the reaper."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--workers",
            type=int,
            default=settings.HUEY["consumer"]["workers"],
            help="the huey worker's threads; 0: no worker here (web only, workers run apart)",
        )
        parser.add_argument(
            "--setup",
            action="store_true",
            help="first set up the data folder, saying each step: the database's migrations, "
            "the static files (hashed names), the admin account and its one-time login link, "
            "the demo run (what `make run` and `shiftlog run` do)",
        )
        parser.add_argument(
            "--no-demo", action="store_true", help="with --setup: no demo run on a new database"
        )

    def handle(self, *args, **o):
        if not 0 < o["port"] < 65536:
            raise fail("--port must be between 1 and 65535")
        if o["workers"] < 0:
            raise fail("--workers must be 0 (web only) or more")
        host = o["host"].strip().strip("[]")
        if not host:
            raise fail("--host must name an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
        manage = manage_command()
        # This server's own address, for every link it prints or names (the one-time login,
        # webhooks' run links, the origins the live sockets accept): SHIFTLOG_BASE_URL when
        # set, else the host and port served. The children get it, and it is recorded in the
        # data folder for `manage.py login_link` and the other commands run beside the server.
        base_url = os.environ.get("SHIFTLOG_BASE_URL", "").strip().rstrip("/")
        if not base_url:
            base_url = served_url(host, o["port"])
        child_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "shiftlog.settings"),
            "SHIFTLOG_BASE_URL": base_url,
        }
        if "ALLOWED_HOSTS" not in os.environ and host not in settings.ALLOWED_HOSTS:
            # Served on another address than this machine's loopback: that name is allowed.
            link_host = urlsplit(base_url).hostname or host
            extra = [f"[{h}]" if ":" in h else h for h in {host, link_host} if h not in WILDCARDS]
            child_env["ALLOWED_HOSTS"] = ",".join([*settings.ALLOWED_HOSTS, *extra])
        record_base_url(base_url)
        if o["setup"]:
            self._set_up(base_url, demo=not o["no_demo"])
        # Stop cleanly on SIGTERM and SIGINT alike, also when started in the background
        # (`nohup ... &`), where the shell starts us with SIGINT ignored. Installed before the
        # children start, so a signal that comes early is not lost.
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        # libc is loaded here, not in the child: only plain calls between fork and exec.
        die_with_us = functools.partial(_die_with, ctypes.CDLL(None, use_errno=True), os.getpid())
        # Children get their own process groups: Ctrl-C reaches only us, and we stop them in
        # order (worker gracefully first, so the running step finishes). They die with us too.
        children = {}
        if o["workers"] > 0:  # 0: web only (a container beside separate workers)
            children["worker"] = subprocess.Popen(
                [
                    *manage,
                    "run_huey",
                    "-w",
                    str(o["workers"]),
                    "-k",
                    "thread",
                    "-g",
                    "TERM",
                    "-t",
                    "30",
                ],
                start_new_session=True,
                preexec_fn=die_with_us,
                env=child_env,
            )
        children["web"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(o["port"]),
                "shiftlog.asgi:application",
            ],
            start_new_session=True,
            preexec_fn=die_with_us,
            env=child_env,
        )
        reaper = threading.Thread(target=self._reap_forever, args=(stop,), daemon=True)
        reaper.start()
        self.stdout.write(
            f"Shiftlog is serving on {served_url(host, o['port'])}/ (Ctrl-C stops it); "
            f"its links use {base_url}/"
        )
        if host in WILDCARDS and "SHIFTLOG_BASE_URL" not in os.environ:
            self.stdout.write(
                "note: listening on every address; set SHIFTLOG_BASE_URL to the address others "
                "reach it at, so that the links it prints work for them"
            )
        self.stdout.flush()
        try:
            while not stop.is_set():
                for name, proc in children.items():
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                        stop.set()
                stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        self.stdout.write("stopping: letting the running step finish...")
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in children.items():
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in time; killing it")
                proc.kill()
        self.stdout.write("stopped")

    def _set_up(self, base_url: str, *, demo: bool) -> None:
        say = self.stdout.write
        say(f"Data folder: {settings.DATA_DIR}")
        say("Applying the database's migrations...")
        self.stdout.flush()
        call_command("migrate", interactive=False, verbosity=0)
        say(f"Collecting the static files (hashed names) into {settings.STATIC_ROOT}...")
        self.stdout.flush()
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("bootstrap", base_url=base_url, no_demo=not demo, stdout=self.stdout)
        self.stdout.flush()

    def _reap_forever(self, stop: threading.Event) -> None:
        interval = settings.SHIFTLOG["REAPER_INTERVAL_SECONDS"] or 5.0
        while not stop.wait(interval):
            try:
                reap()
            except Exception as e:  # keep reaping; a locked database now is fine later
                self.stderr.write(f"reaper: {e}")
            try:
                schedules.tick()  # due schedule ticks and wake-ups
            except Exception as e:
                self.stderr.write(f"schedules: {e}")
        time.sleep(0)
