"""Webhooks: a JSON POST when an approval waits and when a run pauses, succeeds or fails.

Each POST a run owes is a `WebhookDelivery` row, written in the transaction that records the news
(agents/models/webhooks.py); a huey task makes the attempts once it commits. Each attempt is one
short task execution (a few seconds at most); a failed one schedules the next on the queue after a
doubling backoff instead of sleeping, so a slow or broken receiver never keeps a worker thread from
the runs. A task the queue lost (or could not take: Redis down) is queued again by the reaper from
the row. A delivery whose last attempt fails is a `notification.failed` event.

A run's webhook URLs are set by anyone who may create runs, so they are no way in: a URL whose
host is, or resolves to, a loopback, private, link-local or otherwise non-public address is
refused when it is set (`check_url`) and again at each delivery, after resolving, with the egress
proxy's check (agents/sandbox/addresses.py); the POST goes to the address checked, and a redirect
is not followed. The operator's SHIFTLOG_WEBHOOK_URLS are trusted, and
SHIFTLOG_WEBHOOK_ALLOW_PRIVATE turns the check off (a receiver on a private network).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agents import eventlog, jobs
from agents.inputs import InputError
from agents.models import EventKind, WebhookDelivery
from agents.sandbox import addresses

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


def _may_be_private(url: str) -> bool:
    return settings.SHIFTLOG["WEBHOOK_ALLOW_PRIVATE"] or url in settings.SHIFTLOG["WEBHOOK_URLS"]


def check_url(url: str, *, field: str = "webhook_urls") -> str:
    """A run's webhook URL as it is set: InputError when its host is no host name, or is (or
    now resolves to) an address on this machine or a private network. A name that does not
    resolve yet is taken: each delivery checks again."""
    if settings.SHIFTLOG["WEBHOOK_ALLOW_PRIVATE"]:
        return url
    host = urlsplit(url).hostname or ""
    problem = addresses.host_problem(host)
    if problem is not None:
        raise InputError(f"webhook {url[:200]!r}: {problem}", field)
    try:
        addresses.checked_address(host, 443)
    except addresses.Refused as refused:
        if refused.decision == "blocked":
            raise InputError(
                f"webhook {url[:200]!r} is refused: {refused}; webhooks go to public addresses "
                "only",
                field,
            ) from None
    return url


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to `address` (checked) that names `host` in its request."""

    def __init__(self, host: str, port: int, address: str, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An HTTPS connection to `address` (checked); the certificate is checked for `host`."""

    def __init__(self, host: str, port: int, address: str, **kwargs: Any) -> None:
        super().__init__(host, port, context=ssl.create_default_context(), **kwargs)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, payload: dict[str, Any]) -> str:
    """POST the payload once, signed; "" when the receiver took it, else what went wrong."""
    if not url.startswith(("http://", "https://")):  # only these, never file:// or ftp://
        return "not an http:// or https:// URL"
    try:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        host, port = parts.hostname or "", parts.port or (443 if https else 80)
    except ValueError as e:  # a bad port (a bad SHIFTLOG_WEBHOOK_URLS entry)
        return str(e)
    if not host:
        return "not an http:// or https:// URL"
    address = host
    if not _may_be_private(url):
        # Checked again at each delivery, after resolving; the POST goes to that address.
        problem = addresses.host_problem(host)
        if problem is not None:
            return f"refused: {problem}"
        try:
            address = addresses.checked_address(host, port)
        except addresses.Refused as refused:
            return f"refused: {refused}"
    body = json.dumps(payload)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    pinned = _PinnedHTTPS if https else _PinnedHTTP
    connection = pinned(host, port, address, timeout=ATTEMPT_TIMEOUT_SECONDS)
    try:
        connection.request(
            "POST",
            path,
            body=body.encode(),
            headers={
                "Content-Type": "application/json",
                "User-Agent": "Shiftlog-Webhook/1",
                **signature_headers(payload.get("id") or f"msg_{uuid.uuid4().hex}", body),
            },
        )
        status = connection.getresponse().status  # a redirect is not followed: HTTP 3xx
    except (OSError, http.client.HTTPException, ValueError) as e:
        return str(e) or type(e).__name__
    finally:
        connection.close()
    return "" if 200 <= status < 300 else f"HTTP {status}"


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
