from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        if settings.SHIFTLOG["LIVE_PUSH"]:
            from agents.eventlog import events_committed
            from dashboard.live import push_committed

            events_committed.connect(push_committed, dispatch_uid="dashboard.live.push")
