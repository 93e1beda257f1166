"""A fleet's spawns: one row per child a `spawn_runs` call started (agents/fleets/spawn.py).

The row is keyed by the parent, the call's tool_use_id and the child's place in the call, and is
written in the transaction that creates the child, records the parent's tool result and puts the
parent to wait: a worker killed mid-spawn leaves all of it or none, and the retry finds the rows
it made. It also keeps what merging the child back needs: the tree the child started from, the
folder of the parent's workspace it stands for, and how far its merge has come.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class MergeState(models.TextChoices):
    NONE = "", "not merged"
    APPLIED = "applied"
    CONFLICT = "conflict"  # handed to the agent; a later merge_children naming it tries again
    ASKED = "asked"  # a person decides (an Approval of tool "merge_conflict")
    RESOLVED = "resolved"  # applied with a person's choice


class FleetChild(models.Model):
    parent = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="spawns")
    child = models.OneToOneField("agents.Run", on_delete=models.CASCADE, related_name="spawned_as")
    tool_use_id = models.CharField(max_length=100)
    index = models.PositiveSmallIntegerField()
    # "all": the parent wakes when every child of the call has ended; "any": at the first.
    wait = models.CharField(max_length=3, default="all")
    # The parent's folder the child stands for ("" = the whole workspace), and the tree the
    # child's workspace started as (the merge's base).
    folder = models.CharField(max_length=1000, blank=True)
    base_tree = models.CharField(max_length=64)
    # The parent checkpoint it was seeded from.
    from_checkpoint = models.PositiveIntegerField(null=True, blank=True)
    budget_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    budget_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    merge_state = models.CharField(
        max_length=10, choices=MergeState.choices, default=MergeState.NONE, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["parent", "tool_use_id", "index"], name="fleet_child_once_per_call"
            )
        ]
        ordering = ["parent", "pk"]

    def __str__(self) -> str:
        return f"run {self.child_id}, child {self.index} of run {self.parent_id}"
