from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time

from django.conf import settings

from agents import schedules
from agents.management.base import BaseCommand, fail
from agents.reaper import reap

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(libc: ctypes.CDLL, parent: int) -> None:
    """In a child, between fork and exec: get SIGKILL when `parent` (serve) dies, however it
    dies (a SIGKILL or the OOM killer gives it no chance to stop its children)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # serve died between the fork and the prctl
        os._exit(1)


class Command(BaseCommand):
    help = "Run the embedded product in the foreground: daphne, a huey worker and the reaper."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--workers", type=int, default=settings.HUEY["consumer"]["workers"])

    def handle(self, *args, **o):
        if not 0 < o["port"] < 65536:
            raise fail("--port must be between 1 and 65535")
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
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
        children = {
            "worker": subprocess.Popen(
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
            ),
            "web": subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    o["host"],
                    "-p",
                    str(o["port"]),
                    "dashboard.asgi:application",
                ],
                start_new_session=True,
                preexec_fn=die_with_us,
                env={
                    **os.environ,
                    "DJANGO_SETTINGS_MODULE": os.environ.get(
                        "DJANGO_SETTINGS_MODULE", "dashboard.settings"
                    ),
                },
            ),
        }
        reaper = threading.Thread(target=self._reap_forever, args=(stop,), daemon=True)
        reaper.start()
        self.stdout.write(
            f"Shiftlog is serving on http://{o['host']}:{o['port']}/ (Ctrl-C stops it)"
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
