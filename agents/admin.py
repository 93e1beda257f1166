from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.utils.html import format_html

from agents import inputs, policy, services
from agents.events import summary
from agents.models import (
    Approval,
    Artifact,
    Checkpoint,
    Event,
    MailLink,
    ProjectMemory,
    ProjectReach,
    Reach,
    Run,
    RunScript,
    Schedule,
    ScheduleEvent,
    Session,
    SlackLinkClaim,
    SlackMessage,
    TraceExport,
    Trigger,
    WebhookDelivery,
)


class SessionInline(admin.TabularInline):
    model = Session
    extra = 0
    can_delete = False
    fields = ("index", "status", "end_reason", "turns", "input_tokens", "output_tokens", "cost_usd")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


def _act(action, verb: str, done: str):
    """An admin action doing what the CLI and the dashboard do, through the same service (so
    it is an event naming who), one message a run."""

    def run_action(modeladmin, request, queryset):
        actor = services.actor_for(request.user)
        for run in queryset:
            try:
                action(run.pk, actor=actor)
            except services.RunError as e:
                modeladmin.message_user(request, str(e), messages.WARNING)
            else:
                modeladmin.message_user(request, f"Run {run.pk} {done}.")

    run_action.__name__ = f"{verb}_runs"
    run_action.short_description = f"{verb.capitalize()} the selected runs"
    run_action.allowed_permissions = ("control",)
    return run_action


class InFleetFilter(admin.SimpleListFilter):
    """Runs spawned by another run (a fleet's children) or not."""

    title = "fleet"
    parameter_name = "has_parent"

    def lookups(self, request, model_admin):
        return (("yes", "child of a fleet (has a parent)"), ("no", "no parent (root)"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(parent__isnull=False)
        if self.value() == "no":
            return queryset.filter(parent__isnull=True)
        return queryset


class RunForm(forms.ModelForm):
    """The one thing the admin edits on a run: its tool policy, as JSON, through the service
    (validated, an event, in the audit log). Everything else is fixed at creation (the
    done-conditions) or the harness's own (status, counters, leases, resume state)."""

    tool_policy = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 90}),
        required=False,
        help_text="JSON rules; saving records a run.updated event naming you.",
    )

    class Meta:
        model = Run
        fields = ("tool_policy",)

    def clean_tool_policy(self):
        raw = self.cleaned_data["tool_policy"].strip() or "[]"
        try:
            return policy.validate(inputs.load_json(raw, what="the tool policy"))
        except (inputs.InputError, policy.PolicyError) as e:
            raise forms.ValidationError(str(e)) from None


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "short_goal",
        "status",
        "provider",
        "model",
        "turns",
        "cost_usd",
        "fleet_parent",
        "depth",
        "created_at",
    )
    list_filter = ("status", "provider", InFleetFilter)
    search_fields = ("goal",)
    form = RunForm
    readonly_fields = (
        "goal",
        "checks",
        "rubric",
        "acceptance",
        "protected",
        "protected_action",
        "provider",
        "model",
        "judge_model",
        "max_sessions",
        "max_tokens",
        "max_cost_usd",
        "max_wall_seconds",
        "max_turns_per_session",
        "max_input_tokens_per_session",
        "limits",
        "toolchain",
        "webhook_urls",
        "slack_channel",
        "slack_news",
        "approval_timeout_seconds",
        "status",
        "status_reason",
        "created_by",
        "created_at",
        "started_at",
        "finished_at",
        "isolation",
        "turns",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cost_usd",
        "active_seconds",
        "last_seq",
        "lease_owner",
        "lease_expires_at",
        "enqueued_at",
        "head_checkpoint",
        "forked_from",
        "budget_warnings",
        "resume_state",
        "branch_seq",
        "lease_renewals",
        "lease_expiries",
        "check_settings",
        "cost_estimated",
        "script_name",
        "parent",
        "depth",
    )
    fields = ("tool_policy", *readonly_fields)
    inlines = [SessionInline]
    actions = [
        _act(services.pause_run, "pause", "paused"),
        _act(services.resume_run, "resume", "resumed"),
        _act(services.cancel_run, "cancel", "cancelled"),
    ]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is not None:
            form.base_fields["tool_policy"].initial = json.dumps(obj.tool_policy, indent=2)
        return form

    def save_model(self, request, obj, form, change):
        # Not the row: the service, so the change is validated and is an event naming who.
        current = Run.objects.filter(pk=obj.pk).values_list("tool_policy", flat=True).get()
        if form.cleaned_data["tool_policy"] != current:
            services.set_policy(
                obj.pk,
                form.cleaned_data["tool_policy"],
                actor=services.actor_for(request.user),
                because="changed in the admin",
            )

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("agents.control_run")

    def has_delete_permission(self, request, obj=None):
        # A run's events, checkpoints and artifacts are its history and the store's references;
        # cancel a run instead.
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="goal")
    def short_goal(self, run):
        return run.goal[:80]

    @admin.display(description="parent", ordering="parent_id")
    def fleet_parent(self, run):
        return run.parent_id or "-"  # the id alone: no query per row

    def has_control_permission(self, request):
        return request.user.has_perm("agents.control_run")

    def has_add_permission(self, request):
        # Runs are created through services (CLI, dashboard) so their workspace and first
        # event exist; a bare row would be a run that can never start.
        return False


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("run", "seq", "kind", "actor", "summary", "created_at")
    list_filter = ("kind",)
    search_fields = ("run__id",)
    list_select_related = ("run",)
    ordering = ("-run", "-seq")

    @admin.display(description="summary")
    def summary(self, event):
        return format_html("{}", summary(event.kind, event.payload))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """A run's history, shown, never edited or deleted here: a deleted checkpoint would let
    prune_store drop its blobs, a deleted approval or script would break the run."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ("run", "index", "status", "end_reason", "turns", "cost_usd", "started_at")
    list_filter = ("status", "end_reason")


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "seq", "kind", "label", "created_at")


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "name", "kind", "size", "mime_type", "created_at")
    list_filter = ("kind",)


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "tool_name", "status", "decided_by", "created_at")
    list_filter = ("status",)


class DeliveryStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"
    STATES = {
        "pending": {"delivered_at__isnull": True, "failed_at__isnull": True},
        "delivered": {"delivered_at__isnull": False},
        "failed": {"failed_at__isnull": False},
    }

    def lookups(self, request, model_admin):
        return [(state, state) for state in self.STATES]

    def queryset(self, request, queryset):
        found = self.STATES.get(self.value() or "")
        return queryset.filter(**found) if found else queryset


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """What each receiver was sent, and how it went: delivered, pending its next attempt, or
    given up after the last (also a `notification.failed` event in the run's log)."""

    list_display = ("id", "run", "event", "url", "state", "attempts", "due_at", "last_error")
    list_select_related = ("run",)
    list_filter = (DeliveryStateFilter,)
    search_fields = ("run__id", "url")

    @admin.display(description="event")
    def event(self, row):
        return row.payload.get("event", "")


@admin.register(TraceExport)
class TraceExportAdmin(ReadOnlyAdmin):
    """Which parts of each run's trace the collector was sent (agents/trace_parts.py): a
    session's, or the run's own (no session); claimed and not sent is being sent, or failed."""

    list_display = ("id", "run", "session", "sent", "spans", "claimed_at")
    list_select_related = ("run", "session")
    list_filter = ("sent",)
    search_fields = ("run__id",)


@admin.register(RunScript)
class RunScriptAdmin(ReadOnlyAdmin):
    list_display = ("run", "name", "turns")
    list_select_related = ("run",)
    search_fields = ("run__id",)

    @admin.display(description="name")
    def name(self, row):
        return row.script.get("name", "") if isinstance(row.script, dict) else ""

    @admin.display(description="turns")
    def turns(self, row):
        return len(row.script.get("turns", [])) if isinstance(row.script, dict) else 0


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    """Shown only: schedules are made, paused and deleted through the pages and the CLI, which
    record each change in the schedule's history."""

    list_display = ("id", "template", "cron", "timezone", "overlap", "paused", "next_at")
    list_filter = ("paused", "overlap")


@admin.register(ScheduleEvent)
class ScheduleEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "schedule", "kind", "actor", "created_at")
    list_filter = ("kind",)


