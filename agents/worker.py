"""The worker process's side of huey: our huey classes and the graceful-shutdown flag.

Settings name these classes (`HUEY["huey_class"]`), so this module is imported while Django's
apps load: it imports nothing of the project's, only huey.
"""

from __future__ import annotations

import gc
import os
import threading

import huey
from huey.consumer import Consumer
from huey.storage import SqliteStorage

try:
    import inotify_simple
except ImportError:  # then the consumer polls, as huey's SqliteHuey does
    inotify_simple = None  # type: ignore[assignment]

# Set when the worker process is asked to stop gracefully: the running slices finish their
# current step, hand their runs back to the queue, and nothing is left half-done.
shutdown_requested = threading.Event()

GC_YOUNG_THRESHOLD = 50_000  # objects allocated between young collections (Python's: 700)


class GracefulConsumer(Consumer):
    """On a graceful stop, tell running slices to finish their step and hand the run back."""

    def start(self) -> None:
        # What Django and the apps built at start-up lives as long as the process: out of the
        # collector's way (gc.freeze), and the young generation collected less often. A worker
        # with hundreds of threads spent a quarter of its GIL time in collections that found
        # nothing to free.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        super().start()

    def stop(self, graceful: bool = False) -> None:
        if graceful:
            shutdown_requested.set()
        super().stop(graceful=graceful)


class WakingSqliteStorage(SqliteStorage):
    """huey's SQLite queue, but pushed, not polled: an enqueue touches a file beside the queue
    (`<queue file>.wake`), and a consumer thread that found the queue empty sleeps on an inotify
    watch of that file (at most READ_TIMEOUT seconds, then looks again) instead of backing off up
    to huey's 10 s. So a task enqueued by another process (a person's approval resuming a run,
    from the web) starts within a millisecond or two of its commit, as with Redis's BRPOP."""

    READ_TIMEOUT = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wake_file = f"{self.filename}.wake"
        self.blocking = inotify_simple is not None
        self._local = threading.local()

    def enqueue(self, data, priority=None):
        super().enqueue(data, priority=priority)
        try:
            os.utime(self.wake_file)
        except FileNotFoundError:
            with open(self.wake_file, "a"):
                pass

    def _watch(self):
        watch = getattr(self._local, "watch", None)
        if watch is None:
            with open(self.wake_file, "a"):
                pass
            watch = inotify_simple.INotify()
            flags = inotify_simple.flags
            watch.add_watch(self.wake_file, flags.ATTRIB | flags.MODIFY | flags.CLOSE_WRITE)
            self._local.watch = watch
        return watch

    def dequeue(self):
        if not self.blocking:
            return super().dequeue()
        watch = self._watch()
        watch.read(timeout=0)  # what woke it before is seen now: the queue is read next
        data = super().dequeue()
        if data is None and watch.read(timeout=int(self.READ_TIMEOUT * 1000)):
            data = super().dequeue()
        return data


class SqliteHuey(huey.SqliteHuey):
    storage_class = WakingSqliteStorage

    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)


class RedisHuey(huey.RedisHuey):
    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)
