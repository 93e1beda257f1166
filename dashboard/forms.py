from __future__ import annotations

from django import forms
from django.conf import settings

from agents import inputs
from agents.models import Provider
from agents.providers.scripted import ScriptError, validate_script
from agents.services import DEMO_CHECKS, DEMO_GOAL

SCRIPT_LIMIT = 1_000_000


def provider_choices() -> list[tuple[str, str]]:
    choices = [(Provider.SCRIPTED.value, "scripted · offline (no model is called)")]
    if settings.SHIFTLOG.get("ANTHROPIC_API_KEY"):
        choices.append((Provider.ANTHROPIC.value, "Anthropic"))
    return choices


class NewRunForm(forms.Form):
    goal = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=inputs.MAX_TEXT)
    checks = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=inputs.MAX_TEXT,
        help_text="One shell command a line; the harness runs them when the agent says it is done.",
    )
    provider = forms.ChoiceField(choices=provider_choices, initial=Provider.SCRIPTED)
    script = forms.FileField(
        required=False,
        help_text="A JSON script for the scripted provider; empty: the built-in demo.",
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
    tool_policy = forms.CharField(
        required=False,
        max_length=inputs.MAX_JSON_BYTES,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON rules, e.g. [{"tool": "bash", "pattern": "^pip install", "action": "ask"}]',
    )

    @classmethod
    def demo(cls) -> NewRunForm:
        return cls(
            initial={
                "goal": DEMO_GOAL,
                "checks": "\n".join(DEMO_CHECKS),
                "max_turns_per_session": 4,
            }
        )

    def clean_allowed_hosts(self) -> list[str]:
        return [h.strip() for h in self.cleaned_data["allowed_hosts"].splitlines() if h.strip()]

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
