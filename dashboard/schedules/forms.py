"""The forms of the Schedules and Triggers pages: each error says what to change."""

from __future__ import annotations

from django import forms

from agents import inputs
from agents.models import Overlap
from agents.schedules import cron as schedules
from agents.schedules import triggers


class ScheduleForm(forms.Form):
    cron = forms.CharField(
        label="Cron expression",
        max_length=200,
        help_text="minute hour day month weekday, e.g. 0 9 * * MON-FRI; or @hourly, @daily…",
        widget=forms.TextInput(attrs={"placeholder": "0 9 * * MON-FRI", "autocomplete": "off"}),
    )
    timezone = forms.CharField(
        label="Time zone",
        max_length=64,
        initial="UTC",
        help_text="an IANA name: UTC, Europe/Paris, America/New_York…",
    )
    overlap = forms.ChoiceField(
        label="While the previous run is still live",
        choices=Overlap.choices,
        initial=Overlap.SKIP,
    )

    def clean_cron(self) -> str:
        try:
            return schedules.clean_cron(self.cleaned_data["cron"])
        except inputs.InputError as e:
            raise forms.ValidationError(str(e)) from None

    def clean_timezone(self) -> str:
        name = self.cleaned_data["timezone"].strip()
        try:
            schedules.zone(name)
        except inputs.InputError as e:
            raise forms.ValidationError(str(e)) from None
        return name


class TriggerForm(forms.Form):
    run = forms.IntegerField(
        label="Template run",
        min_value=1,
        max_value=inputs.MAX_BIG_INT,
        help_text="each delivery makes a new run like this one",
    )
    goal = forms.CharField(
        label="Goal (optional)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="blank: the run's own goal. {payload.path.to.value} puts a value of the "
        "delivered JSON in (list items by number).",
    )
    signed = forms.BooleanField(
        label="Also require a signature (HMAC-SHA256 of the body with a new secret)",
        required=False,
    )

    def clean_goal(self) -> str:
        goal = self.cleaned_data["goal"]
        try:
            triggers.check_places(goal)
        except inputs.InputError as e:
            raise forms.ValidationError(str(e)) from None
        return goal
