"""A command's disk use, watched while it runs: the run's workspace cap and the host's free-space
floor (kept for the database and everything else on that filesystem).

RLIMIT_FSIZE bounds one file; a command writing many files, or one that writes gigabytes and
deletes them before it returns, passes every checkpoint's measurement. So a thread beside the
command looks at the filesystem's free space every few milliseconds (one statvfs call): when the
workspace may have grown past its cap (free space fell by more than the room the workspace had),
or every second or so anyway, it measures the workspace itself; when the command has grown the
workspace past its cap (or past its size at the start, if it was over already), or the filesystem's free space is under the floor, it kills the command's process group at once
and says why (the caller kills the rest of it, its cgroup, as after any command).
"""

from __future__ import annotations

import _thread
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

LOOK_EVERY_S = 0.02  # statvfs: microseconds
MEASURE_EVERY_S = 1.0  # a walk of the workspace, at least this often (longer for a big one)


def free_bytes(path: Path) -> int:
    """What an unprivileged writer may still write on `path`'s filesystem."""
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def tree_bytes(root: Path) -> int:
    """The bytes of the files under `root` (symlinks not followed, a hard-linked file once),
    as a checkpoint counts them; what vanishes during the walk is skipped."""
    total = 0
    seen: set[tuple[int, int]] = set()
    folders = [str(root)]
    while folders:
        try:
            entries = os.scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    folders.append(entry.path)
                elif stat.S_ISREG(info.st_mode):
                    if info.st_nlink > 1:
                        key = (info.st_dev, info.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += info.st_size
    return total


class DiskWatch:
    """Watch `root` while a command runs; on a breach call `stop()` once and keep `reason`
    ("workspace" or "disk_free") and what was measured."""

    def __init__(
        self,
        root: Path,
        *,
        cap: int | None,
        floor: int | None,
        stop: Callable[[], None],
    ) -> None:
        self.root = Path(root)
        self.cap = cap or None
        self.floor = floor or None
        self.stop_command = stop
        self.reason = ""
        self.workspace_bytes = 0
        self.free_bytes = 0
        self._done = threading.Event()
        self._over: threading.Event | None = None  # set when the watching thread has ended

    @property
    def active(self) -> bool:
        return self.cap is not None or self.floor is not None

    def start(self) -> DiskWatch:
        if self.active:
            # A bare thread: threading.Thread.start() waits until the new thread has run, which
            # on a busy machine cost every command a scheduling delay before it could be waited
            # for. (Daemonic, as a threading one would be; close() waits for its end.)
            self._over = threading.Event()
            _thread.start_new_thread(self._watch, ())
        return self

    def close(self) -> None:
        self._done.set()
        if self._over is not None:
            self._over.wait()

    def _breach(self, reason: str) -> None:
        self.reason = reason
        self.stop_command()

    def _watch(self) -> None:
        try:
            self._look()
        except OSError:  # the workspace went away under the command: nothing left to measure
            pass
        finally:
            assert self._over is not None
            self._over.set()

    def _look(self) -> None:
        # Free space first: what the command writes while a big workspace is walked is counted
        # (perhaps twice, which only makes the next walk come sooner).
        free_then = free_bytes(self.root)
        if self.floor is not None and free_then < self.floor:
            self._breach("disk_free")
            return
        size = tree_bytes(self.root) if self.cap else 0
        # A workspace over its cap already (a command stopped near it left it there) may still
        # be cleaned up and checked; a command may not make it bigger. The checkpoint after it
        # pauses the run over its cap (agents/runtime/budgets.py).
        cap = max(self.cap, size) if self.cap else None
        measured_at, measure_every = time.monotonic(), MEASURE_EVERY_S
        while True:
            free = self.free_bytes = free_bytes(self.root)
            if self.floor is not None and free < self.floor:
                self._breach("disk_free")
                return
            if cap is not None:
                # Free space fell by more than the workspace had room for, or it is time.
                may_be_over = size + (free_then - free) > cap
                if may_be_over or time.monotonic() - measured_at >= measure_every:
                    began = time.monotonic()
                    size = self.workspace_bytes = tree_bytes(self.root)
                    if size > cap:
                        self._breach("workspace")
                        return
                    free_then = free_bytes(self.root)
                    measured_at = time.monotonic()
                    # A big workspace is walked less often: at most a tenth of the time.
                    measure_every = max(MEASURE_EVERY_S, 10 * (measured_at - began))
            if self._done.wait(LOOK_EVERY_S):
                return
