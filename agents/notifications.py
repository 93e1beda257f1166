"""Webhooks: a JSON POST when an approval waits and when a run pauses, succeeds or fails.

Delivery happens in a huey task after the transaction commits, with retries and backoff, so a
slow or broken receiver never holds up a run; a delivery that still fails is an event.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

log = logging.getLogger(__name__)

NOTIFY_STATUSES = frozenset({"paused", "succeeded", "failed"})


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
        "event": event,
        "run": {"id": run.pk, "goal": run.goal, "status": run.status, "reason": run.status_reason},
        "url": run_url(run.pk),
        "at": timezone.now().isoformat(),
        **details,
    }
    from agents.tasks import deliver_webhook

    for url in urls:
        transaction.on_commit(
            lambda url=url: deliver_webhook(run_id=run.pk, url=url, payload=payload)
        )


def deliver(
    run_id: int,
    url: str,
    payload: dict[str, Any],
    *,
    attempts: int | None = None,
    backoff: float | None = None,
) -> bool:
    attempts = attempts or settings.SHIFTLOG["WEBHOOK_ATTEMPTS"]
    backoff = settings.SHIFTLOG["WEBHOOK_BACKOFF_SECONDS"] if backoff is None else backoff
    body = json.dumps(payload).encode()
    error = ""
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "Shiftlog-Webhook/1"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if 200 <= response.status < 300:
                    return True
                error = f"HTTP {response.status}"
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            error = str(getattr(e, "reason", e))
        if attempt < attempts:
            time.sleep(backoff * 2 ** (attempt - 1))
    from agents import eventlog
    from agents.models import EventKind

    log.warning("webhook %s for run %s failed after %s attempts: %s", url, run_id, attempts, error)
    eventlog.append(
        run_id,
        EventKind.NOTIFICATION_FAILED,
        {"url": url, "event": payload.get("event"), "attempts": attempts, "error": error},
    )
    return False
