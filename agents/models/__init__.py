"""The domain: runs, their sessions, the append-only event log, checkpoints, artifacts, approvals.

All state of a run lives here, outside the model and outside any worker's memory, so any worker
can pick up any run and a crashed one loses nothing that was committed.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.db import models
from django.db.models.functions import Cast, Coalesce
from django.urls import reverse
from django.utils import timezone

from agents.branches import abandoned
from agents.models.resume_state import ResumeState


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval", "awaiting approval"
    PAUSED = "paused"
    VERIFYING = "verifying"
    # A fleet's parent, holding no worker and no lease until its children end (agents/fleets/tree.py).
    WAITING_FOR_CHILDREN = "waiting_for_children", "waiting for children"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class PauseCause(models.TextChoices):
    """Why a paused run is paused: what may resume it, and who is to act."""

    PERSON = "person"  # a person paused it (resume_run)
    BUDGET = "budget"  # a budget ran out: raise it, then resume
    FLEET = "fleet"  # its fleet's parent was paused: resuming the parent resumes it
    REWIND = "rewind"  # stopped between steps to be rewound
    STORE_DOWN = "store_down"  # the blob store did not answer: the reaper resumes it
    DATABASE = (
        "database"  # the database stayed busy or away past the retries: the reaper resumes it
    )
    DISK_FULL = "disk_full"
    APPROVAL_EXPIRED = "approval_expired"
    PROVIDER = "provider"  # the model's API refused for now (rate, overload, credit)
    UNISOLATED = "unisolated"  # this worker cannot isolate commands
    LIMIT = "limit"  # a limit of the run (its workspace cap, what it may ask)
    HARNESS = "harness"  # anything else the harness stopped it for


LIVE_STATUSES = frozenset(
    {
        RunStatus.QUEUED,
        RunStatus.RUNNING,
        RunStatus.AWAITING_APPROVAL,
        RunStatus.PAUSED,
        RunStatus.VERIFYING,
        RunStatus.WAITING_FOR_CHILDREN,
    }
)
# States a worker may drive; the others wait for a person or are over. A claimable `verifying`
# run is one whose worker died while the checks ran.
DRIVABLE_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.VERIFYING})
# An external run in these states waits on its agent: silent past its heartbeat window, it is
# stalled (Run.stalled). Paused or awaiting approval, it waits on a person instead.
STALLABLE_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})


class Provider(models.TextChoices):
    SCRIPTED = "scripted", "scripted (offline)"
    ANTHROPIC = "anthropic", "Anthropic"
    # Driven by a process outside Shiftlog through the API (agents/runtime/external.py).
    EXTERNAL = "external", "external agent"


class RunQuerySet(models.QuerySet):
    def live(self) -> RunQuerySet:
        return self.filter(status__in=LIVE_STATUSES)

    def for_list(self) -> RunQuerySet:
        """Runs with what a runs list shows, in one query: subqueries on indexed columns, no
        per-row lookups (the latest event comes from the (run, seq) index, not a scan of the
        log). Newest first."""
        latest = Event.objects.filter(run=models.OuterRef("pk")).order_by("-seq")
        session = Session.objects.filter(run=models.OuterRef("pk")).order_by("-index")
        pending = (
            Approval.objects.pending()
            .filter(run=models.OuterRef("pk"))
            .order_by()
            .values("run")
            .annotate(n=models.Count("pk"))
            .values("n")
        )
        return (
            self.select_related("created_by")
            .annotate(
                last_activity=models.Subquery(latest.values("created_at")[:1]),
                current_session=models.Subquery(session.values("index")[:1]),
                pending_approvals=Coalesce(
                    models.Subquery(pending, output_field=models.IntegerField()), 0
                ),
            )
            .order_by("-created_at", "-pk")
        )


class Run(models.Model):
    goal = models.TextField()
    # Done-conditions, fixed before the run starts: shell commands run by the harness.
    checks = models.JSONField(default=list)
    rubric = models.TextField(blank=True)
    # The judge's own model (blank: the run's).
    judge_model = models.CharField(max_length=100, blank=True)
    # Files the checks depend on: fingerprinted at creation, {path: {hash, size, mode}}.
    protected = models.JSONField(default=dict, blank=True)
    # What changes how the checks run (conftest.py, test settings, .pth, shims), as it was at
    # creation: {path: {kind, hash, blob}}; see agents/check_settings.py.
    check_settings = models.JSONField(default=dict, blank=True)
    # Test-suite checks run guarded and counted (agents/suite_guard.py). False for runs made
    # before it, and for runs that opted out.
    suite_guard = models.BooleanField(default=False)
    # Checks the agent never sees, run only at finish: {"files": {path: blob hash}, "checks":
    # [command, ...]} (agents/held_out.py).
    held_out = models.JSONField(default=dict, blank=True)
    # What a file tool writing one gets: deny, or ask a person.
    protected_action = models.CharField(max_length=10, default="deny")
    # Named criteria, fixed at creation: [{"name", "check": command or null, "passing": bool}].
    acceptance = models.JSONField(default=list, blank=True)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.SCRIPTED)
    model = models.CharField(max_length=100)
    # Runs of one project share its project memory (agents/memory.py); blank: none.
    project = models.CharField(max_length=100, blank=True, db_index=True)
    # The scripted provider's script lives in RunScript, copied in at creation so the run can
    # always be replayed.
    script_name = models.CharField(max_length=200, blank=True)

    # Budgets (null = no limit).
    max_sessions = models.PositiveIntegerField(null=True, blank=True, default=10)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    max_wall_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Session (context window) limits.
    max_turns_per_session = models.PositiveIntegerField(default=40)
    max_input_tokens_per_session = models.PositiveIntegerField(default=150_000)

    # Ordered rules (see agents.policy); the global default from settings applies after them.
    tool_policy = models.JSONField(default=list, blank=True)
    # Seconds an approval may wait before it counts as denied ("expired"); null: the global
    # default, which is no expiry.
    approval_timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    webhook_urls = models.JSONField(default=list, blank=True)
    # Where its Slack messages go (a channel id or #name; blank: its project's channel), and
    # which run news it posts: some of ended, paused, budget; [] for none; null: its project's
    # switches (agents/reach.py).
    slack_channel = models.CharField(max_length=80, blank=True)
    slack_news = models.JSONField(null=True, blank=True)

    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    status_reason = models.TextField(blank=True)
    # Paused: why (PauseCause), as a field; the reason above is the words for people.
    pause_cause = models.CharField(max_length=20, choices=PauseCause.choices, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # How the run's commands were contained in its latest slice: bwrap, or subprocess (only when
    # the operator allowed unisolated runs); see agents/isolation.py.
    isolation = models.CharField(max_length=20, blank=True)
    # Per-command limits: {"memory_mb", "processes", "cpu_seconds"}, and the workspace's cap
    # ("workspace_mb", measured at every checkpoint). Filled in from the settings at creation.
    limits = models.JSONField(default=dict, blank=True)
    # Folders (an interpreter's prefix, a virtualenv) bound read-only into the sandbox, their
    # bin folders first on PATH: the environment the agent's commands and the checks run in.
    toolchain = models.JSONField(default=list, blank=True)

    # After a rewind or a fork: where the next session starts from (handoff, note, provider
    # state), and the seq of the run.rewound event that began the live branch.
    resume_state = models.JSONField(null=True, blank=True)
    branch_seq = models.PositiveBigIntegerField(default=0)
    head_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    forked_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )

    # Usage, summed over all sessions (each model.turn adds to it in the same transaction).
    turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # Some turn's model was in no price table: its cost was estimated at the dearest rate.
    cost_estimated = models.BooleanField(default=False)
    # Time spent inside worker slices; waiting for a person does not count.
    active_seconds = models.FloatField(default=0.0)
    budget_warnings = models.JSONField(default=list, blank=True)

    # Execution bookkeeping. last_seq is the event log's sequence counter; the lease is a
    # worker's claim on the run, taken and renewed with conditional UPDATEs.
    last_seq = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Counted for /metrics: every extension of the lease, and every lease the reaper found dead.
    lease_renewals = models.PositiveBigIntegerField(default=0)
    lease_expiries = models.PositiveIntegerField(default=0)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # External runs: the agent's last call to the API, and how long it may stay silent before
    # the run shows as stalled (None: the SHIFTLOG_EXTERNAL_HEARTBEAT_SECONDS default).
    last_contact_at = models.DateTimeField(null=True, blank=True)
    heartbeat_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Made by a schedule's tick or a trigger's delivery (agents/schedules/cron.py, agents/schedules/triggers.py).
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    trigger = models.ForeignKey(
        "Trigger", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    # Fleets: a run spawned by another run's `spawn_runs` call is its child; depth 0 is a root.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    depth = models.PositiveSmallIntegerField(default=0)
    # A merge conflict of a child's work is handed to the agent, or asked of a person.
    fleet_conflicts = models.CharField(max_length=10, default="agent")
    # A paused run resumes at this time (`resume_run ID --at`); the scheduler's pass does it.
    wake_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Where workspaces are each host's cache (SHIFTLOG["WORKSPACE_CACHE"]): the root tree in the
    # blob store of the run's last committed workspace (after its latest tool call that changed
    # a file, checkpoint, rewind, merge or upload). A worker restores it where it claims the run.
    workspace_tree = models.CharField(max_length=64, blank=True, default="")

    objects = RunQuerySet.as_manager()

    # The settings a run is made with (agents/runspec.py: RunSpec names them the same): a fork or
    # a scheduled run copies each. Every other column is the run's own state; a test holds that
    # each column is one or the other.
    SETTINGS = (
        "goal", "checks", "rubric", "judge_model", "acceptance", "protected_action", "provider",
        "model", "script_name", "heartbeat_seconds", "project", "max_sessions", "max_tokens",
        "max_cost_usd", "max_wall_seconds", "max_turns_per_session",
        "max_input_tokens_per_session", "tool_policy", "approval_timeout_seconds",
        "webhook_urls", "slack_channel", "slack_news", "limits", "fleet_conflicts", "toolchain", "protected", "check_settings",
        "suite_guard", "held_out",
    )  # fmt: skip

    class Meta:
        indexes = [
            models.Index(fields=["status", "lease_expires_at"]),
            # The runs list's keyset pages, newest first (agents/pages.py), for everyone's
            # runs, one person's, and one status.
            models.Index(fields=["created_at", "id"], name="run_list_order"),
            models.Index(fields=["created_by", "created_at", "id"], name="run_list_by_owner"),
            models.Index(fields=["status", "created_at", "id"], name="run_list_by_status"),
        ]
        permissions = [("control_run", "Can pause, resume, cancel and steer runs")]

    def __str__(self) -> str:
        return f"Run {self.pk}: {self.goal[:60]}"

    def get_absolute_url(self) -> str:
        return reverse("run-detail", args=[self.pk])

    @property
    def workspace_path(self) -> Path:
        return Path(settings.SHIFTLOG["WORKSPACE_ROOT"]) / f"run-{self.pk}"

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def is_offline(self) -> bool:
        return self.provider == Provider.SCRIPTED

    @property
    def is_external(self) -> bool:
        return self.provider == Provider.EXTERNAL

    @property
    def heartbeat_window(self) -> int:
        return self.heartbeat_seconds or int(settings.SHIFTLOG["EXTERNAL_HEARTBEAT_SECONDS"])

    @property
    def stalled(self) -> bool:
        """An external run that should be working but whose agent has gone quiet."""
        return self.stalled_at(timezone.now())

    def stalled_at(self, now: datetime) -> bool:
        """`stalled`, as of `now` (the Overview measures every figure at one instant)."""
        if not self.is_external or self.status not in STALLABLE_STATUSES:
            return False
        return self.silent_seconds(now) > self.heartbeat_window

    def silent_seconds(self, now: datetime) -> float:
        """Seconds since the agent's last call (since the run was created, before its first)."""
        return (now - (self.last_contact_at or self.created_at)).total_seconds()

    @property
    def unisolated(self) -> bool:
        return self.isolation == "subprocess"

    @property
    def resume(self) -> ResumeState | None:
        return ResumeState.from_json(self.resume_state)


