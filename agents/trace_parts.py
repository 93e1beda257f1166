"""A run's trace in parts (agents/telemetry.py `export_due`): when an export is queued, which span
goes with which part, and the claims (TraceExport rows) that let each part be sent once.

A part is a session's spans (the session's span and everything under it) or the run's own (the
root and what no session holds). A part is claimed before it is sent: two exports of one run (a
session's end and the run's, a retried task, a session's end processed again) never send it
twice. A send that fails gives its claims up, so the next export sends those parts; a claim left
unsent by a worker that died is taken over after CLAIM_SECONDS.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from agents import jobs
from agents.models import TraceExport

if TYPE_CHECKING:  # the SDK is imported where traces are built, not where sessions end
    from opentelemetry.sdk.trace import ReadableSpan

CLAIM_SECONDS = 600


def export_later(run_id: int) -> None:
    """Queue the export of what is due of the run's trace (agents/telemetry.py `export_due`)
    once the current transaction commits, when a collector is configured: at each session's
    end and at the run's. Nobody waits on the collector."""
    if settings.SHIFTLOG["OTEL_ENDPOINT"]:
        jobs.later("export_trace", run_id=run_id)


def parts(
    spans: list[ReadableSpan], session_spans: dict[int, int]
) -> dict[int | None, list[ReadableSpan]]:
    """The spans by part: a session's pk (`session_spans` maps a session span's id to it), or
    None for the run's own."""
    parent_of = {s.context.span_id: (s.parent.span_id if s.parent else None) for s in spans}
    found: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        at: int | None = span.context.span_id
        while at is not None and at not in session_spans:
            at = parent_of.get(at)
        found.setdefault(session_spans.get(at) if at else None, []).append(span)
    return found


def _part(session_id: int | None) -> Q:
    return Q(session__isnull=True) if session_id is None else Q(session_id=session_id)


def claim(run_id: int, session_id: int | None) -> bool:
    """Take one part for sending: True when this export is to send it (never sent, and not
    being sent by another export, unless that one's claim is stale)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            TraceExport.objects.create(run_id=run_id, session_id=session_id, claimed_at=now)
        return True
    except IntegrityError:
        stale = now - timedelta(seconds=CLAIM_SECONDS)
        return bool(
            TraceExport.objects.filter(_part(session_id), run_id=run_id, sent=False)
            .filter(claimed_at__lt=stale)
            .update(claimed_at=now)
        )


def give_up(run_id: int, session_ids: list[int | None]) -> None:
    for session_id in session_ids:
        TraceExport.objects.filter(_part(session_id), run_id=run_id, sent=False).delete()


def sent(run_id: int, counts: dict[int | None, int]) -> None:
    for session_id, spans in counts.items():
        TraceExport.objects.filter(_part(session_id), run_id=run_id).update(sent=True, spans=spans)
