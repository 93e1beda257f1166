"""The worker process's side of huey: our huey classes and the graceful-shutdown flag.

Settings name these classes (`HUEY["huey_class"]`), so this module is imported while Django's
apps load: it imports nothing of the project's, only huey.
"""

from __future__ import annotations

import threading

import huey
from huey.consumer import Consumer

# Set when the worker process is asked to stop gracefully: the running slices finish their
# current step, hand their runs back to the queue, and nothing is left half-done.
shutdown_requested = threading.Event()


class GracefulConsumer(Consumer):
    """On a graceful stop, tell running slices to finish their step and hand the run back."""

    def stop(self, graceful: bool = False) -> None:
        if graceful:
            shutdown_requested.set()
        super().stop(graceful=graceful)


class SqliteHuey(huey.SqliteHuey):
    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)


class RedisHuey(huey.RedisHuey):
    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)
