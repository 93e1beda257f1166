from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.urls import reverse
from django.utils.functional import lazy
from django.utils.html import format_html
from django.utils.safestring import SafeString

from agents import inputs, reach
from agents.models import Provider, RunStatus
from agents.providers.scripted import ScriptError, validate_script
from agents.runspec import RunSpec
from agents.services import DEMO_CHECKS, DEMO_GOAL, DEMO_SCRIPT_NOTICE

SCRIPT_LIMIT = 1_000_000


NO_KEY = "set ANTHROPIC_API_KEY for the server to use it"


def anthropic_ready() -> bool:
    return bool(settings.SHIFTLOG.get("ANTHROPIC_API_KEY"))


def provider_choices() -> list[tuple[str, str]]:
    anthropic = "Anthropic" if anthropic_ready() else f"Anthropic (unavailable: {NO_KEY})"
    return [
        (Provider.SCRIPTED.value, "scripted · offline (no model is called)"),
        (Provider.ANTHROPIC.value, anthropic),
        (Provider.EXTERNAL.value, "external agent (driven through the API)"),
    ]


def provider_help() -> SafeString:
    return format_html(
        "External agent: the run waits for its agent, a program outside Shiftlog, to call the "
        'API with a token (<a href="{}">the API</a>, <code>manage.py create_token</code>). '
        "Until it calls, the run stays queued.",
        reverse("api:openapi-view"),
    )


class ProviderSelect(forms.Select):
    """The providers, all listed; one that cannot run here is shown disabled, with the reason."""

    def create_option(self, name, value, *args, **kwargs):
        option = super().create_option(name, value, *args, **kwargs)
        if value == Provider.ANTHROPIC and not anthropic_ready():
            option["attrs"]["disabled"] = True
        return option


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class RuleForm(forms.Form):
    """One row of the tool policy editor: a pattern rule."""

    tool = forms.CharField(
        required=False,
        max_length=100,
        widget=forms.TextInput(
            attrs={"placeholder": "bash, write_file, network, *", "aria-label": "Rule: tool"}
        ),
    )
    pattern = forms.CharField(
        required=False,
        strip=False,  # a regular expression: its spaces mean something
        max_length=2000,
        widget=forms.TextInput(
            attrs={
                "placeholder": "a regular expression, e.g. ^pip install",
                "aria-label": "Rule: pattern",
            }
        ),
    )
    action = forms.ChoiceField(
        required=False,
        choices=[("ask", "ask"), ("allow", "allow"), ("deny", "deny")],
        widget=forms.Select(attrs={"aria-label": "Rule: action"}),
    )
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.TextInput(attrs={"aria-label": "Rule: note"}),
    )

    def clean(self):
        data = super().clean()
        if (data.get("pattern") or data.get("note")) and not data.get("tool"):
            self.add_error("tool", "name the tool the rule is for (or * for any)")
        return data

    def rule(self) -> dict | None:
        data = self.cleaned_data
        if not data.get("tool"):
            return None  # an empty row
        rule = {"tool": data["tool"], "action": data.get("action") or "ask"}
        if data.get("pattern"):
            rule["pattern"] = data["pattern"]
        if data.get("note"):
            rule["note"] = data["note"]
        return rule


RuleFormSet = forms.formset_factory(RuleForm, extra=2, max_num=100, absolute_max=100)


