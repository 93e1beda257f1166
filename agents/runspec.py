"""A run's settings, named once: `RunSpec`.

Every way a run is made (the web form, the API, the CLI, a fork, a schedule or trigger, a fleet's
child, the demos) builds a `RunSpec` and hands it to `services.create_run`; nothing else reaches
that function. The spec's fields are the run's settings by the names the `Run` model gives them
(`Run.SETTINGS`), plus a few inputs that are not columns: where the workspace comes from
(`workspace_from`), the environment to build (`environment`, `requirements`), hosts to allow
(`allowed_hosts`, folded into the tool policy) and the paths to protect (`protected_paths`, whose
fingerprints become `Run.protected`).

`RunSpec.of(run)` copies a run's settings, so a fork or a scheduled run cannot drop one: a setting
added to `Run.SETTINGS` is copied, and `tests/test_runspec.py` fails for a column that is neither a
setting nor run state. `clean()` validates every field in one place and answers a spec whose
values are what the run will hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from agents import inputs, isolation, notifications, policy, reach, suite_guard
from agents.models import Provider, Run, RunScript
from agents.providers import pricing
from agents.providers.scripted import OFFLINE_MODEL, ScriptError, builtin_script, validate_script

RunError = inputs.InputError
MAX_CHECKS = 50
FLEET_CONFLICTS = ("agent", "person")
PROTECTED_ACTIONS = ("deny", "ask")
LIMIT_RANGES = {
    "memory_mb": (16, 1_048_576),
    "processes": (8, 100_000),
    "cpu_seconds": (1, 604_800),
    "workspace_mb": (1, 10_485_760),
}
# The budgets, and the largest value their columns hold.
BUDGETS = {"max_sessions": inputs.MAX_INT, "max_tokens": inputs.MAX_BIG_INT,
           "max_wall_seconds": inputs.MAX_INT}  # fmt: skip
# Not given (None): the configured default. A spec of a run always holds a number.
PER_SESSION = {
    "max_turns_per_session": "MAX_TURNS_PER_SESSION",
    "max_input_tokens_per_session": "MAX_INPUT_TOKENS_PER_SESSION",
}
DEFAULT_MAX_SESSIONS = 10


@dataclass
class Budgets:
    max_sessions: int | None = None
    max_tokens: int | None = None
    max_cost_usd: Decimal | str | None = None
    max_wall_seconds: int | None = None

    def cleaned(self) -> dict[str, Any]:
        """The budgets given, checked: whole numbers the columns hold, a finite amount."""
        out: dict[str, Any] = {}
        for name, maximum in BUDGETS.items():
            value = getattr(self, name)
            if value is not None:
                what = name.replace("_", "-")
                out[name] = inputs.whole_number(value, what=what, maximum=maximum, field=name)
        if self.max_cost_usd is not None:
            out["max_cost_usd"] = inputs.dollars(
                self.max_cost_usd, what="max-cost", field="max_cost_usd"
            )
        return out


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    # What the agent is asked, and how the harness decides it is done.
    goal: str
    checks: tuple[str, ...] | list[str] = ()
    rubric: str = ""
    judge_model: str = ""
    acceptance: tuple[Any, ...] | list[Any] = ()
    protected_paths: tuple[str, ...] | list[str] = ()
    protected_action: str = "deny"
    # Test-suite checks run guarded and counted (agents/suite_guard.py); with one, the
    # workspace's tests are protected too (`protect_tests`). Checks the agent never sees, run only
    # at finish (`held_out`: agents/held_out.collect).
    suite_guard: bool = True
    protect_tests: bool = True
    held_out: Mapping[str, Any] | None = None
    # Who drives it.
    provider: str = Provider.SCRIPTED
    model: str | None = None
    script: dict[str, Any] | None = field(default=None, compare=False)
    script_name: str = ""
    heartbeat_seconds: int | None = None
    project: str = ""
    # Budgets and session bounds.
    max_sessions: int | None = DEFAULT_MAX_SESSIONS
    max_tokens: int | None = None
    max_cost_usd: Decimal | str | float | None = None
    max_wall_seconds: int | None = None
    max_turns_per_session: int | None = None
    max_input_tokens_per_session: int | None = None
    # What it may do, and who is told.
    tool_policy: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()
    allowed_hosts: tuple[str, ...] | list[str] = ()
    approval_timeout_seconds: int | None = None
    webhook_urls: tuple[str, ...] | list[str] = ()
    # Slack: its own channel ("" the project's), and which run news it posts (ended, paused,
    # budget, as a list or words; "off" or [] for none; None: the project's).
    slack_channel: str = ""
    slack_news: tuple[str, ...] | list[str] | str | None = None
    limits: Mapping[str, Any] = field(default_factory=dict)
    fleet_conflicts: str = "agent"
    # Where its workspace and environment come from.
    workspace_from: str | Path | None = None
    environment: str | Path | None = None
    requirements: str | Path | None = None
    toolchain: tuple[str, ...] | list[str] | None = None
    # A detected test set-up (agents/test_setup.Setup, as a dict): the check environment is
    # built from it, the project installed editable from the workspace.
    test_setup: Mapping[str, Any] | None = None
    # Fingerprints of the starting workspace, given only when the workspace is not taken fresh
    # (a fork restores a checkpoint the agent may have changed: its origin's start is the truth).
    protected: Mapping[str, Any] | None = None
    check_settings: Mapping[str, Any] | None = None

    # --- building ---------------------------------------------------------------------------
    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, data: Mapping[str, Any], **overrides: Any) -> RunSpec:
        """A spec from a mapping named as the spec is (an API body, the CLI's options): unknown
        names are left out, None means "not given" (the default), and the per-command limits may
        come flat (`max_memory_mb`, ...) as the CLI and forms name them."""
        given = {**data, **overrides}
        limits = dict(given.get("limits") or {})
        for name in isolation.LIMIT_NAMES:
            if given.get(f"max_{name}") is not None:
                limits[name] = given[f"max_{name}"]
        known = {
            k: v for k, v in given.items() if k in cls.names() and v is not None and k != "limits"
        }
        return cls(**known, limits=limits)

    @classmethod
    def of(cls, run: Run, **overrides: Any) -> RunSpec:
        """The settings of `run`, as a spec for a new run (a fork, a scheduled run): every
        setting in Run.SETTINGS, its script, and the paths it protects. Its acceptance criteria
        start again as not passing."""
        values = {name: getattr(run, name) for name in Run.SETTINGS}
        values["acceptance"] = [
            {"name": c["name"], "check": c.get("check")} for c in run.acceptance
        ]
        values["script"] = (
            RunScript.objects.filter(run=run).values_list("script", flat=True).first()
        )
        values["protected_paths"] = sorted(run.protected)
        # Fingerprints are taken again from the new run's own start, unless given (a fork's).
        values["protected"] = values["check_settings"] = None
        return dataclasses.replace(cls(**values), **overrides)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    # --- checking ---------------------------------------------------------------------------
    def clean(self) -> RunSpec:
        """This spec with every value checked and put as the run will hold it (a RunError
        naming the field otherwise). Building the environment is left to create_run."""
        provider = self.provider
        if provider not in Provider.values:
            raise RunError(
                f"provider must be one of {', '.join(Provider.values)}, not {provider!r}",
                "provider",
            )
        script, script_name, model = self._driver(provider)
        heartbeat = self.heartbeat_seconds
        if heartbeat is not None:
            if provider != Provider.EXTERNAL:
                raise RunError("--heartbeat-seconds is only for external runs", "heartbeat_seconds")
            heartbeat = inputs.whole_number(
                heartbeat, what="heartbeat-seconds", field="heartbeat_seconds"
            )
        if self.fleet_conflicts not in FLEET_CONFLICTS:
            raise RunError("fleet-conflicts must be agent or person", "fleet_conflicts")
        if self.protected_action not in PROTECTED_ACTIONS:
            raise RunError("protect-action must be deny or ask", "protected_action")
        if self.environment and self.requirements:
            raise RunError("give --env or --env-requirements, not both", "environment")
        source = Path(self.workspace_from) if self.workspace_from else None
        if source is not None and not source.is_dir():
            raise RunError(f"workspace-from: {source} is not a folder", "workspace_from")
        timeout = self.approval_timeout_seconds
        if timeout is not None:
            timeout = inputs.whole_number(
                timeout, what="approval-timeout", field="approval_timeout_seconds"
            )
        acceptance = self._acceptance()
        if (
            any(not c["check"] for c in acceptance)
            and provider == Provider.SCRIPTED
            and not script.get("judge")
        ):
            raise RunError(
                "acceptance criteria without a check are judged: the script needs a 'judge' "
                "section",
                "acceptance",
            )
        return dataclasses.replace(
            self,
            goal=inputs.text(self.goal, what="the goal", field="goal", empty="a run needs a goal"),
            checks=self._checks(),
            rubric=inputs.text(self.rubric, what="the rubric", required=False, field="rubric"),
            judge_model=inputs.text(
                self.judge_model,
                what="the judge's model",
                max_length=100,
                required=False,
                field="judge_model",
            ),
            project=inputs.text(
                self.project, what="the project", max_length=100, required=False, field="project"
            ),
            acceptance=acceptance,
            protected_paths=[p for p in self.protected_paths or [] if p and p.strip()],
            suite_guard=self._guarded(acceptance),
            held_out=dict(self.held_out or {}),
            script=script,
            script_name=inputs.text(
                script_name, what="the script's name", max_length=200, required=False
            ),
            model=model,
            heartbeat_seconds=heartbeat,
            tool_policy=self._policy(),
            allowed_hosts=[],  # folded into the tool policy
            approval_timeout_seconds=timeout,
            webhook_urls=[
                notifications.check_url(inputs.http_url(u, what="webhook", field="webhook_urls"))
                for u in self.webhook_urls or []
                if u and u.strip()
            ],
            slack_channel=reach.clean_channel(self.slack_channel),
            slack_news=reach.clean_news(self.slack_news),
            limits=self._limits(),
            workspace_from=source,
            **self._budgets(),
        )

    def run_fields(self) -> dict[str, Any]:
        """The Run columns a clean spec sets (toolchain, fingerprints and lineage aside)."""
        skip = {"toolchain", "protected", "check_settings"}
        return {name: getattr(self, name) for name in Run.SETTINGS if name not in skip}

    # --- the parts of clean() -----------------------------------------------------------------
    def _guarded(self, acceptance: list[dict[str, Any]]) -> bool:
        """Guarded when wanted and a check (or a criterion's) runs a test suite."""
        commands = [*(self.checks or []), *(c["check"] for c in acceptance if c.get("check"))]
        return bool(self.suite_guard) and any(suite_guard.suite_kind(str(c)) for c in commands)

    def _driver(self, provider: str) -> tuple[dict[str, Any] | None, str, str]:
        script, script_name = self.script, self.script_name
        model = self.model
        if model is not None:
            model = inputs.text(model, what="the model", max_length=100, field="model") or None
        if provider == Provider.SCRIPTED:
            if script is None:
                script, script_name = builtin_script("demo"), script_name or "demo (built in)"
            try:
                validate_script(script)
            except ScriptError as e:
                raise RunError(f"script: {e}", "script") from None
            return script, script_name, model or OFFLINE_MODEL
        if script is not None:
            raise RunError("a script is only for the scripted provider", "script")
        return None, script_name, model or pricing.DEFAULT_MODEL

    def _checks(self) -> list[str]:
        if isinstance(self.checks, str):
            raise RunError("checks must be a list of shell commands", "checks")
        checks = [
            inputs.text(c, what="a check", max_length=inputs.MAX_LINE, field="checks")
            for c in self.checks or []
            if c and c.strip()
        ]
        if not checks:
            raise RunError(
                "a run needs at least one check (a shell command that exits 0 when done)", "checks"
            )
        if len(checks) > MAX_CHECKS:
            raise RunError(f"a run has at most {MAX_CHECKS} checks", "checks")
        return checks

    def _acceptance(self) -> list[dict[str, Any]]:
        criteria: list[dict[str, Any]] = []
        for item in self.acceptance or []:
            if isinstance(item, str):
                name, _, check = item.partition("=")
                item = {"name": name.strip(), "check": check.strip() or None}
            if not isinstance(item, Mapping) or not str(item.get("name", "")).strip():
                raise RunError(
                    "each acceptance criterion needs a name (NAME or NAME=CHECK_COMMAND)",
                    "acceptance",
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
        return criteria

    def _policy(self) -> list[dict[str, Any]]:
        try:
            hosts = [policy.allow_host_rule(h) for h in self.allowed_hosts or [] if h and h.strip()]
        except policy.PolicyError as e:
            raise RunError(str(e), "allowed_hosts") from None
        try:
            return policy.validate([*hosts, *(self.tool_policy or [])])
        except policy.PolicyError as e:
            raise RunError(f"tool policy: {e}", "tool_policy") from None

    def _limits(self) -> dict[str, int]:
        """Today's defaults with what was given, each checked."""
        out = isolation.default_limits()
        if not isinstance(self.limits, Mapping):
            raise RunError("limits must be an object of NAME: NUMBER", "limits")
        for name, value in self.limits.items():
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

    def _budgets(self) -> dict[str, Any]:
        given = Budgets(
            max_sessions=self.max_sessions,
            max_tokens=self.max_tokens,
            max_cost_usd=self.max_cost_usd,
            max_wall_seconds=self.max_wall_seconds,
        ).cleaned()
        # Not given (None) stays None: no limit.
        out: dict[str, Any] = {name: given.get(name) for name in [*BUDGETS, "max_cost_usd"]}
        config = settings.SHIFTLOG
        for name, default in PER_SESSION.items():
            value = getattr(self, name) or config[default]
            out[name] = inputs.whole_number(value, what=name.replace("_", "-"), field=name)
        return out
