"""Finishing: the agent's word that it is done is never enough.

When the agent calls `finish`, the run goes to `verifying` and the harness runs the
done-conditions itself (protected files put back first), records each result, the ratchet's
regressions and the acceptance criteria, and then, if a rubric is set, asks the judge. Only when
everything passes does the session end and the run succeed; otherwise the agent reads why and
carries on. The same checks run at every handoff (the ratchet), so slipping progress shows even if
the agent never calls finish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.conf import settings
from django.db import DatabaseError
from django.db.models import F

from agents import (
    check_settings,
    config_changes,
    done_conditions,
    held_out,
    sandbox,
    suite_guard,
    verification,
    workspaces,
)
from agents.eventlog import LeaseLost
from agents.models import (
    Approval,
    ArtifactKind,
    Checkpoint,
    CheckpointKind,
    EndReason,
    Event,
    EventKind,
    Run,
    RunStatus,
)
from agents.providers import pricing
from agents.providers.base import ProviderError, Usage
from agents.runtime.config_hold import ConfigHold
from agents.runtime.gate import wait_for
from agents.runtime.sessions import Sessions
from agents.runtime.slice import Slice, SliceOver, SliceResult
from agents.runtime.turns import Turns, crashed


@dataclass
class Verification:
    """What one run of the done-conditions found."""

    passed: bool
    results: list[dict[str, Any]]  # every check run, acceptance checks included
    required: list[dict[str, Any]]  # the run's own done-conditions among them
    notes: list[str] = field(default_factory=list)  # what the agent must know beyond them


class Finish:
    def __init__(self, s: Slice, sessions: Sessions, turns: Turns) -> None:
        self.s = s
        self.sessions = sessions
        self.turns = turns  # the judge is a model call: it fails as a turn does
        self._blocked: list[dict[str, Any]] = []  # what the last put-back found that blocks
        self.config = ConfigHold(s)  # changes to how the checks run, held for a person

    def finish(self, block: dict[str, Any]) -> None:
        """The agent called finish: verify; succeed (the slice ends) or tell it what fails."""
        s = self.s
        s.join_deferred()
        s.transition(
            RunStatus.VERIFYING,
            reason="the agent called finish; running the done-conditions",
            expect={RunStatus.RUNNING},
        )
        asked = self.config.pending()  # held changes the agent was told of before this call
        outcome = self.verify(at="finish")
        passed, notes = outcome.passed, outcome.notes
        if passed and (s.run.held_out or {}).get("checks"):
            passed = held_out_checks(self.s, notes)
        if passed and verification.criteria_of(s.run):
            verdict = self._judge(outcome.results)
            passed = verdict.passed
            if not verdict.passed:
                notes.append(
                    "The judge did not accept the work:\n"
                    + "\n".join(f"- {c['criterion']}: {c['reason']}" for c in verdict.failures())
                )
        summary = "\n\n".join([done_conditions.summary(outcome.required), *notes])
        s.store_artifact(
            f"checks-session-{s.session.index}-turn-{s.session.turns}.md",
            ArtifactKind.REPORT,
            f"# Done-conditions\n\n{summary}\n".encode(),
            "text/markdown",
        )
        if passed:
            self._succeed(block, summary)
        s.transition(
            RunStatus.RUNNING,
            reason="done-conditions not met; the agent continues",
            expect={RunStatus.VERIFYING},
        )
        s.record_result(block, sandbox.ToolResult(output=summary, is_error=True))
        if (waiting := asked & self.config.pending()) and not s.run.is_external:
            # Finish again with the change still held: nothing else to do but wait for it.
            wait_for(s, Approval.objects.get(pk=min(waiting)))

    def _succeed(self, block: dict[str, Any], summary: str) -> NoReturn:
        s = self.s
        # The result and the session's end in one transaction: a worker that died between them
        # left a passed finish in a session still open, and the next worker sent the agent back
        # to work it had finished (found by bench/chaos.py). Nothing reads the conversation
        # after this, so the result goes only to the log.
        result = s.result_event(block, sandbox.ToolResult(output=summary))
        self.sessions.end(EndReason.FINISHED, extra=[result])
        s.transition(
            RunStatus.SUCCEEDED, reason="every done-condition passed", expect={RunStatus.VERIFYING}
        )
        raise SliceOver(SliceResult.SUCCEEDED)

    def ratchet(self) -> Callable[[Checkpoint], None] | None:
        """At a handoff: the ratchet's reading. Protected files are put back now, so the
        session's checkpoint holds the originals. The checks run now too, unless this slice
        defers them (Slice.deferring): then they are returned, to run on the workspace as the
        checkpoint holds it while the next session starts (its first tool call waits for
        them), and they complete that checkpoint's reading."""
        if not settings.SHIFTLOG["CHECKS_AT_SESSION_END"]:
            return None
        notes = self._put_back("session_end")
        if not self.s.deferring:
            self._check("session_end", notes)
            return None

        def later(checkpoint: Checkpoint) -> None:
            self._check("session_end", notes)
            state = {**(checkpoint.state or {}), "checks": done_conditions.reading(self.s.run_id)}
            Checkpoint.objects.filter(pk=checkpoint.pk).update(state=state)

        return later

    def verify(self, *, at: str) -> Verification:
        """Run the checks (and acceptance checks) as the harness: protected originals first,
        then record results, regressions and acceptance changes."""
        return self._check(at, self._put_back(at))

    def _all_checks(self) -> list[str]:
        run = self.s.run
        extra = [
            c["check"] for c in run.acceptance if c.get("check") and c["check"] not in run.checks
        ]
        return [*run.checks, *extra]

    def guarded(self) -> bool:
        """Whether this run's test-suite checks run guarded (agents/suite_guard.py)."""
        run = self.s.run
        return bool(run.suite_guard) and any(suite_guard.suite_kind(c) for c in self._all_checks())

    def baseline(self) -> dict[str, Any]:
        """At the run's start, before the agent's first turn: what each test-suite check counts
        on the workspace as it was made ({command: counts or None}): the ratchet's floor."""
        if not self.guarded():
            return {}
        results = self.s.run_checks(
            [c for c in self._all_checks() if suite_guard.suite_kind(c)], guard=True
        )
        return {r["command"]: r.get("suite") for r in results}

    def _baseline_of_run(self) -> dict[str, Any]:
        start = (
            Checkpoint.objects.filter(
                run_id=self.s.run_id, kind__in=[CheckpointKind.RUN_START, CheckpointKind.FORK]
            )
            .order_by("seq")
            .values_list("state", flat=True)
            .first()
        )
        return (start or {}).get("suite_baseline") or {}

    def _put_back(self, at: str) -> list[str]:
        self._blocked = []
        self.config.refresh()  # a person's approval may have moved a baseline
        if at != "session_end":  # the session ending would not carry it to the next one
            self.config.tell_decisions()
        notes: list[str] = []
        held: list[config_changes.Held] = []
        if self.s.run.protected:
            notes += self._put_back_protected(at, held)
        if self.s.run.check_settings is not None:
            notes += self._put_back_check_settings(at, held)
        return notes + self.config.hold(held)

    def _check(self, at: str, notes: list[str]) -> Verification:
        s, run = self.s, self.s.run
        guarded = self.guarded()
        results = s.run_checks(
            self._all_checks(),
            guard=guarded,
            baseline=self._baseline_of_run() if guarded else None,
        )
        for r in results:
            r["at"] = at
            r["required"] = r["command"] in run.checks
        regressed = verification.regressions(s.run_id, results)
        s.append(
            *[s.event(EventKind.CHECK_RESULT, r) for r in results],
            *[s.event(EventKind.CHECK_REGRESSED, {**g, "at": at}) for g in regressed],
        )
        if regressed:
            notes.append(
                "REGRESSION: these checks passed earlier and fail now: "
                + ", ".join(f"`{g['command']}`" for g in regressed)
            )
        by_command = {r["command"]: r["passed"] for r in results}
        self._update_acceptance(
            {
                c["name"]: by_command[c["check"]]
                for c in run.acceptance
                if c.get("check") in by_command
            }
        )
        required = [r for r in results if r["required"]]
        failing = [
            c["name"] for c in run.acceptance if c.get("check") and not by_command.get(c["check"])
        ]
        if failing:
            notes.append("Acceptance criteria not met yet: " + ", ".join(failing))
        blocked = self._blocked
        if blocked:
            notes.append(
                "NOT DONE: the workspace holds code that would run in place of the source or of "
                "the test runner (moved aside before the checks ran; the run cannot succeed "
                "while it is there): " + ", ".join(f"{c['path']} ({c['kind']})" for c in blocked)
            )
        passed = (
            bool(required) and all(r["passed"] for r in required) and not failing and not blocked
        )
        return Verification(passed, results, required, notes)

    def _put_back_protected(self, at: str, held: list[config_changes.Held]) -> list[str]:
        """Protected files changed since creation are recorded and put back before the checks;
        what was added under a protected folder is kept as an artifact, not lost; what a person
        may approve is added to `held`."""
        s, run = self.s, self.s.run
        notes = []
        everything = verification.tampered(s.workspace, run.protected)
        quiet = self.config.quiet(everything, run.protected)
        changed = [c for c in everything if c not in quiet]
        held += config_changes.held_protected(s.workspace.path, run.protected, changed)
        if quiet:  # the harness's own earlier put-back: put back again, not the agent's work
            verification.restore_originals(s.workspace, run.protected, quiet)
        if changed:
            s.append(s.event(EventKind.CHECK_TAMPERED, {"files": changed, "at": at}))
            moved = verification.restore_originals(s.workspace, run.protected, changed)
            for rel, data in moved.items():
                s.store_artifact(f"moved-aside/{rel}", ArtifactKind.FILE, data)
            notes.append(
                "Protected files were changed and have been put back to their originals before "
                "the checks ran (files added under a protected folder are kept as moved-aside/ "
                "artifacts): " + ", ".join(f"{c['path']} ({c['change']})" for c in changed)
            )
        verification.clear_caches(s.workspace, run.protected)
        return notes

    def _put_back_check_settings(self, at: str, held: list[config_changes.Held]) -> list[str]:
        """What changes how the checks run is put back as it was at creation (conftest.py,
        test settings, .pth files, shims), or as a person approved it since; what the agent
        added is kept as an artifact, and the test-runner settings are added to `held`."""
        s, run = self.s, self.s.run
        guarded = suite_guard.guarded_names(s.toolchain) if self.guarded() else None
        found = check_settings.changes(s.workspace.path, run.check_settings, guarded)
        quiet = self.config.quiet(found, run.check_settings)
        check_settings.neutralise(s.workspace.path, run.check_settings, quiet)
        found = [c for c in found if c not in quiet]
        if not found:
            return []
        held += config_changes.held_settings(s.workspace.path, found)
        self._blocked = [
            c
            for c in found
            if c["kind"] in check_settings.BLOCKING_KINDS and c["change"] != "deleted"
        ]
        s.append(
            s.event(EventKind.CHECK_TAMPERED, {"files": found, "at": at, "what": "check settings"})
        )
        for rel, data in check_settings.neutralise(
            s.workspace.path, run.check_settings, found
        ).items():
            s.store_artifact(f"moved-aside/{rel}", ArtifactKind.FILE, data)
        return [
            "Files that change how the checks run were added or changed; the checks ran with "
            "them as they were when the run was created (your versions are kept as moved-aside/ "
            "artifacts): " + ", ".join(f"{c['path']} ({c['change']}: {c['kind']})" for c in found)
        ]

    def _update_acceptance(self, states: dict[str, bool]) -> None:
        s, run = self.s, self.s.run
        changed = [
            c["name"]
            for c in run.acceptance
            if c["name"] in states and c["passing"] != states[c["name"]]
        ]
        if not changed:
            return
        run.acceptance = [
            {**c, "passing": states.get(c["name"], c["passing"])} for c in run.acceptance
        ]
        Run.objects.filter(pk=run.pk).update(acceptance=run.acceptance)
        passing = sum(c["passing"] for c in run.acceptance)
        s.append(
            s.event(
                EventKind.ACCEPTANCE_UPDATED,
                {
                    "changed": changed,
                    "passing": passing,
                    "total": len(run.acceptance),
                    "criteria": run.acceptance,
                },
            )
        )

    def _judge(self, results: list[dict[str, Any]]) -> verification.Verdict:
        s, run = self.s, self.s.run
        start = (
            Checkpoint.objects.filter(
                run=run, kind__in=[CheckpointKind.RUN_START, CheckpointKind.FORK]
            )
            .order_by("seq")
            .first()
        )
        changes = workspaces.diff_live(run, start.tree if start else None)
        diff_text = "\n".join(
            c.diff or f"{c.status}: {c.path}" + (" (binary)" if c.binary else "") for c in changes
        )
        so_far = Event.objects.on_live_branch(run.pk).filter(kind=EventKind.JUDGE_VERDICT).count()
        try:
            verdict = verification.run_judge(
                run,
                s.provider,
                diff_text=diff_text,
                check_results=results,
                verdicts_so_far=so_far,
                ask=lambda call: s.call_model(call, cancelled=self.sessions.stop_unless_running),
            )
        except (SliceOver, LeaseLost, DatabaseError):
            raise  # a busy database is not the model's failure: the slice is tried again
        except ProviderError as e:
            self.turns.provider_failed(e)
        except Exception as e:
            self.turns.provider_failed(crashed(s.provider, e))
        priced = pricing.cost(verdict.model or run.judge_model or run.model, Usage(**verdict.usage))
        cost = priced.usd
        s.append(
            s.event(
                EventKind.JUDGE_VERDICT,
                {
                    "criteria": verdict.criteria,
                    "passed": verdict.passed,
                    "model": verdict.model,
                    "error": verdict.error,
                    "usage": verdict.usage,
                    "cost_usd": str(cost),
                },
                actor="judge",
            )
        )
        if cost:
            Run.objects.filter(pk=run.pk).update(cost_usd=F("cost_usd") + cost)
            run.cost_usd += cost
        if priced.source == "fallback" and not run.cost_estimated:
            Run.objects.filter(pk=run.pk).update(cost_estimated=True)
            run.cost_estimated = True
        judged = {c["criterion"]: c["passed"] for c in verdict.criteria}
        self._update_acceptance(
            {
                c["name"]: judged[c["name"]]
                for c in run.acceptance
                if not c.get("check") and c["name"] in judged
            }
        )
        return verdict


