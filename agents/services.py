"""What people (and the CLI, admin and dashboard) do to runs: create, pause, resume, cancel, steer,
change the tool policy.

Each action checks its input, goes through lifecycle for status changes, records an event naming
who did it, and queues work when there is work to do. Views and commands stay thin.
"""

from __future__ import annotations

import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import check_settings as check_settings_module
from agents import (
    eventlog,
    hooks,
    inputs,
    isolation,
    lifecycle,
    policy,
    sandbox,
    verification,
    workspaces,
)
from agents import suite_guard as suite_guard_module
from agents import test_setup as test_setup_module
from agents.jobs import enqueue
from agents.models import (
    EventKind,
    PauseCause,
    Provider,
    Run,
    RunScript,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.providers.scripted import builtin_script
from agents.runspec import Budgets, RunSpec

DEMO_GOAL = (
    "Write a small Python module textstats.py with word_count(text) and top_words(text, n), "
    "and unit tests for it in test_textstats.py. The tests must pass."
)
DEMO_CHECKS = ["python3 -m unittest -q"]
# What a person is told when a scripted run gets no script of its own (the CLI, the web form).
DEMO_SCRIPT_NOTICE = (
    "the scripted provider will play the built-in demo script, which works on the demo's task "
    "(textstats.py), not on this goal."
)
DEMO_GOAL_NOTICE = (
    "the scripted provider will play the built-in demo script: this is the demo's goal."
)


# Bad input for a run action; the message says what to change, `field` which input it was.
RunError = inputs.InputError


def actor_for(user) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


def _forked_from(checkpoint) -> dict[str, Any]:
    origin = {
        "run_id": checkpoint.run_id,
        "checkpoint_id": checkpoint.pk,
        "number": checkpoint.number,
    }
    waiting = checkpoint.waiting_approval()
    if waiting is not None:  # said plainly: the fork does not make that call
        origin["skipped_call"] = {
            "approval_id": waiting.pk,
            "tool": waiting.tool_name,
            "input": waiting.tool_input,
        }
    return origin


def create_run(
    spec: RunSpec,
    *,
    created_by=None,
    actor: str | None = None,
    forked_from=None,
    resume_state: dict[str, Any] | None = None,
    origin: dict[str, Any] | None = None,
    parent: Run | None = None,
    workspace_tree: str | None = None,
) -> Run:
    """Create a run from its spec (agents/runspec.py: every setting, checked there) and queue it.
    The keywords say how it came to be: who made it, the checkpoint it is forked from (and the
    state it resumes), what made it when not a person (`origin`: template, schedule, trigger),
    and for a fleet's child its `parent` and the tree its workspace starts from."""
    spec = spec.clean()
    source = spec.workspace_from
    toolchain = _toolchain(spec) if spec.toolchain is None else list(spec.toolchain)
    fields = spec.run_fields()
    with transaction.atomic():
        run = Run.objects.create(
            **fields,
            toolchain=toolchain,
            created_by=created_by,
            forked_from=forked_from,
            resume_state=resume_state,
            parent=parent,
            depth=parent.depth + 1 if parent is not None else 0,
        )
        if spec.provider == Provider.SCRIPTED:
            RunScript.objects.create(run=run, script=spec.script)
        workspace = run.workspace_path
        if workspace.exists():
            # A leftover from a database that was reset: never mix another run's files in.
            shutil.rmtree(workspace)
        if forked_from is not None:
            workspaces.restore(run, forked_from.tree)
        elif workspace_tree is not None:
            workspaces.restore(run, workspace_tree)
        elif source is not None:
            shutil.copytree(source, workspace, symlinks=True, ignore=test_setup_module.leave_out)
        else:
            workspace.mkdir(parents=True)
        toolchain = _check_environment(run, spec.test_setup, toolchain, source is not None)
        # A test-suite check (and not opted out): the names a workspace module must not take.
        guarded = suite_guard_module.guarded_names(toolchain or None) if spec.suite_guard else None
        tests = (
            suite_guard_module.test_paths(workspace)
            if guarded is not None and spec.protect_tests and spec.protected is None
            else []
        )
        run.protected = _protected(spec, workspace, tests)
        if spec.check_settings is not None:
            run.check_settings = dict(spec.check_settings)  # a fork's are its origin's
        else:
            try:
                run.check_settings = check_settings_module.fingerprint(workspace, guarded)
            except check_settings_module.OutsidePointer as e:
                raise RunError(str(e), "workspace_from") from None
        # Where workspaces are each host's cache, the workspace starts in the store: the worker
        # that claims the run restores it wherever that is.
        start = workspaces.snapshot(run) if workspaces.cached() else None
        Run.objects.filter(pk=run.pk).update(
            protected=run.protected,
            check_settings=run.check_settings,
            toolchain=toolchain,
            workspace_tree=start.tree if start else "",
        )
        if start:
            workspaces.hold(run, start.tree, start.bytes_total)
        budgets = {name: fields[name] for name in BUDGET_FIELDS if fields[name] is not None}
        eventlog.append(
            run.pk,
            EventKind.RUN_CREATED,
            {
                "goal": spec.goal,
                "checks": spec.checks,
                "provider": spec.provider,
                "model": spec.model,
                "script_name": spec.script_name,
                **({"project": spec.project} if spec.project else {}),
                "budgets": {k: str(v) for k, v in budgets.items()},
                "workspace_from": str(source) if source else None,
                "tool_policy": spec.tool_policy,
                "limits": spec.limits,
                "toolchain": toolchain,
                "rubric": spec.rubric,
                "protected": sorted(run.protected),
                "acceptance": [c["name"] for c in spec.acceptance],
                "forked_from": _forked_from(forked_from) if forked_from else None,
                # What made it, when not a person: {"template", "schedule" or "trigger"}.
                **({"origin": origin} if origin else {}),
                **({"parent": parent.pk, "depth": parent.depth + 1} if parent else {}),
            },
            actor=actor or actor_for(created_by),
        )
        if spec.provider != Provider.EXTERNAL:  # an external run waits for its agent to call
            enqueue(run.pk)
    run.refresh_from_db()
    return run


# The budgets and per-session bounds a run.created event lists.
BUDGET_FIELDS = (
    "max_turns_per_session", "max_input_tokens_per_session", "max_sessions", "max_tokens",
    "max_cost_usd", "max_wall_seconds",
)  # fmt: skip


def _protected(spec: RunSpec, workspace: Path, tests: list[str]) -> dict[str, Any]:
    """The fingerprints of the protected paths: a fork's are its origin's (given), else taken
    from the fresh workspace; with a guarded test suite, its `tests` too."""
    if spec.protected is not None:
        return dict(spec.protected)
    if not spec.protected_paths and not tests:
        return {}
    try:
        found = verification.fingerprint(
            sandbox.Workspace(workspace), [*spec.protected_paths, *tests]
        )
    except (sandbox.ToolInputError, OSError) as e:
        raise RunError(f"protect: {e}", "protected_paths") from None
    if spec.protected_paths and not found:
        raise RunError("protect: the paths given hold no files", "protected_paths")
    return found


def _check_environment(run: Run, setup: Any, toolchain: list[str], copied: bool) -> list[str]:
    """The run's toolchain once its workspace exists: built from a detected test set-up (the
    project editable from the workspace), or the one named, refused when it holds a copy of the
    project (its checks would test that copy)."""
    if setup is not None:
        spec = test_setup_module.Setup(**setup)
        where = Path(settings.DATA_DIR) / "envs" / uuid.uuid4().hex[:16]
        try:
            return test_setup_module.build(
                spec, run.workspace_path, where, Path(settings.DATA_DIR) / "envs"
            )
        except test_setup_module.SetupProblem as e:
            shutil.rmtree(where, ignore_errors=True)
            raise RunError(f"test set-up: {e}", "test_setup") from None
    if copied and toolchain:
        why = test_setup_module.installed_copy(toolchain, run.workspace_path)
        if why:
            raise RunError(f"environment: {why}", "environment")
    return toolchain


def _toolchain(spec: RunSpec) -> list[str]:
    """The folders a run's commands and checks get: a named interpreter or virtualenv, or one
    built from the project's requirements (outside the workspace: the agent cannot change what
    the checks run with)."""
    try:
        if spec.environment:
            return isolation.interpreter_folders(spec.environment)
        if spec.requirements:
            where = Path(settings.DATA_DIR) / "envs" / uuid.uuid4().hex[:16]
            return isolation.build_venv(spec.requirements, where)
    except isolation.EnvironmentProblem as e:
        raise RunError(f"environment: {e}", "environment") from None
    return []


def is_demo_goal(goal: str) -> bool:
    return " ".join(str(goal).split()) == DEMO_GOAL


def create_demo_run(created_by=None, *, turn_delay_seconds: float | None = None) -> Run:
    script = builtin_script("demo")
    delay = (
        settings.SHIFTLOG["DEMO_TURN_DELAY_SECONDS"]
        if turn_delay_seconds is None
        else turn_delay_seconds
    )
    script["turn_delay_seconds"] = delay
    spec = RunSpec(
        goal=DEMO_GOAL,
        checks=DEMO_CHECKS,
        script=script,
        script_name="demo (built in)",
        max_turns_per_session=4,
    )
    return create_run(spec, created_by=created_by)


def _get(run_id: int) -> Run:
    try:
        return Run.objects.get(pk=inputs.object_id(run_id, what="a run id"))
    except (Run.DoesNotExist, inputs.InputError):
        raise RunError(f"no run with id {run_id}") from None


def pause_run(run_id: int, *, actor: str, reason: str = "") -> Run:
    run = _get(run_id)
    if run.status == RunStatus.PAUSED:
        raise RunError(f"run {run_id} is already paused")
    try:
        run = lifecycle.transition(
            run_id,
            RunStatus.PAUSED,
            actor=actor,
            reason=reason or f"paused by {actor}",
            cause=PauseCause.PERSON,
        )
    except lifecycle.IllegalTransition as e:
        raise RunError(str(e)) from None
    hooks.controlled(run_id, "pause", f"run {run_id} was paused by {actor}", actor)
    return run


def resume_run(run_id: int, *, actor: str, budgets: Budgets | None = None) -> Run:
    run = _get(run_id)
    if run.status != RunStatus.PAUSED:
        raise RunError(f"run {run_id} is {run.status}; only a paused run can be resumed")
    raised = (budgets or Budgets()).cleaned()
    with transaction.atomic():
        if raised:
            Run.objects.filter(pk=run_id).update(**raised, budget_warnings=[])
            eventlog.append(
                run_id,
                EventKind.RUN_UPDATED,
                {"budgets": {k: str(v) for k, v in raised.items()}},
                actor=actor,
            )
            run.refresh_from_db()
        over = budget_still_exceeded(run)
        if over:
            raise RunError(f"run {run_id} is still over its budget: {over}")
        run = lifecycle.transition(
            run_id, RunStatus.QUEUED, actor=actor, reason=f"resumed by {actor}"
        )
        Run.objects.filter(pk=run_id).update(wake_at=None)
        enqueue(run_id)
    hooks.controlled(run_id, "resume", f"run {run_id} was resumed by {actor}", actor)
    return run


def wake_at(run_id: int, when: datetime, *, actor: str, now: datetime | None = None) -> Run:
    """Have a paused run resume at `when` (the scheduler's pass does it: agents/schedules/cron.py)."""
    run = _get(run_id)
    if run.status != RunStatus.PAUSED:
        raise RunError(f"run {run_id} is {run.status}; only a paused run can be woken later")
    if timezone.is_naive(when):
        raise RunError("--at needs a time zone, e.g. 2026-05-01T09:00:00+00:00 or ...Z", "at")
    if when <= (now or timezone.now()):
        raise RunError(f"--at {when.isoformat()} is in the past", "at")
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(wake_at=when)
        eventlog.append(run_id, EventKind.RUN_UPDATED, {"wake_at": when.isoformat()}, actor=actor)
    run.refresh_from_db()
    return run


def cancel_wake(run_id: int, *, actor: str) -> Run:
    run = _get(run_id)
    with transaction.atomic():
        if not Run.objects.filter(pk=run_id, wake_at__isnull=False).update(wake_at=None):
            raise RunError(f"run {run_id} has no wake-up to cancel")
        eventlog.append(run_id, EventKind.RUN_UPDATED, {"wake_at": None}, actor=actor)
    run.refresh_from_db()
    return run


def budget_still_exceeded(run: Run) -> str:
    if run.max_tokens and run.total_tokens >= run.max_tokens:
        return f"{run.total_tokens} tokens used of {run.max_tokens}: raise it with --max-tokens"
    if run.max_cost_usd and run.cost_usd >= run.max_cost_usd:
        return f"${run.cost_usd} spent of ${run.max_cost_usd}: raise it with --max-cost"
    if run.max_wall_seconds and run.active_seconds >= run.max_wall_seconds:
        return f"{run.active_seconds:.0f} s of {run.max_wall_seconds} s: raise it with --max-wall-seconds"
    if run.max_sessions:
        ended = Session.objects.filter(run=run, status=SessionStatus.ENDED).count()
        open_session = Session.objects.filter(run=run).exclude(status=SessionStatus.ENDED).exists()
        if not open_session and ended >= run.max_sessions:
            return f"{ended} sessions used of {run.max_sessions}: raise it with --max-sessions"
    return ""


def cancel_run(run_id: int, *, actor: str, reason: str = "") -> Run:
    _get(run_id)
    try:
        run = lifecycle.transition(
            run_id, RunStatus.CANCELLED, actor=actor, reason=reason or f"cancelled by {actor}"
        )
    except lifecycle.IllegalTransition as e:
        raise RunError(str(e)) from None
    hooks.controlled(run_id, "cancel", f"run {run_id} was cancelled by {actor}", actor)
    return run


def note_run(run_id: int, text: str, *, actor: str, author: str = "") -> None:
    run = _get(run_id)
    text = inputs.text(text, what="a note", field="text", empty="a note needs some text")
    if not run.is_live:
        raise RunError(f"run {run_id} is {run.status}; notes reach only a live run")
    open_session = (
        Session.objects.filter(run_id=run_id)
        .exclude(status=SessionStatus.ENDED)
        .order_by("-index")
        .first()
    )
    eventlog.append(
        run_id,
        EventKind.HUMAN_NOTE,
        {"text": text, "author": author or actor},
        actor=actor,
        session_id=open_session.pk if open_session else None,
    )


def set_policy(run_id: int, rules: Any, *, actor: str, because: str = "") -> list[dict[str, Any]]:
    """Replace a run's tool policy: validated, then a run.updated event naming who and why (the
    runtime reads the change from that event at its next step)."""
    try:
        rules = policy.validate(rules)
    except policy.PolicyError as e:
        raise RunError(str(e), "tool_policy") from None
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(tool_policy=rules)
        eventlog.append(
            run_id, EventKind.RUN_UPDATED, {"tool_policy": rules, "because": because}, actor=actor
        )
    return rules


def add_rule(
    run_id: int, rule: dict[str, Any], *, actor: str, because: str = ""
) -> list[dict[str, Any]]:
    """Put one rule first in a run's tool policy (an "allow similar" decision, a host denied),
    recorded as the change: a run.updated event holding the rule added, not the whole policy
    again (500 denials wrote 23.7 MB of events). The same rule already first adds nothing.
    Raises RunError when the policy would be too long; nothing is changed then."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        try:
            (rule,) = policy.validate([rule])
            if run.tool_policy and run.tool_policy[0] == rule:
                return run.tool_policy
            rules = [rule, *run.tool_policy]
            policy.check_length(rules)
        except policy.PolicyError as e:
            raise RunError(str(e), "tool_policy") from None
        Run.objects.filter(pk=run_id).update(tool_policy=rules)
        eventlog.append(
            run_id,
            EventKind.RUN_UPDATED,
            {"rule_added": rule, "rules": len(rules), "because": because},
            actor=actor,
        )
    return rules
