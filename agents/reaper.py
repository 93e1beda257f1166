"""Finds runs that should be moving but that no worker drives, and queues them again.

Two cases: a worker held the lease and died (the lease expired), or a queued slice was lost
before any worker took it (no lease, and enqueued long ago). Claiming is conditional, so a run
queued twice is still driven by one worker at a time.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agents import approvals, sandbox
from agents.jobs import enqueue
from agents.models import DRIVABLE_STATUSES, Provider, Run

log = logging.getLogger(__name__)


def reap(now=None) -> list[int]:
    now = now or timezone.now()
    approvals.expire_due(now)
    # Commands of a worker that died may have left their cgroups (and, without a PID
    # namespace, processes in them) behind: end them.
    sandbox.cleanup_stale_cgroups()
    lost_before = now - timedelta(seconds=settings.SHIFTLOG["REQUEUE_AFTER_SECONDS"])
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
            if owner:
                log.warning("run %s: lease of %s expired; queueing it again", run_id, owner)
            enqueue(run_id)
            requeued.append(run_id)
    return requeued
