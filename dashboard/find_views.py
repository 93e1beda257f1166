"""Finding things in a long run: its events narrowed by kind, tool, text, failures or session
(oldest first, a page at a time), and the first failure, opened in its context (the run page at
that event, `/runs/ID/events/SEQ/`).
"""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents import access, inputs
from agents.events import KINDS
from agents.models import Event, Run, Session
from dashboard import stream

PAGE = 100


class FindForm(forms.Form):
    kind = forms.ChoiceField(
        required=False,
        choices=[("", "any kind"), *[(k, f"{k} ({e.label})") for k, e in KINDS.items()]],
    )
    tool = forms.CharField(required=False, max_length=100, label="Tool")
    q = forms.CharField(required=False, max_length=200, label="Text")
    errors = forms.BooleanField(required=False, label="Failures only")
    session = forms.IntegerField(required=False, min_value=1, max_value=10**9, label="Session")
    after = forms.IntegerField(required=False, min_value=0, max_value=inputs.MAX_BIG_INT)
    around = forms.IntegerField(required=False, min_value=1, max_value=inputs.MAX_BIG_INT)

    def clean_q(self) -> str:
        text = self.cleaned_data["q"]
        if "\x00" in text:
            raise forms.ValidationError("the text cannot hold a NUL character")
        return text.strip()


def _searching(data: dict) -> bool:
    return any(data.get(k) for k in ("kind", "tool", "q", "errors", "session"))


def _rows(run: Run, values) -> list[stream.Row]:
    rows = stream.attach_approvals([stream.Row(**v) for v in values])
    return stream.mark_abandoned(rows, Event.objects.abandoned_ranges(run.pk))


@login_required
@require_GET
def run_find(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    form = FindForm(request.GET or None)
    context = {"run": run, "form": form, "rights": access.Rights.of(request.user, run)}
    if form.is_bound and not form.is_valid():
        return render(request, "runs/find.html", context, status=400)
    data = form.cleaned_data if form.is_bound else {}
    events = Event.objects.filter(run=run)
    if data.get("around"):  # an event in its context: the run page at that event
        return redirect(_at(run.pk, data["around"]))
    if not _searching(data):
        context["mode"] = "form"
        return render(request, "runs/find.html", context)
    session_id = None
    if data.get("session"):
        session_id = (
            Session.objects.filter(run=run, index=data["session"]).values_list("pk", flat=True)
        ).first() or 0  # no such session: nothing matches
    found = events.matching(
        kind=data.get("kind") or "",
        tool=data.get("tool") or "",
        text=data.get("q") or "",
        errors=bool(data.get("errors")),
        session_id=session_id,
    )
    page = list(
        found.filter(seq__gt=data.get("after") or 0)
        .order_by("seq")
        .values(*stream.EVENT_FIELDS)[: PAGE + 1]
    )
    rows = _rows(run, page[:PAGE])
    more = request.GET.copy()
    if len(page) > PAGE:
        more["after"] = str(page[PAGE - 1]["seq"])
    context.update(
        {
            "rows": rows,
            "mode": "results",
            "next_url": f"?{more.urlencode()}" if len(page) > PAGE else "",
        }
    )
    return render(request, "runs/find.html", context)


@login_required
@require_GET
def first_failure(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run's first failure, in its context; or the failures search, saying there is none."""
    run = access.get_run_for_user(request.user, run_id)
    seq = (
        Event.objects.filter(run=run).failures().order_by("seq").values_list("seq", flat=True)
    ).first()
    if seq is None:
        return redirect(reverse("run-find", kwargs={"run_id": run.pk}) + "?errors=on")
    return redirect(_at(run.pk, seq))


def _at(run_id: int, seq: int) -> str:
    return reverse("run-event", kwargs={"run_id": run_id, "seq": seq}) + f"#seq-{seq}"
