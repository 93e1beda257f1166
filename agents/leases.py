"""A worker's claim on a run: conditional UPDATEs on the run row, checked by row count.

Only one worker holds a run at a time. The claim expires unless renewed; every event a worker
appends renews it (see eventlog.append_many), and long tool calls renew it as a heartbeat.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agents.models import DRIVABLE_STATUSES, Provider, Run


def worker_id() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _expiry():
    return timezone.now() + timedelta(seconds=settings.SHIFTLOG["LEASE_SECONDS"])


def claim(run_id: int, owner: str, *, external: bool = False) -> bool:
    """Take the run's lease. Workers never take an external run (its agent drives it through
    the API, which takes the lease for the length of one call: `external=True`)."""
    now = timezone.now()
    runs = Run.objects.filter(pk=run_id, status__in=DRIVABLE_STATUSES)
    if external:
        runs = runs.filter(provider=Provider.EXTERNAL)
    else:
        runs = runs.exclude(provider=Provider.EXTERNAL)
    # A worker that already holds the lease takes it again (a slice tried again after the
    # database was busy: agents.runtime.loop.drive).
    claimed = runs.filter(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now) | Q(lease_owner=owner)
    ).update(lease_owner=owner, lease_expires_at=_expiry())
    return claimed == 1


def renew(run_id: int, owner: str) -> str | None:
    """Extend the lease; returns the run's status, or None when the lease is lost."""
    renewed = Run.objects.filter(pk=run_id, lease_owner=owner).update(
        lease_expires_at=_expiry(), lease_renewals=F("lease_renewals") + 1
    )
    if not renewed:
        return None
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def release(run_id: int, owner: str) -> bool:
    released = Run.objects.filter(pk=run_id, lease_owner=owner).update(
        lease_owner="", lease_expires_at=None
    )
    return released == 1
