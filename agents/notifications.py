"""Webhooks: a JSON POST when an approval waits and when a run pauses, succeeds or fails.

Each POST a run owes is a `WebhookDelivery` row, written in the transaction that records the news
(agents/webhook_models.py); a huey task makes the attempts once it commits. Each attempt is one
short task execution (a few seconds at most); a failed one schedules the next on the queue after a
doubling backoff instead of sleeping, so a slow or broken receiver never keeps a worker thread from
the runs. A task the queue lost (or could not take: Redis down) is queued again by the reaper from
the row. A delivery whose last attempt fails is a `notification.failed` event.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agents import eventlog, jobs
from agents.models import EventKind, WebhookDelivery

log = logging.getLogger(__name__)

NOTIFY_STATUSES = frozenset({"paused", "succeeded", "failed"})
# One attempt holds a worker thread at most this long (the slices share those threads).
ATTEMPT_TIMEOUT_SECONDS = 5
# A retry's task may start a moment before its due time by the database's clock.
CLOCK_SLACK = timedelta(seconds=2)
# Deliveries the reaper queues again in one pass, oldest due first.
REQUEUE_BATCH = 500


def urls_for(run) -> list[str]:
    return [*settings.SHIFTLOG["WEBHOOK_URLS"], *(run.webhook_urls or [])]


def run_url(run_id: int) -> str:
    return f"{settings.SHIFTLOG_BASE_URL}/runs/{run_id}/"


def notify(run, event: str, **details: Any) -> None:
    """Queue a POST to every webhook of the run once the current transaction commits."""
    urls = urls_for(run)
    if not urls:
        return
    payload = {
        # The same id on every attempt (the webhook-id header): receivers drop replays by it.
        "id": f"msg_{uuid.uuid4().hex}",
        "event": event,
        "run": {"id": run.pk, "goal": run.goal, "status": run.status, "reason": run.status_reason},
        "url": run_url(run.pk),
        "at": timezone.now().isoformat(),
        **details,
    }
    for url in urls:
        delivery = WebhookDelivery.objects.create(run_id=run.pk, url=url, payload=payload)
        jobs.later("deliver_webhook", delivery_id=delivery.pk)


def post(url: str, payload: dict[str, Any]) -> str:
    """POST the payload once, signed; "" when the receiver took it, else what went wrong."""
    if not url.startswith(("http://", "https://")):  # urllib would also open file:// and ftp://
        return "not an http:// or https:// URL"
    try:
        body = json.dumps(payload)
        request = urllib.request.Request(
            url,
            data=body.encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "Shiftlog-Webhook/1",
                **signature_headers(payload.get("id") or f"msg_{uuid.uuid4().hex}", body),
            },
        )
        with urllib.request.urlopen(request, timeout=ATTEMPT_TIMEOUT_SECONDS) as response:
            if 200 <= response.status < 300:
                return ""
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e)) or type(e).__name__
    except ValueError as e:  # not a URL urllib can open (a bad SHIFTLOG_WEBHOOK_URLS entry)
        return str(e)


def signature_headers(message_id: str, body: str) -> dict[str, str]:
    """The Standard Webhooks headers (webhook-id, -timestamp, -signature: HMAC-SHA256 over
    "id.timestamp.body" with the shared secret), so a receiver can check a delivery came from
    this Shiftlog and was not replayed or changed: `Webhook(secret).verify(body, headers)` in
    the standardwebhooks library, in any of its languages."""
    now = datetime.now(UTC)
    signature = Webhook(settings.SHIFTLOG["WEBHOOK_SECRET"]).sign(message_id, now, body)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (1, 2, ...): the backoff, doubling."""
    return settings.SHIFTLOG["WEBHOOK_BACKOFF_SECONDS"] * 2 ** (attempt - 1)


def deliver(delivery_id: int) -> bool:
    """Make one delivery attempt, if one is due and no other task is making it. On failure the
    next attempt is scheduled on the queue, not slept for: the worker thread goes back to running
    slices meanwhile. After the last attempt the failure is a `notification.failed` event."""
    now = timezone.now()
    # Claimed on the row: while this attempt is under way, it is not due again (a second task
    # for it, or the reaper, leaves it alone) until it would have timed out twice over.
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, delivered_at=None, failed_at=None, due_at__lte=now + CLOCK_SLACK
    ).update(due_at=now + timedelta(seconds=2 * ATTEMPT_TIMEOUT_SECONDS + 10))
    if not claimed:
        return False  # delivered, given up, not due yet, or another task is on it
    d = WebhookDelivery.objects.get(pk=delivery_id)
    error = post(d.url, d.payload)
    attempt = d.attempts + 1
    done = WebhookDelivery.objects.filter(pk=delivery_id)
    if not error:
        done.update(attempts=attempt, delivered_at=timezone.now(), last_error="")
        return True
    attempts = max(1, settings.SHIFTLOG["WEBHOOK_ATTEMPTS"])
    if attempt < attempts:
        delay = retry_delay(attempt)
        log.info(
            "webhook %s for run %s failed (attempt %s of %s: %s); next try in %s s",
            d.url,
            d.run_id,
            attempt,
            attempts,
            error,
            delay,
        )
        done.update(
            attempts=attempt,
            last_error=error[:500],
            due_at=timezone.now() + timedelta(seconds=delay),
        )
        jobs.schedule("deliver_webhook", delay=delay, delivery_id=delivery_id)
        return False
    log.warning(
        "webhook %s for run %s failed after %s attempts: %s", d.url, d.run_id, attempts, error
    )
    with transaction.atomic():
        done.update(attempts=attempt, last_error=error[:500], failed_at=timezone.now())
        eventlog.append(
            d.run_id,
            EventKind.NOTIFICATION_FAILED,
            {"url": d.url, "event": d.payload.get("event"), "attempts": attempts, "error": error},
        )
    return False


def deliver_legacy(run_id: int, url: str, payload: dict[str, Any], attempt: int) -> bool:
    """A task queued by a version before the delivery rows (its kwargs carry the POST itself):
    made a row, then delivered as any."""
    delivery = WebhookDelivery.objects.create(
        run_id=run_id, url=url, payload=payload, attempts=attempt - 1
    )
    return deliver(delivery.pk)


def requeue_lost(now=None, *, after: float) -> list[int]:
    """Queue again the deliveries due for more than `after` seconds: their task was lost (with
    Redis, or never queued because Redis was down), or an attempt died with its worker."""
    now = now or timezone.now()
    lost = list(
        WebhookDelivery.objects.filter(
            delivered_at=None, failed_at=None, due_at__lt=now - timedelta(seconds=after)
        )
        .order_by("due_at")
        .values_list("pk", flat=True)[:REQUEUE_BATCH]
    )
    for delivery_id in lost:
        log.warning("webhook delivery %s: its task was lost; queueing it again", delivery_id)
        if not jobs.queue_now("deliver_webhook", delivery_id=delivery_id):
            break  # the queue is down: the next pass tries again
    return lost
