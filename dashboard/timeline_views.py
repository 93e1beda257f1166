"""The run timeline: its page, its data (`timeline.json`, answered from this process's index of
the run) and the run page opened at one event, where a click on the timeline leads."""

from __future__ import annotations

import json
import time

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import access, inputs
from agents.models import Event, Run
from dashboard import panels, stream, timeline, timeline_index
from dashboard.fleets import timeline as timeline_fleet
from dashboard.forms import PolicyForm

AROUND = 25  # events shown either side of the one a timeline bar leads to


@login_required
@require_GET
def run_timeline(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    has_children = access.visible_runs(request.user).filter(parent=run).exists()
    return render(request, "runs/timeline.html", {"run": run, "has_children": has_children})


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def parse_window(params, last_seq: int) -> timeline.Window:
    """?from=SEQ&to=SEQ&width=PX, all optional: the whole run at 1200 px by default, `to` past
    the end means the end. Raises InputError with what to change."""

    def number(name: str, default: int, **limits) -> int:
        raw = params.get(name)
        if raw is None or raw == "":
            return default
        return inputs.whole_number(raw, what=name, **limits)

    first = number("from", 1, maximum=inputs.MAX_BIG_INT)
    last = min(number("to", last_seq, maximum=inputs.MAX_BIG_INT), last_seq)
    width = number(
        "width",
        timeline.WIDTH_DEFAULT,
        minimum=timeline.WIDTH_MIN,
        maximum=timeline.WIDTH_MAX,
    )
    if first > last_seq:
        raise inputs.InputError(f"from is past the run's last event (#{last_seq})")
    if first > last:
        raise inputs.InputError("from must not be after to")
    return timeline.Window(first, last, width)


def timeline_json(request: HttpRequest, run_id: int) -> HttpResponse:
    started = time.perf_counter()
    if request.method != "GET":
        response = _error("only GET", 405)
        response["Allow"] = "GET"
        return response
    if not request.user.is_authenticated:
        return _error("log in first", 401)
    try:
        run = access.visible_runs(request.user).get(pk=run_id)
    except Run.DoesNotExist:
        return _error("no such run", 404)
    if run.last_seq == 0:
        return _error("the run has no events yet", 400)
    try:
        window = parse_window(request.GET, run.last_seq)
    except inputs.InputError as e:
        return _error(str(e), 400)
    kids = list(
        access.visible_runs(request.user)
        .filter(parent=run)
        .order_by("pk")[: timeline_fleet.MAX_CHILD_LANES + 1]
    )
    total = len(kids)
    if total > timeline_fleet.MAX_CHILD_LANES:
        total = access.visible_runs(request.user).filter(parent=run).count()
    with timeline_index.LOCK:
        index = timeline_index.index_for(run)
        children = [
            timeline_fleet.Child(k, timeline_index.index_for(k) if k.last_seq else None)
            for k in kids[: timeline_fleet.MAX_CHILD_LANES]
        ]
        data = timeline.Answer(run, index, window, children, total).as_json()
    ms = (time.perf_counter() - started) * 1000
    data["server_ms"] = round(ms, 2)
    response = JsonResponse(data)
    response["Server-Timing"] = f"timeline;dur={ms:.2f}"
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_GET
def run_event(request: HttpRequest, run_id: int, seq: int) -> HttpResponse:
    """The run page at one event: the same header, meters and panels, the events around it, the
    event in view. Not live (the live page shows only the newest events)."""
    run = access.get_run_for_user(request.user, run_id)
    target = Event.objects.filter(run_id=run.pk, seq=seq).values_list("pk", flat=True).first()
    if target is None:
        raise Http404("no such event")
    context = panels.context(run, access.Rights.of(request.user, run))
    values = (
        Event.objects.filter(run_id=run.pk, seq__gte=seq - AROUND, seq__lte=seq + AROUND)
        .order_by("seq")
        .values(*stream.EVENT_FIELDS)
    )
    rows = stream.attach_approvals([stream.Row(**v) for v in values])
    rows = stream.mark_abandoned(rows, context["abandoned_ranges"])
    context.update(
        {
            "rows": rows,
            "target_seq": seq,
            "target_pk": target,
            "last_shown": rows[-1].seq,
            "earlier": max(1, seq - 2 * AROUND - 1) if rows and rows[0].seq > 1 else None,
            "later": seq + 2 * AROUND + 1 if rows and rows[-1].seq < run.last_seq else None,
            "policy_form": PolicyForm(initial={"rules": json.dumps(run.tool_policy, indent=2)}),
        }
    )
    return render(request, "runs/event.html", context)
