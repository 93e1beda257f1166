"""Approvals: a tool call (or a network host, a merge conflict, a change to how the checks run)
waiting for a person's decision. Imported by agents/models.py, which
re-exports them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    # A rewind abandoned the call it asked about: nobody decided it, and nobody can.
    DISCARDED = "discarded"
    # The agent took the call back before anyone decided (its hook gave up): it never runs.
    WITHDRAWN = "withdrawn"


class ApprovalSubject(models.TextChoices):
    """What a person is asked about."""

    TOOL_CALL = "tool_call", "a tool call"
    NETWORK_HOST = "network_host", "a network host"  # tool_input: {host, port}
    MERGE_CONFLICT = "merge_conflict", "a merge conflict"  # tool_input: {run_id, choose, ...}
    # The agent changed how the checks run (test-runner settings, a protected test file):
    # tool_input: {files: [{path, change, what, diff, entry, ...}]} (agents/config_changes.py).
    CONFIG_CHANGE = "config_change", "a change to how the checks run"


class ApprovalQuerySet(models.QuerySet):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=ApprovalStatus.PENDING)


class Approval(models.Model):
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="approvals")
    session = models.ForeignKey("agents.Session", null=True, blank=True, on_delete=models.SET_NULL)
    seq = models.PositiveBigIntegerField(default=0)
    tool_use_id = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=100)
    tool_input = models.JSONField(default=dict)
    # What it is about, as a field: never read from the tool's name.
    subject = models.CharField(
        max_length=20, choices=ApprovalSubject.choices, default=ApprovalSubject.TOOL_CALL
    )
    status = models.CharField(
        max_length=20, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    edited_input = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        permissions = [("decide_approval", "Can approve or deny tool calls")]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "tool_use_id"], name="approval_unique_per_tool_call"
            )
        ]

    def __str__(self) -> str:
        return f"Approval {self.pk} ({self.tool_name}, {self.status})"
