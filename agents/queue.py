"""The huey side: our huey classes and putting a run's next slice on the queue.

huey gives no acknowledgements (a task whose worker dies is lost), so the database is the truth:
enqueue records when it did so, and the reaper enqueues again what was lost.
"""

from __future__ import annotations

import huey
from huey.consumer import Consumer


class GracefulConsumer(Consumer):
    """On a graceful stop, tell running slices to finish their step and hand the run back."""

    def stop(self, graceful: bool = False) -> None:
        if graceful:
            from agents.runtime.loop import shutdown_requested

            shutdown_requested.set()
        super().stop(graceful=graceful)


class SqliteHuey(huey.SqliteHuey):
    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)


class RedisHuey(huey.RedisHuey):
    def create_consumer(self, **options):
        return GracefulConsumer(self, **options)


def enqueue(run_id: int) -> None:
    """Queue a slice of the run once the current transaction commits."""
    from django.db import transaction
    from django.utils import timezone

    from agents.models import Run
    from agents.tasks import run_slice

    Run.objects.filter(pk=run_id).update(enqueued_at=timezone.now())
    transaction.on_commit(lambda: run_slice(run_id=run_id))
