"""External agents' tool calls (agents/runtime/external.py): what the policy decided for each."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ExternalCallDecision(models.TextChoices):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class ExternalCall(models.Model):
    """A tool call an external agent asked about before running it: the policy's decision, the
    approval it waits on (when asked), and whether its result has come back."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="external_calls")
    tool_use_id = models.CharField(max_length=100, unique=True)
    tool = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    decision = models.CharField(max_length=10, choices=ExternalCallDecision.choices)
    reason = models.TextField(blank=True)
    approval = models.ForeignKey(
        "agents.Approval", null=True, blank=True, on_delete=models.SET_NULL
    )
    called_seq = models.PositiveBigIntegerField(null=True, blank=True)  # its tool.call event
    result_seq = models.PositiveBigIntegerField(null=True, blank=True)  # its tool.result event
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["run", "created_at"])]

    def __str__(self) -> str:
        return f"{self.tool} call {self.tool_use_id} of run {self.run_id}"
