"""The Schedules and Triggers pages, "Schedule this run…", and cancelling a run's wake-up.
Thin, as the other views: access in agents.access, the work in agents.schedules.cron,
agents.schedules.triggers and agents.services."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agents import access, inputs, services
from agents.models import Run, ScheduleEvent
from agents.schedules import cron as schedules
from agents.schedules import triggers
from agents.schedules.triggers import url_for
from dashboard.schedules.forms import ScheduleForm, TriggerForm

RECENT_TICKS = 5
SCHEDULE_ACTIONS = ("pause", "resume", "delete")


@login_required
@require_GET
def schedules_page(request: HttpRequest) -> HttpResponse:
    rows = list(
        access.visible_schedules(request.user)
        .select_related("template", "created_by", "template__created_by")
        .order_by("pk")
    )
    for s in rows:
        s.can_control = access.can_control(request.user, s.template)
        s.recent = list(ScheduleEvent.objects.filter(schedule=s).order_by("-pk")[:RECENT_TICKS])
        s.last_run = Run.objects.filter(schedule=s).order_by("-pk").first()
    return render(request, "schedules/list.html", {"schedules": rows, "nav": "schedules"})


@login_required
@require_http_methods(["GET", "POST"])
def schedule_new(request: HttpRequest, run_id: int) -> HttpResponse:
    """ "Schedule this run…": only someone who may control the run may schedule it."""
    run = access.get_controllable_run(request.user, run_id)
    form = ScheduleForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            schedule = schedules.create(
                run,
                data["cron"],
                tz=data["timezone"],
                overlap=data["overlap"],
                created_by=request.user,
                actor=services.actor_for(request.user),
            )
        except inputs.InputError as e:
            form.add_error(e.field if e.field in form.fields else None, str(e))
        else:
            messages.success(
                request, f"schedule {schedule.pk} made: run {run.pk} again at {schedule.cron}"
            )
            return redirect("schedules")
    status = 400 if form.is_bound else 200
    return render(
        request, "schedules/new.html", {"form": form, "run": run, "nav": "schedules"}, status=status
    )


@login_required
@require_POST
def schedule_action(request: HttpRequest, schedule_id: int, action: str) -> HttpResponse:
    schedule = get_object_or_404(
        access.visible_schedules(request.user).select_related("template"), pk=schedule_id
    )
    if not access.can_control(request.user, schedule.template):
        raise PermissionDenied("you may see this schedule but not change it")
    actor = services.actor_for(request.user)
    try:
        if action == "pause":
            schedules.pause(schedule.pk, actor=actor)
        elif action == "resume":
            schedules.resume(schedule.pk, actor=actor)
        elif action == "delete":
            schedules.delete(schedule.pk)
        else:
            raise Http404("no such action")
    except inputs.InputError as e:
        messages.error(request, str(e))
    else:
        done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[action]
        messages.success(request, f"schedule {schedule.pk} {done}")
    return _back(request, "schedules")


def _back(request: HttpRequest, name: str) -> HttpResponse:
    """To the list again: a redirect, or htmx's own for a confirmed (hx-confirm) post."""
    if request.htmx:
        return HttpResponseClientRedirect(reverse(name))
    return redirect(name)


@login_required
@require_http_methods(["GET", "POST"])
def triggers_page(request: HttpRequest) -> HttpResponse:
    """The triggers the user may see, and a form to make one: its URL and secret are shown on
    the page that answers the form, once."""
    made = None
    initial = {"run": request.GET.get("run")} if request.GET.get("run") else None
    form = TriggerForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        run = access.get_controllable_run(request.user, data["run"])
        secret = secrets.token_urlsafe(32) if data["signed"] else ""
        try:
            trigger, token = triggers.create(
                run, secret=secret, goal=data["goal"], created_by=request.user
            )
        except inputs.InputError as e:
            form.add_error(e.field if e.field in form.fields else None, str(e))
        else:
            made = {"trigger": trigger, "url": url_for(request, token), "secret": secret}
            form = TriggerForm()
    rows = list(access.visible_triggers(request.user).select_related("template").order_by("pk"))
    for t in rows:
        t.can_control = access.can_control(request.user, t.template)
        t.run_count = t.runs.count()
    context = {"triggers": rows, "form": form, "made": made, "nav": "triggers"}
    status = 400 if form.is_bound and form.errors else 200
    response = render(request, "schedules/triggers.html", context, status=status)
    if made:
        response["Cache-Control"] = "no-store"  # the token is on this page
    return response


@login_required
@require_POST
def trigger_revoke(request: HttpRequest, trigger_id: int) -> HttpResponse:
    trigger = get_object_or_404(
        access.visible_triggers(request.user).select_related("template"), pk=trigger_id
    )
    if not access.can_control(request.user, trigger.template):
        raise PermissionDenied("you may see this trigger but not revoke it")
    try:
        triggers.revoke(trigger.pk)
    except inputs.InputError as e:
        messages.error(request, str(e))
    else:
        messages.success(request, f"trigger {trigger.pk} revoked: its URL answers 404 from now on")
    return _back(request, "triggers")


@login_required
@require_POST
def run_wake(request: HttpRequest, run_id: int) -> HttpResponse:
    """A paused run resumes by itself at a time a person gives (in a time zone they name)."""
    run = access.get_controllable_run(request.user, run_id)
    try:
        when = datetime.fromisoformat(request.POST.get("at", "").strip()[:40])
    except ValueError:
        messages.error(request, "give the time as the form asks, e.g. 2026-12-24 09:00")
        return redirect("run-detail", run_id=run.pk)
    try:
        zone = schedules.zone(request.POST.get("timezone", "UTC").strip()[:64] or "UTC")
        if when.tzinfo is None:
            when = when.replace(tzinfo=zone)
        services.wake_at(run.pk, when, actor=services.actor_for(request.user))
    except inputs.InputError as e:
        messages.error(request, str(e).replace("--at", "the time"))
    else:
        messages.success(request, f"run {run.pk} wakes at {when:%Y-%m-%d %H:%M %Z}")
    return redirect("run-detail", run_id=run.pk)


@login_required
@require_POST
def run_cancel_wake(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    try:
        services.cancel_wake(run.pk, actor=services.actor_for(request.user))
    except services.RunError as e:
        messages.error(request, str(e))
    else:
        messages.success(request, f"run {run.pk} will not wake by itself: resume it by hand")
    return redirect("run-detail", run_id=run.pk)