class RunScript(models.Model):
    """The scripted provider's script, in its own row.

    The run row is updated at every step (seq counter, lease, usage counters) and SQLite
    rewrites the whole row on each UPDATE, so a script kept in it was copied twice per step.
    """

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="script_row"
    )
    script = models.JSONField()

    def __str__(self) -> str:
        return f"Script of run {self.run_id}"


class SessionStatus(models.TextChoices):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    ENDED = "ended"


class EndReason(models.TextChoices):
    HANDOFF = "handoff"
    FINISHED = "finished"
    VERIFICATION_FAILED = "verification_failed", "verification failed"
    BUDGET = "budget"
    CANCELLED = "cancelled"
    FAILED = "failed"
    CRASHED_RECOVERED = "crashed_recovered", "crashed, recovered"
    REWOUND = "rewound"


class Session(models.Model):
    """One context window of a run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="sessions")
    index = models.PositiveIntegerField()
    status = models.CharField(
        max_length=20, choices=SessionStatus.choices, default=SessionStatus.ACTIVE
    )
    end_reason = models.CharField(max_length=30, choices=EndReason.choices, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    first_seq = models.PositiveBigIntegerField(default=0)

    turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # Input tokens of the latest request: how full the context window is now.
    last_input_tokens = models.PositiveBigIntegerField(default=0)
    handoff = models.JSONField(null=True, blank=True)
    # What its first message was built from: {part: {"text", "tokens", "estimated"}}.
    wake_up = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="session_index_unique_per_run")
        ]
        ordering = ["run", "index"]

    def __str__(self) -> str:
        return f"Run {self.run_id} session {self.index}"


class EventKind(models.TextChoices):
    RUN_CREATED = "run.created"
    RUN_STATUS = "run.status"
    RUN_UPDATED = "run.updated"
    SESSION_STARTED = "session.started"
    SESSION_ENDED = "session.ended"
    MODEL_TURN = "model.turn"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    HARNESS_MESSAGE = "harness.message"
    CHECK_RESULT = "check.result"
    BUDGET_WARNING = "budget.warning"
    BUDGET_EXCEEDED = "budget.exceeded"
    HUMAN_NOTE = "human.note"
    ARTIFACT_SAVED = "artifact.saved"
    CHECKPOINT_CREATED = "checkpoint.created"
    RUN_REWIND_REQUESTED = "run.rewind_requested"
    RUN_ISOLATION = "run.isolation"
    NETWORK_CONNECTION = "network.connection"
    RUN_REWOUND = "run.rewound"
    RUN_FORKED = "run.forked"
    JUDGE_VERDICT = "judge.verdict"
    CHECK_TAMPERED = "check.tampered"
    CHECK_REGRESSED = "check.regressed"
    ACCEPTANCE_UPDATED = "acceptance.updated"
    DRIFT_WARNING = "drift.warning"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    NOTIFICATION_FAILED = "notification.failed"
    MEMORY_SAVED = "memory.saved"
    MEMORY_CHANGED = "memory.changed"
    MEMORY_DELETED = "memory.deleted"
    # Fleets (agents/fleets/spawn.py, agents/fleets/parent.py).
    FLEET_SPAWNED = "fleet.spawned"
    FLEET_CHILD_ENDED = "fleet.child_ended"
    FLEET_WOKE = "fleet.woke"
    FLEET_MERGE = "fleet.merge"
    FLEET_CASCADE = "fleet.cascade"
    WORKSPACE_RESTORED = "workspace.restored"
    ERROR = "error"


class ImmutableEvent(Exception):
    pass


class EventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ImmutableEvent("events are append-only: they cannot be updated")

    def delete(self):
        raise ImmutableEvent("events are append-only: they cannot be deleted")

    def for_run(self, run_id: int, *, after: int = 0) -> EventQuerySet:
        return self.filter(run_id=run_id, seq__gt=after).order_by("seq")

    # The live branch. A rewind never truncates the log: its run.rewound event records the seq
    # range it abandoned, and everything that reads a run's state (conversation, checks, the
    # provider's place, what a rewind would discard, the pages) reads only the live branch.
    def abandoned_ranges(self, run_id: int) -> list[tuple[int, int]]:
        """(after, upto] seq ranges that rewinds turned into abandoned branches, oldest first
        (the run page's script marks rows with the same ranges: see `in_ranges`)."""
        return abandoned(
            (p["to_seq"], p["from_seq"])
            for p in self.filter(run_id=run_id, kind=EventKind.RUN_REWOUND)
            .order_by("seq")
            .values_list("payload", flat=True)
        )

    def ranges_of(self, run: Run) -> list[tuple[int, int]]:
        """`abandoned_ranges` of a run read from the database: none, without a query, for a run
        never rewound (a rewind sets Run.branch_seq to its run.rewound event's seq)."""
        return self.abandoned_ranges(run.pk) if run.branch_seq else []

    def on_live_branch(
        self, run_id: int, ranges: list[tuple[int, int]] | None = None
    ) -> EventQuerySet:
        """The run's events, leaving out the abandoned branches (`ranges`, when the caller has
        read them already)."""
        qs = self.filter(run_id=run_id)
        for after, upto in self.abandoned_ranges(run_id) if ranges is None else ranges:
            qs = qs.exclude(seq__gt=after, seq__lte=upto)
        return qs

    def failures(self) -> EventQuerySet:
        """Events that record something going wrong: a tool call that failed, a check that did
        not pass, a regression, tampering, a judge's rejection, the run failing."""
        return self.filter(
            models.Q(kind=EventKind.TOOL_RESULT, payload__is_error=True)
            | models.Q(kind=EventKind.CHECK_RESULT, payload__passed=False)
            | models.Q(kind=EventKind.JUDGE_VERDICT, payload__passed=False)
            | models.Q(kind__in=[EventKind.CHECK_REGRESSED, EventKind.CHECK_TAMPERED])
            | models.Q(kind=EventKind.RUN_STATUS, payload__to="failed")
        )

    def matching(
        self,
        *,
        kind: str = "",
        tool: str = "",
        text: str = "",
        errors: bool = False,
        session_id: int | None = None,
    ) -> EventQuerySet:
        """A run's events narrowed by a person's search: kind, tool name, text anywhere in the
        payload (case-insensitive), failures only, one session."""
        qs = self
        if kind:
            qs = qs.filter(kind=kind)
        if tool:
            qs = qs.filter(models.Q(payload__name=tool) | models.Q(payload__tool=tool))
        if text:
            # The payload as stored text. SQLite's JSON keeps non-ASCII as \uXXXX escapes, and
            # its LIKE folds only ASCII case: so also the escaped text, lower- and upper-case.
            forms = {text} | {json.dumps(t)[1:-1] for t in (text, text.lower(), text.upper())}
            match = models.Q()
            for form in forms:
                match |= models.Q(payload_text__icontains=form)
            qs = qs.alias(payload_text=Cast("payload", models.TextField())).filter(match)
        if errors:
            qs = qs.failures()
        if session_id is not None:
            qs = qs.filter(session_id=session_id)
        return qs

    def check_results(
        self, run_id: int, ranges: list[tuple[int, int]] | None = None
    ) -> EventQuerySet:
        """The harness's check results on the live branch, oldest first."""
        live = self.on_live_branch(run_id, ranges)
        return live.filter(kind=EventKind.CHECK_RESULT).order_by("seq")


class Event(models.Model):
    """One entry of a run's append-only log. Write through agents.eventlog.append only."""

    # No index of its own: the unique (run, seq) constraint's index serves every run_id lookup.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveBigIntegerField()
    session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    kind = models.CharField(max_length=40, choices=EventKind.choices)
    # Who or what caused it: "user:alice", "worker:host:pid:thread", "harness", "agent".
    actor = models.CharField(max_length=200, default="harness")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_seq_unique_per_run")
        ]
        indexes = [
            models.Index(fields=["created_at"]),
            models.Index(fields=["run", "kind", "seq"]),
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableEvent("events are append-only: they cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableEvent("events are append-only: they cannot be deleted")


class CheckpointKind(models.TextChoices):
    SESSION_END = "session_end", "session end"
    MANUAL = "manual"
    PRE_APPROVAL = "pre_approval", "before approval"
    PERIODIC = "periodic"
    RUN_START = "run_start", "run start"
    FORK = "fork"
    UPLOAD = "upload"  # an external agent's workspace, as it uploaded it
    MERGE = "merge"  # before and after a fleet's children are merged in


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    # The checkpoint's number within its run (1, 2, 3 ...): what pages, URLs and commands name
    # it by. Its id is internal; `seq` is the event it was taken at.
    number = models.PositiveIntegerField()
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL)
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=20, choices=CheckpointKind.choices)
    label = models.CharField(max_length=200, blank=True)
    # The workspace: the root tree's digest in the snapshot store (agents/snapshots/).
    tree = models.CharField(max_length=64)
    files = models.PositiveIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_added = models.PositiveBigIntegerField(default=0)
    # Agent state at this point: the latest handoff, and the provider's place (scripted runs).
    handoff = models.JSONField(null=True, blank=True)
    state = models.JSONField(default=dict)
    # Cumulative usage and cost of the run at this point.
    usage = models.JSONField(default=dict)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="checkpoint_number_per_run")
        ]

    def __str__(self) -> str:
        return f"Checkpoint {self.number} of run {self.run_id} (at #{self.seq})"

    def waiting_approval(self) -> Approval | None:
        """For a checkpoint taken while a tool call waited for approval, that approval: a fork
        from here does not carry the call (its agent starts afresh from the handoff)."""
        if self.kind != CheckpointKind.PRE_APPROVAL:
            return None
        return (
            Approval.objects.filter(run_id=self.run_id, seq__lt=self.seq).order_by("-seq").first()
        )


