"""A webhook delivery: one row per POST a run owes a receiver (agents/notifications.py).

Written in the transaction that records what it tells (the run's status change, the approval),
so a delivery exists exactly when its news does. The queue only carries the row's id: a task
lost with Redis, or never queued because Redis was down, is found again by the reaper from the
row (due, not delivered, not given up), and an attempt is claimed on the row first, so two tasks
for one delivery make one attempt at a time.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class WebhookDelivery(models.Model):
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000)
    payload = models.JSONField()
    attempts = models.PositiveSmallIntegerField(default=0)
    # When the next attempt is due; while one is under way, when it counts as lost.
    due_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)  # the last attempt failed
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pk"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                fields=["due_at"],
                name="webhook_pending_due",
                condition=models.Q(delivered_at__isnull=True, failed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"webhook {self.payload.get('event', '?')} of run {self.run_id} to {self.url}"

    @property
    def state(self) -> str:
        if self.delivered_at:
            return "delivered"
        return "failed" if self.failed_at else "pending"