def held_out_checks(s: Slice, notes: list[str]) -> bool:
    """The held-out checks (agents/held_out.py), once every done-condition passed. The agent
    learns which failed, never their output (kept as an artifact for people)."""
    run = s.run
    guarded = bool(run.suite_guard)
    results = held_out.run_held_out(
        run.held_out,
        s.workspace,
        should_stop=s.heartbeat,
        timeout=settings.SHIFTLOG["CHECK_TIMEOUT_SECONDS"],
        output_limit=settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"],
        isolation=s.isolation,
        limits=s.limits,
        toolchain=s.toolchain,
        guard=guarded,
    )
    report = "\n\n".join(
        f"## `{r['command']}`: {'passed' if r['passed'] else 'FAILED'}\n\n"
        + done_conditions.fenced(r["output"][-8000:])
        for r in results
    )
    s.store_artifact(
        f"held-out-checks-session-{s.session.index}-turn-{s.session.turns}.md",
        ArtifactKind.REPORT,
        f"# Held-out checks\n\n{report}\n".encode(),
        "text/markdown",
    )
    s.append(
        *[
            s.event(
                EventKind.CHECK_RESULT,
                {
                    "command": f"held-out: {r['command']}",
                    "exit_code": r["exit_code"],
                    "passed": r["passed"],
                    "timed_out": r["timed_out"],
                    "cancelled": r["cancelled"],
                    "output": "(held out: the output is kept as an artifact for people)",
                    "at": "finish",
                    "required": False,
                    "held_out": True,
                },
            )
            for r in results
        ]
    )
    failed = [r["command"] for r in results if not r["passed"]]
    if failed:
        notes.append(
            f"{len(failed)} of {len(results)} held-out checks failed (checks you do not "
            "see, run only at finish: fix the behaviour in general, not for the visible "
            "tests' inputs)."
        )
    return not failed