class ArtifactKind(models.TextChoices):
    FILE = "file"
    HANDOFF = "handoff"
    REPORT = "report"
    DIFF = "diff"


class Artifact(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL)
    seq = models.PositiveBigIntegerField(default=0)
    name = models.CharField(max_length=300)
    kind = models.CharField(max_length=20, choices=ArtifactKind.choices)
    blob_hash = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    mime_type = models.CharField(max_length=100, default="application/octet-stream")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq", "pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


# Approvals, external calls, project memory, schedules and trace exports live in modules of their own (size); importing
# them here registers their models with the app.
from agents.models.approvals import (  # noqa: E402, F401
    Approval,
    ApprovalQuerySet,
    ApprovalStatus,
    ApprovalSubject,
)
from agents.models.external import (  # noqa: E402, F401
    ExternalCall,
    ExternalCallDecision,
    ExternalDriver,
)
from agents.models.fleets import FleetChild  # noqa: E402, F401
from agents.models.memory import ProjectMemory  # noqa: E402, F401
from agents.models.reach import (  # noqa: E402, F401
    MailLink,
    ProjectReach,
    Reach,
    SlackLinkClaim,
    SlackMessage,
    SlackMessageKind,
)
from agents.models.schedules import (  # noqa: E402, F401
    Overlap,
    Schedule,
    ScheduleEvent,
    ScheduleEventKind,
    Trigger,
    TriggerDelivery,
)
from agents.models.traces import TraceExport  # noqa: E402, F401
from agents.models.webhooks import WebhookDelivery  # noqa: E402, F401
