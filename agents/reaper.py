"""Finds runs that should be moving but that no worker drives, and queues them again.

Two cases: a worker held the lease and died (the lease expired), or a queued slice was lost
before any worker took it (no lease, and enqueued long ago). Claiming is conditional, so a run
queued twice is still driven by one worker at a time.

A queue that lost everything it held (Redis restarted without persistence) is noticed at once: a
mark the reaper keeps in the queue's own storage is gone. Then every unleased run is queued again
without waiting out REQUEUE_AFTER_SECONDS, and so is every rewind a person asked for that no
worker has carried out (a rewind request is also re-issued when it went unanswered past its
deadline: its task was lost with a worker). Webhook deliveries due and not made are queued again
the same way (agents/notifications.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agents import (
    approvals,
    blobstore,
    jobs,
    notifications,
    rewinds,
    sandbox,
    services,
    slack,
)
from agents.jobs import enqueue
from agents.models import (
    DRIVABLE_STATUSES,
    LIVE_STATUSES,
    Event,
    EventKind,
    PauseCause,
    Provider,
    Run,
    RunStatus,
)

log = logging.getLogger(__name__)


def reap(now=None) -> list[int]:
    now = now or timezone.now()
    approvals.expire_due(now)
    approvals.discard_of_ended_runs()
    # Commands of a worker that died may have left their cgroups (and, without a PID
    # namespace, processes in them) behind: end them.
    sandbox.cleanup_stale_cgroups()
    emptied = queue_was_emptied()
    # Right after a queue lost everything, what was queued before the last moments is gone.
    lost_after = 2.0 if emptied else settings.SHIFTLOG["REQUEUE_AFTER_SECONDS"]
    lost_before = now - timedelta(seconds=lost_after)
    stale = (
        Run.objects.filter(status__in=DRIVABLE_STATUSES)
        .exclude(provider=Provider.EXTERNAL)  # no worker drives these: nothing to requeue
        .filter(
            Q(lease_expires_at__lt=now)
            | Q(lease_expires_at__isnull=True)
            & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=lost_before))
        )
        .values_list("pk", "lease_owner")
    )
    requeued = []
    for run_id, owner in stale:
        # Clear a dead worker's lease only if it is still the same dead lease.
        cleared = (
            Run.objects.filter(pk=run_id, lease_owner=owner)
            .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
            .update(
                lease_owner="",
                lease_expires_at=None,
                lease_expiries=F("lease_expiries") + (1 if owner else 0),
            )
        )
        if cleared:
            if emptied and not requeued:
                log.warning(
                    "the queue holds no mark (it lost what it held, or is new): queueing "
                    "every unleased run again"
                )
            if owner:
                log.warning("run %s: lease of %s expired; queueing it again", run_id, owner)
            enqueue(run_id)
            requeued.append(run_id)
    reissue_lost_rewinds(now, emptied=emptied)
    notifications.requeue_lost(now, after=lost_after)
    slack.requeue_lost(now, after=lost_after)
    resume_when_store_is_back()
    resume_when_database_is_back()
    return requeued


def resume_when_database_is_back() -> list[int]:
    """Runs paused because the database stayed busy past a slice's retries resume: the reaper
    got this far, so the database answers again."""
    resumed = []
    paused = Run.objects.filter(status=RunStatus.PAUSED, pause_cause=PauseCause.DATABASE)
    for run_id in paused.values_list("pk", flat=True):
        try:
            services.resume_run(run_id, actor="harness")
        except services.RunError as e:
            log.info("run %s stays paused: %s", run_id, e)
            continue
        log.warning("run %s: the database answers again; resumed", run_id)
        resumed.append(run_id)
    return resumed


def resume_when_store_is_back() -> list[int]:
    """Runs paused because the blob store could not be reached resume once it answers again."""
    waiting = list(
        Run.objects.filter(status=RunStatus.PAUSED, pause_cause=PauseCause.STORE_DOWN).values_list(
            "pk", flat=True
        )
    )
    if not waiting:
        return []
    try:
        blobstore.configured().exists("0" * 64)
    except blobstore.BlobStoreUnavailable:
        return []
    resumed = []
    for run_id in waiting:
        try:
            services.resume_run(run_id, actor="harness")
        except services.RunError as e:  # over a budget meanwhile: a person decides
            log.info("run %s stays paused: %s", run_id, e)
            continue
        log.warning("run %s: the blob store answers again; resumed", run_id)
        resumed.append(run_id)
    return resumed


QUEUE_MARK = "shiftlog:queue-mark"


def queue_was_emptied() -> bool:
    """True once after the queue's storage lost its contents (and on its very first use)."""
    from huey.constants import EmptyData  # noqa: PLC0415
    from huey.contrib.djhuey import HUEY  # noqa: PLC0415

    try:
        if HUEY.storage.peek_data(QUEUE_MARK) is not EmptyData:
            return False
        HUEY.storage.put_data(QUEUE_MARK, b"1")
    except jobs.QUEUE_ERRORS as e:
        log.warning("the queue cannot be reached: %s", e)
        return False
    return True


def reissue_lost_rewinds(now, *, emptied: bool) -> list[int]:
    """Rewind requests of live runs with no outcome: past their deadline (their task was lost),
    or at once after the queue lost everything. Carrying one out is idempotent."""
    grace = 0 if emptied else rewinds.REWIND_WAIT_SECONDS + 10
    recent = now - timedelta(hours=6)
    requests = Event.objects.filter(
        kind=EventKind.RUN_REWIND_REQUESTED,
        created_at__gt=recent,
        created_at__lt=now - timedelta(seconds=grace),
        run__status__in=LIVE_STATUSES,
    ).order_by("run_id", "-seq")
    reissued, seen = [], set()
    for request in requests:
        if request.run_id in seen:
            continue  # only a run's latest request can still be open
        seen.add(request.run_id)
        if rewinds.rewind_answered(request.run_id, request.seq):
            continue
        log.warning(
            "run %s: the rewind asked at #%s was never carried out; asking again",
            request.run_id,
            request.seq,
        )
        rewinds.reissue_rewind(request)
        reissued.append(request.run_id)
    return reissued
