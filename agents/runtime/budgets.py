"""A run's budgets, checked before every step: tokens, dollars, active wall time (and, when a
session starts, the number of sessions). A `budget.warning` at 80% of any of them; at 100% the run
pauses with the reason, so a person can raise the budget and resume."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any, NoReturn

from agents import hooks, isolation, reach
from agents.eventlog import NewEvent
from agents.isolation import MIB
from agents.models import EventKind, PauseCause, Run, RunStatus
from agents.runtime.slice import Slice, SliceOver, SliceResult

BUDGET_WARNING_AT = 0.8


class Budgets:
    def __init__(self, s: Slice) -> None:
        self.s = s

    def check(self) -> None:
        run = self.s.run
        active = run.active_seconds + (time.monotonic() - self.s.started)
        tokens, cost = run.total_tokens, run.cost_usd
        if (run.max_tokens or run.max_cost_usd) and run.children.exists():
            # A fleet's parent spends through its children too.
            for spent in hooks.spent_with_children.collect(run):
                tokens, cost = spent.tokens, spent.cost_usd
        limits = [
            ("tokens", tokens, run.max_tokens, "max tokens ({limit}) reached"),
            ("cost", cost, run.max_cost_usd, "max cost (${limit}) reached"),
            ("wall time", active, run.max_wall_seconds, "max wall time ({limit} s) reached"),
        ]
        for name, used, limit, message in limits:
            if limit:
                if used >= limit:
                    self.exceed(message.format(limit=limit))
                self.warn_if_near(name, used, limit)
        cap = isolation.workspace_cap(run)
        if cap and self.s.workspace_bytes > cap:
            self.exceed(
                f"the workspace holds {self.s.workspace_bytes / MIB:,.0f} MB, over its cap of "
                f"{cap / MIB:,.0f} MB: free space (or raise --max-workspace-mb) and resume"
            )

    def warn_if_near(self, name: str, used: Any, limit: Any) -> None:
        run = self.s.run
        if (
            not limit
            or name in run.budget_warnings
            or used < Decimal(str(limit)) * Decimal(str(BUDGET_WARNING_AT))
        ):
            return
        run.budget_warnings = [*run.budget_warnings, name]
        Run.objects.filter(pk=run.pk).update(budget_warnings=run.budget_warnings)
        reach.run_news(run, "budget", f"has used {used} of its {name} budget ({limit})")
        # Budget events belong to the run, not to a session.
        self.s.append(
            NewEvent(
                EventKind.BUDGET_WARNING,
                {"budget": name, "used": str(used), "limit": str(limit)},
                actor=self.s.owner,
            )
        )

    def exceed(self, reason: str) -> NoReturn:
        """Pause the run with the reason; the slice ends."""
        s = self.s
        s.append(NewEvent(EventKind.BUDGET_EXCEEDED, {"reason": reason}, actor=s.owner))
        s.transition(
            RunStatus.PAUSED,
            reason=f"budget: {reason}; raise it and resume",
            cause=PauseCause.BUDGET,
        )
        s.suspend_session()
        raise SliceOver(SliceResult.PAUSED)
