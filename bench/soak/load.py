"""The work and the people: scripted runs that exercise everything at once, and a simulated person
who decides approvals, writes notes, pauses and resumes, checkpoints, rewinds and forks, through
the same services the web and the CLI call.

Every database call may meet a dropped connection (the soak terminates PostgreSQL's backends):
`attempt` closes the connections and counts it, and the person tries again on its next tick.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

RISKY = "curl -s --max-time 2 http://example.invalid/ || true"
TERMINAL = {"succeeded", "failed", "cancelled"}


def script(rng: random.Random, *, turns: int, risky: bool, delay: float) -> dict:
    body = []
    for i in range(turns):
        kind = rng.choice(["write", "write", "bash", "list"])
        if kind == "write":
            call = {
                "name": "write_file",
                "input": {"path": f"work/f{i % 4}.txt", "content": f"turn {i}\n" * (1 + i % 7)},
            }
        elif kind == "bash":
            call = {
                "name": "bash",
                "input": {"command": f"echo turn {i} >> log.txt; wc -l log.txt"},
            }
        else:
            call = {"name": "list_files", "input": {"path": "."}}
        body.append({"text": f"Step {i}.", "tool_calls": [call]})
        if risky and i == turns // 2:
            body.append(
                {"text": "Fetching.", "tool_calls": [{"name": "bash", "input": {"command": RISKY}}]}
            )
    body.append({"text": "Done.", "tool_calls": [{"name": "finish", "input": {"summary": "ok"}}]})
    return {"name": "chaos", "turn_delay_seconds": delay, "turns": body}


@dataclass
class Person:
    rng: random.Random
    created: list[int] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    resume_at: dict[int, float] = field(default_factory=dict)
    user: object = None

    def attempt(self, what: str, fn, *args, **kwargs):
        """Call fn; a refusal (the run moved on) or a dropped connection is counted, not raised."""
        from django.db import DatabaseError, InterfaceError, connections

        try:
            value = fn(*args, **kwargs)
        except (DatabaseError, InterfaceError) as e:
            connections.close_all()
            self.errors[f"{what}: {type(e).__name__}"] += 1
            return None
        except Exception as e:
            self.errors[f"{what}: {type(e).__name__}"] += 1
            return None
        self.counts[what] += 1
        return value

    def setup(self) -> None:
        from django.contrib.auth import get_user_model

        User = get_user_model()
        self.user = User.objects.filter(username="chaos").first() or User.objects.create_superuser(
            "chaos", password="chaos-soak-pw-1"
        )

    # --- the work ----------------------------------------------------------------------------
    def create_run(self, delay: float) -> None:
        from agents import services
        from agents.runspec import RunSpec

        risky = self.rng.random() < 0.5
        turns = self.rng.randint(6, 14)
        spec = RunSpec(
            goal=f"Chaos soak run ({'risky' if risky else 'plain'}, {turns} turns).",
            checks=["true"],
            script=script(self.rng, turns=turns, risky=risky, delay=delay),
            script_name="chaos",
            max_turns_per_session=3,
        )
        run = self.attempt("create", services.create_run, spec, created_by=self.user)
        if run is not None:
            self.created.append(run.pk)

    def live_runs(self, everything: bool = False) -> list[tuple[int, str]]:
        from agents.models import Run

        runs = Run.objects.all() if everything else Run.objects.filter(pk__in=self.created)
        return list(runs.exclude(status__in=TERMINAL).values_list("pk", "status"))

    # --- one tick of the person --------------------------------------------------------------
    def tick(self, *, actions: bool) -> None:
        self.attempt("decide", self.decide_waiting)
        self.attempt("resume", self.resume_due)
        if actions and self.rng.random() < 0.35:
            live = self.attempt("read", self.live_runs) or []
            if live:
                run_id, status = self.rng.choice(live)
                action = self.rng.choice(
                    ["note", "note", "pause", "checkpoint", "checkpoint", "rewind", "fork"]
                )
                getattr(self, f"_{action}")(run_id, status)

    def decide_waiting(self) -> None:
        from django.utils import timezone

        from agents.approvals import decide
        from agents.models import Approval

        old = timezone.now() - timezone.timedelta(seconds=0.5)
        for a in Approval.objects.filter(status="pending", created_at__lt=old).order_by("pk")[:10]:
            roll = self.rng.random()
            if roll < 0.5:
                self.attempt("approve", decide, a.pk, user=self.user, approve=True)
            elif roll < 0.75:
                self.attempt(
                    "deny", decide, a.pk, user=self.user, approve=False, comment="not in the soak"
                )
            else:
                edited = dict(a.tool_input or {})
                if "command" in edited:
                    edited["command"] = "echo edited by the soak"
                self.attempt(
                    "edit", decide, a.pk, user=self.user, approve=True, edited_input=edited
                )

    def resume_due(self) -> None:
        """Resume what the person paused once its time is up, and what the harness paused (a
        full disk, a store error) a few seconds after, as a person reading the reason would."""
        from agents.models import Run

        now = time.monotonic()
        paused = Run.objects.filter(status="paused")
        for run_id, reason in paused.values_list("pk", "status_reason"):
            due = self.resume_at.setdefault(run_id, now + 3)
            if now >= due:
                self.resume_at.pop(run_id, None)
                if reason and "person" not in reason:
                    self.counts[f"harness paused: {reason[:60]}"] += 1
                self._resume(run_id)

    def finish_everything(self) -> None:
        """Settling: decide every approval and resume every paused run at once."""
        from agents.approvals import decide
        from agents.models import Approval, Run

        for a in Approval.objects.filter(status="pending"):
            self.attempt("approve", decide, a.pk, user=self.user, approve=True)
        for run_id in Run.objects.filter(status="paused").values_list("pk", flat=True):
            self._resume(run_id)

    def _resume(self, run_id: int) -> None:
        """Resume; a run over its sessions budget (rewinds and handoffs add sessions) gets ten
        more, as a person reading "raise it with --max-sessions" would give it."""
        from agents import services
        from agents.models import Run

        run = Run.objects.get(pk=run_id)
        budgets = None
        if "sessions used of" in services.budget_still_exceeded(run):
            budgets = services.Budgets(max_sessions=(run.max_sessions or 0) + 10)
            self.counts["raised the sessions budget"] += 1
        self.attempt("resume", services.resume_run, run_id, actor="user:chaos", budgets=budgets)

    # --- actions -----------------------------------------------------------------------------
    def _note(self, run_id: int, status: str) -> None:
        from agents import services

        self.attempt("note", services.note_run, run_id, "keep going", actor="user:chaos")

    def _pause(self, run_id: int, status: str) -> None:
        from agents import services

        if status not in {"running", "queued"}:
            return
        if self.attempt("pause", services.pause_run, run_id, actor="user:chaos") is not None:
            self.resume_at[run_id] = time.monotonic() + self.rng.uniform(1, 4)

    def _checkpoint(self, run_id: int, status: str) -> None:
        from agents import checkpoints
        from agents.models import CheckpointKind

        self.attempt(
            "checkpoint", checkpoints.create, run_id, kind=CheckpointKind.MANUAL, actor="user:chaos"
        )

    def _rewind(self, run_id: int, status: str) -> None:
        from agents import rewinds
        from agents.models import Checkpoint

        cps = list(Checkpoint.objects.filter(run_id=run_id).values_list("pk", flat=True))
        if len(cps) >= 2 and status != "verifying":
            target = self.rng.choice(cps[:-1])
            self.attempt(
                "rewind",
                rewinds.request_rewind,
                run_id,
                target,
                actor="user:chaos",
                note="again",
            )

    def _fork(self, run_id: int, status: str) -> None:
        from agents import checkpoints
        from agents.models import Checkpoint

        if self.counts["fork"] >= 3 + len(self.created) // 10:
            return
        # From its first checkpoint: a fork from the last one of a run at its script's end has
        # nothing left to play, and fails (rightly) with "the script ran out".
        cp = Checkpoint.objects.filter(run_id=run_id).order_by("seq").first()
        if cp is not None:
            forked = self.attempt(
                "fork", checkpoints.fork, run_id, cp.pk, actor="user:chaos", created_by=self.user
            )
            if forked is not None:
                self.created.append(forked.pk)