class NewRunForm(forms.Form):
    goal = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=inputs.MAX_TEXT)
    checks = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=inputs.MAX_TEXT,
        help_text="One shell command a line; the harness runs them when the agent says it is done.",
    )
    provider = forms.ChoiceField(
        choices=provider_choices,
        initial=Provider.SCRIPTED,
        widget=ProviderSelect,
        help_text=lazy(provider_help, SafeString)(),  # the URLs load after the forms
    )
    heartbeat_seconds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=inputs.MAX_INT,
        label="Heartbeat (seconds)",
        help_text="External agent only: silent longer than this, the run shows as stalled. "
        "Empty: the server's default.",
    )
    script = forms.FileField(
        required=False,
        help_text="A JSON script for the scripted provider. Empty: "
        + DEMO_SCRIPT_NOTICE
        + " Upload a script to have it play your own.",
    )
    model = forms.CharField(required=False, max_length=100, help_text="Empty: the default.")
    max_sessions = forms.IntegerField(
        required=False, min_value=1, max_value=inputs.MAX_INT, initial=10
    )
    max_tokens = forms.IntegerField(required=False, min_value=1, max_value=inputs.MAX_BIG_INT)
    max_cost_usd = forms.DecimalField(
        required=False, min_value=0, max_digits=12, decimal_places=6, label="Max cost (USD)"
    )
    max_wall_seconds = forms.IntegerField(required=False, min_value=1, max_value=inputs.MAX_INT)
    max_turns_per_session = forms.IntegerField(
        required=False, min_value=1, max_value=inputs.MAX_INT
    )
    max_input_tokens_per_session = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=inputs.MAX_INT,
        help_text="A session ends with a handoff when its latest request is this large.",
    )
    allowed_hosts = forms.CharField(
        required=False,
        max_length=inputs.MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Allowed hosts",
        help_text="HOST or HOST:PORT, one a line: the run's commands may reach them through its "
        "proxy without asking. Any other host is asked of a person.",
    )
    max_memory_mb = forms.IntegerField(
        required=False, min_value=16, max_value=1_048_576, label="Memory per command (MB)"
    )
    max_processes = forms.IntegerField(
        required=False, min_value=8, max_value=100_000, label="Processes per command"
    )
    max_workspace_mb = forms.IntegerField(
        required=False, min_value=1, max_value=10_485_760, label="Workspace size (MB)"
    )
    max_cpu_seconds = forms.IntegerField(
        required=False, min_value=1, max_value=inputs.MAX_INT, label="CPU seconds per command"
    )
    environment = forms.CharField(
        required=False,
        max_length=1000,
        label="Check environment",
        help_text="An interpreter or virtualenv on this server (a path) that the run's commands "
        "and checks run with, as create_run --env. Empty: the sandbox's own.",
    )
    requirements = forms.CharField(
        required=False,
        max_length=1000,
        label="…or build one from",
        help_text="A requirements file on this server: a virtualenv is built from it for the "
        "commands and checks, as create_run --env-requirements.",
    )
    tool_policy = forms.CharField(
        required=False,
        max_length=inputs.MAX_JSON_BYTES,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="More rules (JSON)",
        help_text="Rules the rows above cannot say (allow-similar rules), as JSON; they come "
        'after the rows. E.g. [{"tool": "bash", "action": "allow", "program": "pytest"}]',
    )
    approval_timeout_seconds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=inputs.MAX_INT,
        label="Approval timeout (seconds)",
        help_text="A call waiting longer counts as denied. Empty: it waits for a person.",
    )
    webhook_urls = forms.CharField(
        required=False,
        max_length=inputs.MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Webhooks",
        help_text="http(s) URLs, one a line: each gets a signed POST when the run needs a person "
        "or ends.",
    )
    slack_channel = forms.CharField(
        required=False,
        max_length=80,
        label="Slack channel",
        help_text="A channel id (C…) or #name for this run's Slack messages. Empty: its "
        "project's channel.",
    )
    slack_news = forms.CharField(
        required=False,
        max_length=100,
        label="Slack news",
        help_text="Which of the run's news goes to Slack: any of ended, paused, budget, or off. "
        "Empty: its project's settings. Approvals follow the project's.",
    )
    rubric = forms.CharField(
        required=False,
        max_length=inputs.MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Judge rubric",
        help_text="Criteria for an independent judge, one a line; judged after the checks pass.",
    )
    judge_model = forms.CharField(
        required=False, max_length=100, help_text="Empty: the run's own model."
    )
    project = forms.CharField(
        required=False,
        max_length=100,
        help_text="Runs of one project share its memory: what one learned, the next is told.",
    )
    criteria = forms.CharField(
        required=False,
        max_length=inputs.MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Acceptance criteria",
        help_text="NAME or NAME=CHECK_COMMAND, one a line: progress is tracked per criterion.",
    )
    protect = forms.CharField(
        required=False,
        max_length=inputs.MAX_TEXT,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Protected paths",
        help_text="Files or folders the checks depend on, one a line: the agent may not change "
        "them.",
    )
    protect_action = forms.ChoiceField(
        required=False,
        choices=[("deny", "deny the change"), ("ask", "ask a person")],
        initial="deny",
        label="A change to a protected path",
    )
    fleet_conflicts = forms.ChoiceField(
        required=False,
        choices=[("agent", "go to the agent"), ("person", "are asked of a person")],
        initial="agent",
        label="Merge conflicts of child runs",
    )
    script_from = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=1)

    @classmethod
    def demo(cls) -> NewRunForm:
        return cls(
            initial={
                "goal": DEMO_GOAL,
                "checks": "\n".join(DEMO_CHECKS),
                "max_turns_per_session": 4,
            }
        )

    @classmethod
    def initial_from(cls, run) -> tuple[dict, list[dict], str]:
        """What "Run again with changes" fills in from a run: the form's initial values, the
        policy rows (its allowed hosts among them, as `network` rules) and the rules the rows
        cannot say (as JSON)."""
        rows = [r for r in run.tool_policy if "program" not in r]
        rest = [r for r in run.tool_policy if "program" in r]
        limits = run.limits or {}
        initial = {
            "goal": run.goal,
            "checks": "\n".join(run.checks),
            "provider": run.provider,
            "model": run.model,
            "max_sessions": run.max_sessions,
            "max_tokens": run.max_tokens,
            "max_cost_usd": run.max_cost_usd,
            "max_wall_seconds": run.max_wall_seconds,
            "max_turns_per_session": run.max_turns_per_session,
            "max_input_tokens_per_session": run.max_input_tokens_per_session,
            "fleet_conflicts": run.fleet_conflicts,
            "max_memory_mb": limits.get("memory_mb"),
            "max_processes": limits.get("processes"),
            "max_cpu_seconds": limits.get("cpu_seconds"),
            "max_workspace_mb": limits.get("workspace_mb"),
            "approval_timeout_seconds": run.approval_timeout_seconds,
            "webhook_urls": "\n".join(run.webhook_urls),
            "slack_channel": run.slack_channel,
            "slack_news": reach.news_words(run),
            "rubric": run.rubric,
            "judge_model": run.judge_model,
            "project": run.project,
            "criteria": "\n".join(
                c["name"] + (f"={c['check']}" if c.get("check") else "") for c in run.acceptance
            ),
            "protect": "\n".join(sorted(run.protected)),
            "protect_action": run.protected_action,
            "heartbeat_seconds": run.heartbeat_seconds,
            "script_from": run.pk,
        }
        return initial, rows, json.dumps(rest, indent=2) if rest else ""

    # The form's names for RunSpec's fields, where they differ (agents/runspec.py).
    SPEC_NAMES = {"criteria": "acceptance", "protect": "protected_paths",
                  "protect_action": "protected_action"}  # fmt: skip

    def spec(self, **given) -> RunSpec:
        """The run this valid form describes (`given`: what the view worked out, the script and
        the policy rows)."""
        data = {self.SPEC_NAMES.get(k, k): v for k, v in self.cleaned_data.items()}
        data["model"] = data.get("model") or None
        return RunSpec.build(data, **given)

    def clean_allowed_hosts(self) -> list[str]:
        return lines(self.cleaned_data["allowed_hosts"])

    def clean_webhook_urls(self) -> list[str]:
        return lines(self.cleaned_data["webhook_urls"])

    def clean_slack_news(self) -> str | None:
        return self.cleaned_data["slack_news"].strip() or None

    def clean_criteria(self) -> list[str]:
        return lines(self.cleaned_data["criteria"])

    def clean_protect(self) -> list[str]:
        return lines(self.cleaned_data["protect"])

    def clean_protect_action(self) -> str:
        return self.cleaned_data["protect_action"] or "deny"

    def clean_fleet_conflicts(self) -> str:
        return self.cleaned_data["fleet_conflicts"] or "agent"

    def clean_provider(self) -> str:
        provider = self.cleaned_data["provider"]
        if provider == Provider.ANTHROPIC and not anthropic_ready():
            raise forms.ValidationError(f"Anthropic is unavailable here: {NO_KEY}")
        return provider

    def clean_environment(self) -> str | None:
        return self.cleaned_data["environment"] or None

    def clean_requirements(self) -> str | None:
        return self.cleaned_data["requirements"] or None

    def clean_checks(self) -> list[str]:
        return [c.strip() for c in self.cleaned_data["checks"].splitlines() if c.strip()]

    def clean_script(self) -> dict | None:
        upload = self.cleaned_data.get("script")
        if not upload:
            return None
        if upload.size > SCRIPT_LIMIT:
            raise forms.ValidationError("the script is larger than 1 MB")
        try:
            script = inputs.load_json(upload.read(), what="the script")
            validate_script(script)
        except (inputs.InputError, ScriptError) as e:
            raise forms.ValidationError(str(e)) from None
        return script

    def clean_tool_policy(self) -> list:
        raw = self.cleaned_data["tool_policy"].strip()
        if not raw:
            return []
        try:
            rules = inputs.load_json(raw, what="the tool policy")
        except inputs.InputError as e:
            raise forms.ValidationError(str(e)) from None
        if not isinstance(rules, list):
            raise forms.ValidationError("a tool policy is a JSON list of rules")
        return rules

    def clean(self):
        data = super().clean()
        if data.get("script") and data.get("provider") != Provider.SCRIPTED:
            self.add_error("script", "a script is only for the scripted provider")
        if data.get("provider") != Provider.EXTERNAL:
            # The page hides the field for other providers: a value left in it means nothing.
            data["heartbeat_seconds"] = None
        return data


