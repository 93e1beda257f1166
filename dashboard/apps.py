from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        if settings.SHIFTLOG["LIVE_PUSH"]:
            # Here, not at the top: an app's models (and so the hub's imports) may be loaded only
            # once the app registry is ready, which is what ready() is for.
            from agents.eventlog import events_committed  # noqa: PLC0415
            from dashboard.live.hub import push_committed  # noqa: PLC0415

            events_committed.connect(push_committed, dispatch_uid="dashboard.live.push")
