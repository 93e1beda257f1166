"""Threads for blocking calls (a model call that takes seconds, deferred work), started as calls
come, up to a limit, and kept while there is work.

Why not `concurrent.futures.ThreadPoolExecutor`: its `submit` starts a new thread while holding
the executor's lock, and `threading.Thread.start` waits until the new thread has run. In a worker
with 300 runs, where the GIL is busy, each start takes milliseconds, and every slice submitting a
model call queued behind the others' thread starts (holding its database connection meanwhile):
300 model calls took 11 s to all be running in `bench`-like conditions, the first turns of 300
runs spread over 7-10 s, and 2 s model calls took the runs 13 s. Here a thread is started outside
the lock and not waited for (0.2 s for the same 300), and a thread counts as idle only while it
waits for work, so a call waits for a thread only when `limit` calls are running already.
"""

from __future__ import annotations

import _thread
import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# A thread with nothing to do for this long ends (the next burst starts threads again).
IDLE_SECONDS = 60.0


class CallPool:
    """`submit(fn)` runs `fn()` on a pool thread and returns its Future."""

    def __init__(self, limit: int, name: str, *, idle_seconds: float = IDLE_SECONDS) -> None:
        if limit < 1:
            raise ValueError("a pool needs at least one thread")
        self.limit = limit
        self.name = name
        self.idle_seconds = idle_seconds
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[Future, Callable[[], Any]]] = collections.deque()
        self._threads = 0  # alive
        self._idle = 0  # waiting for work

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        start = False
        with self._cond:
            self._queue.append((future, fn))
            if self._idle >= len(self._queue):
                # Enough threads wait for work to take every queued call, this one included (a
                # thread woken but not yet running still counts: a second call starts a thread).
                self._cond.notify()
            elif self._threads < self.limit:
                self._threads += 1
                start = True
            # Else every thread is busy and the limit is reached: the call waits its turn.
        if start:
            # Started outside the lock, and not waited for: `threading.Thread.start` waits
            # until the new thread has run, which under a busy GIL takes milliseconds each;
            # 300 slices submitting at once queued seconds behind each other for it.
            _thread.start_new_thread(self._work, ())
        return future

    def size(self) -> tuple[int, int]:
        """(threads alive, threads waiting for work): for tests and diagnostics."""
        with self._cond:
            return self._threads, self._idle

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._idle += 1
                    woken = self._cond.wait(timeout=self.idle_seconds)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._threads -= 1
                        return
                future, fn = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as e:  # the caller gets it from the Future
                future.set_exception(e)
            else:
                future.set_result(result)
            del future, fn
