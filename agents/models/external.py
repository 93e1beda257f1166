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
    # The agent's folder as it sees it ("root"): absolute paths under it are workspace paths.
    root = models.CharField(max_length=1000, blank=True, default="")
    called_seq = models.PositiveBigIntegerField(null=True, blank=True)  # its tool.call event
    result_seq = models.PositiveBigIntegerField(null=True, blank=True)  # its tool.result event
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["run", "created_at"])]

    def __str__(self) -> str:
        return f"{self.tool} call {self.tool_use_id} of run {self.run_id}"


class ExternalDriver(models.Model):
    """The one agent driving an external run: its stable id (a second agent gets 409 naming
    it until this one has been silent for the run's heartbeat window), and the rewind it was
    last told of (the run's branch_seq when it last read its context)."""

    run = models.OneToOneField(
        "agents.Run", on_delete=models.CASCADE, primary_key=True, related_name="external_driver"
    )
    agent = models.CharField(max_length=100)
    seen_branch_seq = models.PositiveBigIntegerField(default=0)
    since = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.agent} drives run {self.run_id}"
