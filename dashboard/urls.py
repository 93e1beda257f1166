from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, register_converter

from dashboard import (
    checkpoint_views,
    export_views,
    find_views,
    health,
    memory_views,
    overview_views,
    panel_views,
    reach_views,
    timeline_views,
    views,
)
from dashboard.fleets import views as fleet_views
from dashboard.schedules import hooks
from dashboard.schedules import views as schedule_views


class IdConverter:
    """A row id in a URL: 1 to 18 digits, so anything a key cannot hold is a 404, not an
    overflow in the database."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")

urlpatterns = [
    path("", views.runs, name="home"),
    path("overview/", overview_views.overview_page, name="overview"),
    path("runs/new/", views.new_run, name="run-new"),
    path("runs/compare/", overview_views.run_compare, name="run-compare"),
    path("runs/<id:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<id:run_id>/events/", views.run_events, name="run-events"),
    path("runs/<id:run_id>/state", views.run_state, name="run-state"),
    path("runs/<id:run_id>/fleet", fleet_views.run_fleet, name="run-fleet"),
    *[
        path(
            f"runs/<id:run_id>/{panel}/",
            panel_views.panel_page,
            {"panel": panel},
            name=f"run-{panel}",
        )
        for panel in panel_views.PANELS
    ],
    path("runs/<id:run_id>/events/<id:seq>/", timeline_views.run_event, name="run-event"),
    path("runs/<id:run_id>/timeline/", timeline_views.run_timeline, name="run-timeline"),
    path("runs/<id:run_id>/timeline.json", timeline_views.timeline_json, name="run-timeline-json"),
    *[
        path(
            f"runs/<id:run_id>/{action}",
            views.run_control,
            {"action": action},
            name=f"run-{action}",
        )
        for action in ("pause", "resume", "cancel")
    ],
    path("runs/<id:run_id>/find/", find_views.run_find, name="run-find"),
    path("runs/<id:run_id>/first-failure", find_views.first_failure, name="run-first-failure"),
    path("runs/<id:run_id>/note", views.run_note, name="run-note"),
    path("runs/<id:run_id>/policy", views.run_policy, name="run-policy"),
    path("runs/<id:run_id>/memory", memory_views.run_memory, name="run-memory"),
    path("runs/<id:run_id>/memory/change", memory_views.memory_change, name="memory-change"),
    path(
        "runs/<id:run_id>/sessions/<id:index>/wake-up",
        memory_views.wake_up,
        name="session-wake-up",
    ),
    path("runs/<id:run_id>/checkpoint", checkpoint_views.checkpoint_now, name="checkpoint-now"),
    *[
        path(
            f"runs/<id:run_id>/checkpoints/<id:number>/{action}",
            checkpoint_views.checkpoint_action,
            {"action": action},
            name=f"checkpoint-{action}",
        )
        for action in checkpoint_views.ACTIONS
    ],
    path("runs/<id:run_id>/diff/", checkpoint_views.checkpoint_diff, name="checkpoint-diff"),
    path(
        "runs/<id:run_id>/checkpoints/<id:number>/export.tar.gz",
        export_views.checkpoint_export,
        name="checkpoint-export",
    ),
    path("runs/<id:run_id>/diff.patch", export_views.checkpoint_patch, name="checkpoint-patch"),
    path(
        "runs/<id:run_id>/artifacts/<id:artifact_id>/",
        views.artifact_view,
        name="artifact",
    ),
    path(
        "runs/<id:run_id>/artifacts/<id:artifact_id>/download",
        views.artifact_download,
        name="artifact-download",
    ),
    path("runs/<id:run_id>/schedule/", schedule_views.schedule_new, name="schedule-new"),
    path("runs/<id:run_id>/wake", schedule_views.run_wake, name="run-wake"),
    path("runs/<id:run_id>/wake/cancel", schedule_views.run_cancel_wake, name="run-cancel-wake"),
    path("schedules/", schedule_views.schedules_page, name="schedules"),
    *[
        path(
            f"schedules/<id:schedule_id>/{action}",
            schedule_views.schedule_action,
            {"action": action},
            name=f"schedule-{action}",
        )
        for action in schedule_views.SCHEDULE_ACTIONS
    ],
    path("triggers/", schedule_views.triggers_page, name="triggers"),
    path("triggers/<id:trigger_id>/revoke", schedule_views.trigger_revoke, name="trigger-revoke"),
    path("approvals/", views.approvals_inbox, name="approvals"),
    path("approvals/<id:approval_id>/decide", views.approval_decide, name="approval-decide"),
    path("approvals/mail/<str:token>/", reach_views.mail_link, name="approval-mail-link"),
    path("slack/interactive", reach_views.slack_interactive, name="slack-interactive"),
    path("runs/<id:run_id>/slack/", reach_views.run_slack, name="run-slack"),
    path("me/reach/", reach_views.my_reach, name="my-reach"),
    path("me/reach/slack", reach_views.my_slack_link, name="my-slack-link"),
    path("me/reach/slack/unlink", reach_views.my_slack_unlink, name="my-slack-unlink"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="registration/login.html"),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("login/<uidb64>/<token>/", views.login_link, name="login-link"),
    path("hooks/<str:token>/", hooks.hook, name="hook"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]