@admin.register(Trigger)
class TriggerAdmin(ReadOnlyAdmin):
    # Never the secret, nor the token's hash.
    exclude = ("secret", "token_hash")
    list_display = ("id", "template", "token_prefix", "revoked_at", "last_delivery_at")


@admin.register(ProjectMemory)
class ProjectMemoryAdmin(ReadOnlyAdmin):
    """Shown only: a change goes through a run's page or the CLI, so it is an event naming who."""

    list_display = ("project", "key", "pinned", "source_run", "updated_by", "updated_at")
    list_filter = ("project", "pinned")
    search_fields = ("project", "key", "text")


# --- reaching people: Slack and mail (agents/reach.py). The Slack bot token and signing secret
# are settings from the environment, never rows: nothing here can show them.
@admin.register(Reach)
class ReachAdmin(admin.ModelAdmin):
    list_display = ("user", "slack_user_id", "mail_approvals", "mail_run_endings")
    search_fields = ("user__username", "user__email", "slack_user_id")
    autocomplete_fields = ("user",)


@admin.register(ProjectReach)
class ProjectReachAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "slack_approvals",
        "slack_run_endings",
        "slack_pauses",
        "slack_budget_warnings",
    )
    search_fields = ("project", "slack_channel")

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "title": "Projects' Slack channels"}
        slack = "set" if settings.SHIFTLOG["SLACK_BOT_TOKEN"] else "not set"
        self.message_user(
            request,
            f"Slack bot token: {slack} (SHIFTLOG_SLACK_BOT_TOKEN); default channel: "
            f"{settings.SHIFTLOG['SLACK_CHANNEL'] or 'none'} (SHIFTLOG_SLACK_CHANNEL). "
            "A blank project is the default for every other project.",
            messages.INFO,
        )
        return super().changelist_view(request, extra_context)


@admin.register(SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "approval", "ts", "attempts", "last_error", "failed_at")
    list_filter = ("kind",)


@admin.register(SlackLinkClaim)
class SlackLinkClaimAdmin(ReadOnlyAdmin):
    """The Link to NAME buttons people had the bot send them (agents/slack_link.py)."""

    list_display = ("__str__", "created_at", "used_at")
    search_fields = ("user__username", "slack_user_id")


@admin.register(MailLink)
class MailLinkAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "created_at", "mailed_at", "used_at")
