"""Webhooks: a JSON POST when an approval waits and when a run pauses, succeeds or fails.

Delivery happens in a huey task after the transaction commits. Each attempt is one short task
execution (a few seconds at most); a failed one schedules the next on the queue after a doubling
backoff instead of sleeping, so a slow or broken receiver never keeps a worker thread from the
runs. A delivery whose last attempt fails is a `notification.failed` event.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agents import eventlog, jobs
from agents.models import EventKind

log = logging.getLogger(__name__)

NOTIFY_STATUSES = frozenset({"paused", "succeeded", "failed"})
# One attempt holds a worker thread at most this long (the slices share those threads).
ATTEMPT_TIMEOUT_SECONDS = 5


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
        jobs.later("deliver_webhook", run_id=run.pk, url=url, payload=payload)


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


def deliver(run_id: int, url: str, payload: dict[str, Any], *, attempt: int = 1) -> bool:
    """Make one delivery attempt. On failure the next attempt is scheduled on the queue, not
    slept for: the worker thread goes back to running slices meanwhile. After the last attempt
    the failure is a `notification.failed` event."""
    error = post(url, payload)
    if not error:
        return True
    attempts = max(1, settings.SHIFTLOG["WEBHOOK_ATTEMPTS"])
    if attempt < attempts:
        delay = retry_delay(attempt)
        log.info(
            "webhook %s for run %s failed (attempt %s of %s: %s); next try in %s s",
            url,
            run_id,
            attempt,
            attempts,
            error,
            delay,
        )
        jobs.schedule(
            "deliver_webhook",
            delay=delay,
            run_id=run_id,
            url=url,
            payload=payload,
            attempt=attempt + 1,
        )
        return False
    log.warning("webhook %s for run %s failed after %s attempts: %s", url, run_id, attempts, error)
    eventlog.append(
        run_id,
        EventKind.NOTIFICATION_FAILED,
        {"url": url, "event": payload.get("event"), "attempts": attempts, "error": error},
    )
    return False
