"""Schedules (a run made again from a template run at each cron tick), their own append-only
history, and triggers (a webhook URL that makes a run from a template run).

Kept out of agents/models.py for size; agents/models.py imports this module so Django registers
the models with the `agents` app. Foreign keys name their targets as strings, so this module
imports nothing of ours.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.timezone import now


class Overlap(models.TextChoices):
    SKIP = "skip", "skip the tick while the previous run is live"
    QUEUE = "queue", "start a run anyway"


class Schedule(models.Model):
    """Make a run from `template` at each tick of `cron` in `timezone`. `next_at` is the next
    tick (UTC); the one who fires it claims it with a conditional UPDATE of this column."""

    template = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.SKIP)
    paused = models.BooleanField(default=False)
    next_at = models.DateTimeField(null=True, blank=True)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=now)

    class Meta:
        indexes = [models.Index(fields=["paused", "next_at"])]
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"Schedule {self.pk}: run {self.template_id} at {self.cron!r} ({self.timezone})"


class ScheduleEventKind(models.TextChoices):
    CREATED = "schedule.created"
    PAUSED = "schedule.paused"
    RESUMED = "schedule.resumed"
    TICK_FIRED = "tick.fired"
    TICK_SKIPPED = "tick.skipped"
    TICK_FAILED = "tick.failed"


class ImmutableScheduleEvent(Exception):
    pass


class ScheduleEvent(models.Model):
    """One entry of a schedule's own history (the event log is per run; a tick that makes no
    run still needs a record). Append-only: never updated; deleted only with its schedule."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40, choices=ScheduleEventKind.choices)
    actor = models.CharField(max_length=200, default="scheduler")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["schedule", "pk"]

    def __str__(self) -> str:
        return f"schedule {self.schedule_id}: {self.kind}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableScheduleEvent("schedule events are append-only")
        super().save(*args, **kwargs)


class Trigger(models.Model):
    """An inbound webhook: `POST /hooks/<token>/` makes a run from `template`. Only the token's
    SHA-256 is stored; `secret` (optional) checks an HMAC-SHA256 signature of the body."""

    template = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    token_hash = models.CharField(max_length=64, unique=True)
    # The token's first characters, to tell triggers apart in lists (never enough to guess it).
    token_prefix = models.CharField(max_length=12)
    secret = models.CharField(max_length=200, blank=True)
    # The goal of each run, with {payload.path} places (blank: the template run's goal).
    goal = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"Trigger {self.pk} ({self.token_prefix}…) for run {self.template_id}"


class TriggerDelivery(models.Model):
    """A delivery id a trigger has seen: a replay of it makes nothing."""

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=200)
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL)
    received_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["trigger", "delivery_id"], name="trigger_delivery_unique"
            )
        ]

    def __str__(self) -> str:
        return f"delivery {self.delivery_id} of trigger {self.trigger_id}"
