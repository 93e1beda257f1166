"""Health for operators: /healthz (the process is up), /readyz (database, queue, channel layer
and blob store reachable) and /metrics (Prometheus text format)."""

from __future__ import annotations

import hmac
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from huey.contrib.djhuey import HUEY
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agents import blobstore, isolation
from agents.models import Approval, ApprovalStatus, Run, RunStatus
from dashboard.live import fanout, hub


def _allowed(request: HttpRequest) -> bool:
    token = settings.SHIFTLOG["METRICS_TOKEN"]
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), token.encode())
    return request.user.is_authenticated and request.user.is_staff


def _forbidden() -> HttpResponse:
    return HttpResponse(
        "forbidden: send the metrics token, or log in as staff\n",
        status=403,
        content_type="text/plain",
    )


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok\n", content_type="text/plain")


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return _forbidden()
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as e:
        checks["database"] = f"error: {e}"
    try:
        HUEY.pending_count()
        checks["queue"] = "ok"
    except Exception as e:
        checks["queue"] = f"error: {e}"
    try:
        # The layer between processes when there is one (Redis), else this process's own.
        layer = get_channel_layer(hub.HUB if settings.SHIFTLOG["LIVE_PUSH"] else "default")
        channel = f"readyz.{uuid.uuid4().hex}"
        async_to_sync(layer.send)(channel, {"type": "ping"})
        async_to_sync(layer.receive)(channel)
        checks["channels"] = "ok"
    except Exception as e:
        checks["channels"] = f"error: {e}"
    try:
        # S3: the bucket answers a HEAD and a list; a folder: it is there and writable.
        blobstore.configured().check_ready()
        checks["store"] = "ok"
    except Exception as e:
        checks["store"] = f"error: {e}"
    ready = all(v == "ok" for v in checks.values())
    # What runs' commands get on this machine (a worker's own may differ: each run records its).
    return JsonResponse(
        {"ready": ready, **checks, "isolation": isolation.describe()},
        status=200 if ready else 503,
    )


class ShiftlogCollector:
    """Read at scrape time from the database (the truth), so every web process reports the
    same numbers whichever worker did the work."""

    def collect(self):
        runs = GaugeMetricFamily("shiftlog_runs", "Runs by status", labels=["status"])
        by_status = dict(Run.objects.values_list("status").annotate(n=Count("pk")))
        for status in RunStatus.values:
            runs.add_metric([status], by_status.get(status, 0))
        yield runs
        totals = Run.objects.aggregate(
            events=Sum("last_seq"), renewals=Sum("lease_renewals"), expiries=Sum("lease_expiries")
        )
        yield CounterMetricFamily(
            "shiftlog_events_appended", "Events appended to run logs", value=totals["events"] or 0
        )
        yield CounterMetricFamily(
            "shiftlog_lease_renewals", "Lease renewals by workers", value=totals["renewals"] or 0
        )
        yield CounterMetricFamily(
            "shiftlog_lease_expiries",
            "Leases the reaper found expired",
            value=totals["expiries"] or 0,
        )
        yield GaugeMetricFamily(
            "shiftlog_approvals_waiting",
            "Tool calls waiting for a person",
            value=Approval.objects.filter(status=ApprovalStatus.PENDING).count(),
        )
        yield GaugeMetricFamily(
            "shiftlog_queue_depth",
            "Tasks waiting in the huey queue",
            value=HUEY.pending_count(),
        )
        # This process's live fan-out (not the database's: each web process has its own).
        stats = fanout.viewers.stats
        for name, what in (
            ("batches", "Batches of a run's events this process fanned out"),
            ("events", "Events this process fanned out to the viewers of their runs"),
            ("renders", "Event fragments this process rendered for its viewers"),
            ("tail_renders", "Fragments of a batch's tail a catch-up had read in part"),
            ("frames", "Frames sent straight to a viewer by the fan-out"),
            ("queued", "Batches a viewer took through its own channel (catching up)"),
            ("held", "Batches a viewer already held, read from the log by its catch-up"),
        ):
            yield CounterMetricFamily(f"shiftlog_live_{name}", what, value=stats[name])
        yield GaugeMetricFamily(
            "shiftlog_live_sockets", "Live sockets open in this process", len(fanout.viewers.pages)
        )


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return _forbidden()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShiftlogCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
