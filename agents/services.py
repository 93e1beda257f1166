"""What people (and the CLI, admin and dashboard) do to runs: create, pause, resume, cancel, steer,
change the tool policy.

Each action checks its input, goes through lifecycle for status changes, records an event naming
who did it, and queues work when there is work to do. Views and commands stay thin.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import check_settings as check_settings_module
from agents import (
    eventlog,
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
from agents.models import EventKind, Provider, Run, RunScript, RunStatus, Session, SessionStatus
from agents.providers import pricing
from agents.providers.scripted import OFFLINE_MODEL, ScriptError, builtin_script, validate_script

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
MAX_CHECKS = 50


# Bad input for a run action; the message says what to change, `field` which input it was.
RunError = inputs.InputError


def actor_for(user) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


@dataclass
class Budgets:
    max_sessions: int | None = None
    max_tokens: int | None = None
    max_cost_usd: Decimal | str | None = None
    max_wall_seconds: int | None = None

    def cleaned(self) -> dict[str, Any]:
        """The budgets given, checked: whole numbers the columns hold, a finite amount."""
        out: dict[str, Any] = {}
        limits = {"max_sessions": inputs.MAX_INT, "max_tokens": inputs.MAX_BIG_INT,
                  "max_wall_seconds": inputs.MAX_INT}  # fmt: skip
        for name, maximum in limits.items():
            value = getattr(self, name)
            if value is not None:
                what = name.replace("_", "-")
                out[name] = inputs.whole_number(value, what=what, maximum=maximum, field=name)
        if self.max_cost_usd is not None:
            out["max_cost_usd"] = inputs.dollars(
                self.max_cost_usd, what="max-cost", field="max_cost_usd"
            )
        return out


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
    *,
    goal: str,
    checks: list[str],
    provider: str = Provider.SCRIPTED,
    script: dict[str, Any] | None = None,
    script_name: str = "",
    model: str | None = None,
    budgets: Budgets | None = None,
    max_turns_per_session: int | None = None,
    max_input_tokens_per_session: int | None = None,
    workspace_from: str | Path | None = None,
    rubric: str = "",
    tool_policy: list[dict[str, Any]] | None = None,
    webhook_urls: list[str] | None = None,
    approval_timeout_seconds: int | None = None,
    created_by=None,
    judge_model: str = "",
    protected_paths: list[str] | None = None,
    protected_action: str = "deny",
    acceptance: list[dict[str, Any] | str] | None = None,
    forked_from=None,
    resume_state: dict[str, Any] | None = None,
    protected: dict[str, Any] | None = None,
    actor: str | None = None,
    limits: dict[str, Any] | None = None,
    allowed_hosts: list[str] | None = None,
    environment: str | Path | None = None,
    requirements: str | Path | None = None,
    toolchain: list[str] | None = None,
    check_settings: dict[str, Any] | None = None,
    heartbeat_seconds: int | None = None,
    origin: dict[str, Any] | None = None,
    project: str = "",
    parent: Run | None = None,
    workspace_tree: str | None = None,
    fleet_conflicts: str = "agent",
    suite_guard: bool = True,
    protect_tests: bool = True,
    test_setup: dict[str, Any] | None = None,
    held_out: dict[str, Any] | None = None,
) -> Run:
    """Create a run and queue it. `limits` (isolation.LIMIT_NAMES) override today's defaults;
    `allowed_hosts` (HOST[:PORT]) may be reached through the egress proxy without asking;
    `environment` names an interpreter or a virtualenv for the run's commands and checks, or
    `requirements` has one built (`toolchain`: folders as they are, for a fork). A fleet's child
    has its `parent` and starts from `workspace_tree` (agents/fleet_spawn.py). `suite_guard`:
    test-suite checks run guarded and counted (agents/suite_guard.py); `protect_tests`: with
    one, the workspace's tests are protected too. `test_setup` (agents/test_setup.Setup, as a
    dict): the check environment is built from it, the project editable from the workspace.
    `held_out` (agents/held_out.collect): checks the agent never sees, run only at finish."""
    goal = inputs.text(goal, what="the goal", field="goal", empty="a run needs a goal")
    checks = [
        inputs.text(c, what="a check", max_length=inputs.MAX_LINE, field="checks")
        for c in checks or []
        if c and c.strip()
    ]
    if not checks:
        raise RunError(
            "a run needs at least one check (a shell command that exits 0 when done)", "checks"
        )
    if len(checks) > MAX_CHECKS:
        raise RunError(f"a run has at most {MAX_CHECKS} checks", "checks")
    rubric = inputs.text(rubric, what="the rubric", required=False, field="rubric")
    project = inputs.text(
        project, what="the project", max_length=100, required=False, field="project"
    )
    judge_model = inputs.text(
        judge_model, what="the judge's model", max_length=100, required=False, field="judge_model"
    )
    if model is not None:
        model = inputs.text(model, what="the model", max_length=100, field="model") or None
    if provider not in Provider.values:
        raise RunError(
            f"provider must be one of {', '.join(Provider.values)}, not {provider!r}", "provider"
        )
    if provider == Provider.SCRIPTED:
        if script is None:
            script, script_name = builtin_script("demo"), script_name or "demo (built in)"
        try:
            validate_script(script)
        except ScriptError as e:
            raise RunError(f"script: {e}", "script") from None
        model = model or OFFLINE_MODEL
    else:
        if script is not None:
            raise RunError("a script is only for the scripted provider", "script")
        model = model or pricing.DEFAULT_MODEL
    source = Path(workspace_from) if workspace_from else None
    if source is not None and not source.is_dir():
        raise RunError(f"workspace-from: {source} is not a folder", "workspace_from")
    try:
        host_rules = [policy.allow_host_rule(h) for h in allowed_hosts or [] if h and h.strip()]
    except policy.PolicyError as e:
        raise RunError(str(e), "allowed_hosts") from None
    try:
        tool_policy = policy.validate([*host_rules, *(tool_policy or [])])
    except policy.PolicyError as e:
        raise RunError(f"tool policy: {e}", "tool_policy") from None
    run_limits = _limits(limits)
    webhook_urls = [
        inputs.http_url(u, what="webhook", field="webhook_urls")
        for u in webhook_urls or []
        if u and u.strip()
    ]
    if heartbeat_seconds is not None:
        if provider != Provider.EXTERNAL:
            raise RunError("--heartbeat-seconds is only for external runs", "heartbeat_seconds")
        heartbeat_seconds = inputs.whole_number(
            heartbeat_seconds, what="heartbeat-seconds", field="heartbeat_seconds"
        )
    if approval_timeout_seconds is not None:
        approval_timeout_seconds = inputs.whole_number(
            approval_timeout_seconds, what="approval-timeout", field="approval_timeout_seconds"
        )
    if fleet_conflicts not in ("agent", "person"):
        raise RunError("fleet-conflicts must be agent or person", "fleet_conflicts")
    if protected_action not in ("deny", "ask"):
        raise RunError("protect-action must be deny or ask", "protected_action")
    criteria = []
    for item in acceptance or []:
        if isinstance(item, str):
            name, _, check = item.partition("=")
            item = {"name": name.strip(), "check": check.strip() or None}
        if not isinstance(item, dict) or not str(item.get("name", "")).strip():
            raise RunError(
                "each acceptance criterion needs a name (NAME or NAME=CHECK_COMMAND)", "acceptance"
            )
        name = inputs.text(
            item["name"],
            what="an acceptance criterion",
            max_length=inputs.MAX_LINE,
            field="acceptance",
        )
        check = inputs.text(
            item.get("check") or "",
            what=f"the check of criterion {name!r}",
            max_length=inputs.MAX_LINE,
            required=False,
            field="acceptance",
        )
        if any(c["name"] == name for c in criteria):
            raise RunError(f"acceptance criterion {name!r} is listed twice", "acceptance")
        criteria.append({"name": name, "check": check or None, "passing": False})
    if (
        any(not c["check"] for c in criteria)
        and provider == Provider.SCRIPTED
        and script is not None
        and not script.get("judge")
    ):
        raise RunError(
            "acceptance criteria without a check are judged: the script needs a 'judge' section",
            "acceptance",
        )
    toolchain = _toolchain(environment, requirements) if toolchain is None else toolchain
    config = settings.SHIFTLOG
    fields = {
        "max_turns_per_session": inputs.whole_number(
            max_turns_per_session or config["MAX_TURNS_PER_SESSION"],
            what="max-turns-per-session",
            field="max_turns_per_session",
        ),
        "max_input_tokens_per_session": inputs.whole_number(
            max_input_tokens_per_session or config["MAX_INPUT_TOKENS_PER_SESSION"],
            what="max-input-tokens-per-session",
            field="max_input_tokens_per_session",
        ),
        **(budgets or Budgets()).cleaned(),
    }
    with transaction.atomic():
        run = Run.objects.create(
            goal=goal,
            checks=checks,
            rubric=rubric,
            provider=provider,
            model=model,
            script_name=script_name,
            project=project,
            heartbeat_seconds=heartbeat_seconds,
            created_by=created_by,
            tool_policy=tool_policy,
            webhook_urls=webhook_urls,
            approval_timeout_seconds=approval_timeout_seconds,
            forked_from=forked_from,
            resume_state=resume_state,
            judge_model=judge_model or "",
            protected_action=protected_action,
            acceptance=criteria,
            limits=run_limits,
            toolchain=toolchain,
            parent=parent,
            depth=parent.depth + 1 if parent is not None else 0,
            fleet_conflicts=fleet_conflicts,
            held_out=held_out or {},
            **fields,
        )
        if provider == Provider.SCRIPTED:
            RunScript.objects.create(run=run, script=script)
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
        toolchain = _check_environment(run, test_setup, toolchain, source is not None)
        guarded = _suite_guard(run, suite_guard, checks, criteria)
        if guarded is not None and protect_tests and protected is None:
            protected_paths = [*(protected_paths or []), *suite_guard_module.test_paths(workspace)]
        if protected is not None:
            run.protected = protected  # a fork keeps its origin's fingerprints
        elif protected_paths:
            try:
                run.protected = verification.fingerprint(
                    sandbox.Workspace(workspace), protected_paths
                )
            except (sandbox.ToolInputError, OSError) as e:
                raise RunError(f"protect: {e}", "protected_paths") from None
            if not run.protected:
                raise RunError("protect: the paths given hold no files", "protected_paths")
        if check_settings is not None:
            run.check_settings = check_settings  # a fork's are its origin's
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
            suite_guard=run.suite_guard,
            toolchain=run.toolchain,
            workspace_tree=start.tree if start else "",
        )
        if start:
            workspaces.hold(run, start.tree, start.bytes_total)
        eventlog.append(
            run.pk,
            EventKind.RUN_CREATED,
            {
                "goal": goal,
                "checks": checks,
                "provider": provider,
                "model": model,
                "script_name": script_name,
                **({"project": project} if project else {}),
                "budgets": {k: str(v) for k, v in fields.items()},
                "workspace_from": str(source) if source else None,
                "tool_policy": tool_policy,
                "limits": run_limits,
                "toolchain": toolchain,
                "rubric": rubric,
                "protected": sorted(run.protected),
                "acceptance": [c["name"] for c in criteria],
                "forked_from": _forked_from(forked_from) if forked_from else None,
                # What made it, when not a person: {"template", "schedule" or "trigger"}.
                **({"origin": origin} if origin else {}),
                **({"parent": parent.pk, "depth": parent.depth + 1} if parent else {}),
            },
            actor=actor or actor_for(created_by),
        )
        if provider != Provider.EXTERNAL:  # an external run waits for its agent to call
            enqueue(run.pk)
    run.refresh_from_db()
    return run


LIMIT_RANGES = {
    "memory_mb": (16, 1_048_576),
    "processes": (8, 100_000),
    "cpu_seconds": (1, 604_800),
    "workspace_mb": (1, 10_485_760),
}


def _limits(given: dict[str, Any] | None) -> dict[str, int]:
    """The run's limits: today's defaults with what was given, each checked."""
    out = isolation.default_limits()
    for name, value in (given or {}).items():
        if value is None:
            continue
        if name not in isolation.LIMIT_NAMES:
            raise RunError(
                f"unknown limit {name!r} (known: {', '.join(isolation.LIMIT_NAMES)})", "limits"
            )
        low, high = LIMIT_RANGES[name]
        what = f"max-{name.replace('_', '-')}"
        out[name] = inputs.whole_number(value, what=what, minimum=low, maximum=high, field=name)
    return out


def _check_environment(
    run: Run, setup: dict[str, Any] | None, toolchain: list[str], copied: bool
) -> list[str]:
    """The run's toolchain once its workspace exists: built from a detected test set-up (the
    project editable from the workspace), or the one named, refused when it holds a copy of the
    project (its checks would test that copy)."""
    if setup is not None:
        spec = test_setup_module.Setup(**setup)
        where = Path(settings.DATA_DIR) / "envs" / uuid.uuid4().hex[:16]
        try:
            run.toolchain = test_setup_module.build(
                spec, run.workspace_path, where, Path(settings.DATA_DIR) / "envs"
            )
        except test_setup_module.SetupProblem as e:
            shutil.rmtree(where, ignore_errors=True)
            raise RunError(f"test set-up: {e}", "test_setup") from None
        return run.toolchain
    if copied and toolchain:
        why = test_setup_module.installed_copy(toolchain, run.workspace_path)
        if why:
            raise RunError(f"environment: {why}", "environment")
    return toolchain


def _suite_guard(
    run: Run, wanted: bool, checks: list[str], criteria: list[dict[str, Any]]
) -> frozenset[str] | None:
    """When the run has a test-suite check and did not opt out: the names a workspace module
    must not take (agents/suite_guard.py), and run.suite_guard set; else None."""
    commands = [*checks, *(c["check"] for c in criteria if c.get("check"))]
    if not wanted or not any(suite_guard_module.suite_kind(c) for c in commands):
        return None
    run.suite_guard = True
    return suite_guard_module.guarded_names(list(run.toolchain) or None)


def _toolchain(environment: str | Path | None, requirements: str | Path | None) -> list[str]:
    """The folders a run's commands and checks get: a named interpreter or virtualenv, or one
    built from the project's requirements (outside the workspace: the agent cannot change what
    the checks run with)."""
    if environment and requirements:
        raise RunError("give --env or --env-requirements, not both", "environment")
    try:
        if environment:
            return isolation.interpreter_folders(environment)
        if requirements:
            where = Path(settings.DATA_DIR) / "envs" / uuid.uuid4().hex[:16]
            return isolation.build_venv(requirements, where)
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
    return create_run(
        goal=DEMO_GOAL,
        checks=DEMO_CHECKS,
        script=script,
        script_name="demo (built in)",
        max_turns_per_session=4,
        created_by=created_by,
    )


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
            run_id, RunStatus.PAUSED, actor=actor, reason=reason or f"paused by {actor}"
        )
    except lifecycle.IllegalTransition as e:
        raise RunError(str(e)) from None
    lifecycle.cascade(run_id, "pause", f"run {run_id} was paused by {actor}", actor)
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
    lifecycle.cascade(run_id, "resume", f"run {run_id} was resumed by {actor}", actor)
    return run


def wake_at(run_id: int, when: datetime, *, actor: str, now: datetime | None = None) -> Run:
    """Have a paused run resume at `when` (the scheduler's pass does it: agents/schedules.py)."""
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
    lifecycle.cascade(run_id, "cancel", f"run {run_id} was cancelled by {actor}", actor)
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
    """Put one rule first in a run's tool policy (an "allow similar" decision)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        return set_policy(run_id, [rule, *run.tool_policy], actor=actor, because=because)
