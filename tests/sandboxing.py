"""Helpers for the sandbox containment tests: host folders outside /tmp, and finding processes."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

# Not /tmp: bubblewrap gives every command a private /tmp, which would hide a folder there by
# accident and make a containment test prove nothing.
HOST_TMP = "/var/tmp" if os.path.isdir("/var/tmp") else None


def host_folder(prefix: str) -> Path:
    """A fresh folder outside /tmp (the caller removes it with remove_folder)."""
    folder = tempfile.mkdtemp(prefix=prefix, dir=HOST_TMP)
    if folder.startswith("/tmp/"):
        raise RuntimeError("no folder outside /tmp for containment tests")
    return Path(folder)


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def marker() -> str:
    """A number no other process has in its command line."""
    return str(random.randint(10**11, 10**12))


def live_processes_with(text: str, *, exact: bool = False) -> list[int]:
    """Host pids of processes (not zombies) whose command line contains (or, exact, is) `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        line = cmdline.rstrip(b"\0").replace(b"\0", b" ")
        if (line == text.encode() if exact else text.encode() in line) and state not in "ZX":
            found.append(int(entry))
    return found


def gone_within(text: str, seconds: float) -> bool:
    """True once no such process is seen on two scans in a row (a process in the middle of an
    exec can show an empty command line for an instant)."""
    deadline = time.monotonic() + seconds
    clean = 0
    while True:
        clean = clean + 1 if not live_processes_with(text) else 0
        if clean >= 2:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def kill_all_with(text: str) -> None:
    """Never leave a process behind when a test fails."""
    for pid in live_processes_with(text):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])