class PolicyForm(forms.Form):
    rules = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "aria-label": "Tool policy rules (JSON)"}),
        max_length=inputs.MAX_JSON_BYTES,
    )

    def clean_rules(self) -> list:
        try:
            rules = inputs.load_json(self.cleaned_data["rules"], what="the tool policy")
        except inputs.InputError as e:
            raise forms.ValidationError(str(e)) from None
        if not isinstance(rules, list):
            raise forms.ValidationError("a tool policy is a JSON list of rules")
        return rules


def _choice(name: str, choices: list[tuple[str, str]]) -> forms.ChoiceField:
    allowed = ", ".join(value for value, _ in choices if value)
    return forms.ChoiceField(
        choices=choices,
        required=False,
        error_messages={"invalid_choice": f"{name} must be one of: {allowed} (or left out)"},
    )


class RunFilterForm(forms.Form):
    """The runs list's filters, each one a figure of the Overview links to. A bad value is said
    plainly (the list is then shown with the filters that were good)."""

    status = _choice("status", [("", "All statuses"), *RunStatus.choices])
    stuck = _choice("stuck", [("", "Stuck or not"), ("1", "Stuck")])
    approvals = _choice("approvals", [("", "Approvals or not"), ("waiting", "Approvals waiting")])
    provider = _choice("provider", [("", "All providers"), *Provider.choices])
    stalled = _choice("stalled", [("", "Stalled or not"), ("1", "Stalled (external)")])
    since = _choice(
        "since",
        [("", "Any time"), ("today", "Spent today"), ("week", "Spent this week")],
    )
    fleet = _choice("fleet", [("", "Fleets or not"), ("only", "Fleets only")])

    def active(self) -> dict[str, str]:
        """The good filters given (after is_valid(): a bad one is left out)."""
        self.is_valid()
        return {
            name: self.cleaned_data[name] for name in self.fields if self.cleaned_data.get(name)
        }
