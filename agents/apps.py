from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The tasks register themselves with agents.jobs, through which every process (web,
        # CLI and worker) queues them; run_huey would import them too, the others do not.
        from agents import tasks  # noqa: F401, PLC0415 (loaded once the apps are ready)

        # Features reach into the core through the hooks it calls (agents/hooks.py).
        from agents.fleets import cascade, parent  # noqa: PLC0415 (features: once the apps are ready)

        cascade.register()
        parent.register()
        # An external agent's call is settled by the decision itself (off the agent's path).
        from agents.runtime import external_settle  # noqa: PLC0415

        external_settle.register()
