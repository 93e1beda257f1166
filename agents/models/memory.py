"""Project memory: what every later run of a project is told at wake-up (agents/memory.py).

Kept out of agents/models.py for size; it imports nothing of ours (agents/models.py imports it so
Django registers the model)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ProjectMemory(models.Model):
    """An entry of a project's memory: what every later run of the project is told at wake-up.
    Each change is also an event on the run it was made through (agents/memory.py)."""

    project = models.CharField(max_length=100)
    key = models.CharField(max_length=100)
    text = models.TextField()
    pinned = models.BooleanField(default=False)
    source_run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL)
    updated_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "key"], name="project_memory_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.project}: {self.key}"
