"""Which parts of a run's trace a collector has been sent (agents/telemetry.py)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class TraceExport(models.Model):
    """One part of a run's trace, claimed for sending and then sent: a session's spans (the
    session's span and everything under it), or, with `session` empty, the run's own span and
    what no session holds, once the run has ended. Claimed before it is sent, so two exports of
    one run (a session's end and the run's, a retried task) never send a part twice; a send
    that fails gives the claim up, and a claim left `sent=False` by a worker that died is taken
    again after a while."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="trace_exports")
    session = models.ForeignKey(
        "agents.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    claimed_at = models.DateTimeField(default=timezone.now)
    sent = models.BooleanField(default=False)
    spans = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "session"], name="trace_export_one_a_session"),
            models.UniqueConstraint(
                fields=["run"], condition=Q(session__isnull=True), name="trace_export_one_a_run"
            ),
        ]

    def __str__(self) -> str:
        part = f"session {self.session_id}" if self.session_id else "the run"
        return f"trace of run {self.run_id}: {part} ({'sent' if self.sent else 'claimed'})"
