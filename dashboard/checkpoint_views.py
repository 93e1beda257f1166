"""The run page's checkpoint timeline: checkpoint now, rewind and fork (each confirmed on a panel
that first shows what would be discarded), and the diff between two checkpoints or a checkpoint
and the live workspace. The work is agents.checkpoints'; these views only ask and show (a rewind is queued for a
worker: the request returns at once).

GETs never change anything: the confirm panels render `plan_rewind`, a read. The actions are
POSTs with CSRF and need the control right (agents.access); viewers get 403, outsiders 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents import access, checkpoints, inputs, rewinds, services
from agents.models import Checkpoint, Run, RunStatus
from agents.snapshots import display
from dashboard import markup, panels

ACTIONS = ("rewind", "fork")
FILES_SHOWN = 50


def _checkpoint(run: Run, number: int) -> Checkpoint:
    return get_object_or_404(Checkpoint.objects.select_related("session"), number=number, run=run)


def _panel_context(request, run: Run, checkpoint: Checkpoint, action: str, **extra) -> dict:
    plan = rewinds.plan_rewind(run, checkpoint)
    return {
        "run": run,
        "checkpoint": checkpoint,
        "action": action,
        "plan": plan,
        "by_kind": sorted(plan.by_kind.items()),
        "files": plan.files[:FILES_SHOWN],
        "more_files": max(len(plan.files) - FILES_SHOWN, 0),
        "can_rewind": run.is_live,
        "waiting_approval": checkpoint.waiting_approval() if action == "fork" else None,
        "goal": request.POST.get("goal", "") if request.method == "POST" else "",
        "note": request.POST.get("note", "") if request.method == "POST" else "",
        **extra,
    }


def _panel(request, context: dict, status: int = 200) -> HttpResponse:
    template = "runs/checkpoint.html#confirm-panel" if request.htmx else "runs/checkpoint.html"
    return render(request, template, context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def checkpoint_action(request: HttpRequest, run_id: int, number: int, action: str):
    if action not in ACTIONS:
        raise Http404("no such action")
    run = access.get_controllable_run(request.user, run_id)
    checkpoint = _checkpoint(run, number)
    if request.method == "GET":
        return _panel(request, _panel_context(request, run, checkpoint, action))
    actor = services.actor_for(request.user)
    note = request.POST.get("note", "").strip()
    try:
        if action == "rewind":
            rewinds.request_rewind(run.pk, checkpoint.pk, actor=actor, note=note)
        else:
            new = checkpoints.fork(
                run.pk,
                checkpoint.pk,
                actor=actor,
                created_by=request.user,
                goal=request.POST.get("goal", "").strip() or None,
                note=note,
            )
    except (checkpoints.CheckpointError, services.RunError) as e:
        if not request.htmx:
            messages.error(request, str(e))
            return redirect("run-detail", run_id=run.pk)
        run.refresh_from_db()
        return _panel(request, _panel_context(request, run, checkpoint, action, error=str(e)))
    if action == "fork":
        url = reverse("run-detail", kwargs={"run_id": new.pk})
        if request.htmx:
            return HttpResponse(status=204, headers={"HX-Redirect": url})
        messages.success(request, f"forked run {run.pk} from checkpoint {checkpoint.number}")
        return redirect(url)
    done = (
        f"Rewinding to checkpoint {checkpoint.number}: the run pauses once its worker has finished "
        "the step it is on, then its workspace is restored and it continues from there. The "
        "stream shows each step."
    )
    if not request.htmx:
        messages.success(request, done)
        return redirect("run-detail", run_id=run.pk)
    return render(
        request,
        "runs/checkpoint.html#confirm-done",
        {"run": run, "checkpoint": checkpoint, "done": done},
    )


@login_required
@require_POST
def checkpoint_now(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    error = notice = ""
    try:
        label = inputs.text(
            request.POST.get("label", ""), what="the label", max_length=200, required=False
        )
        checkpoint = checkpoints.create(
            run.pk, kind="manual", label=label, actor=services.actor_for(request.user)
        )
    except inputs.InputError as e:
        error = str(e)
    except (checkpoints.CheckpointError, OSError) as e:
        error = f"could not checkpoint: {e}"
    else:
        notice = f"checkpoint {checkpoint.number} saved ({checkpoint.files} files)"
    if not request.htmx:
        (messages.error if error else messages.success)(request, error or notice)
        return redirect("run-detail", run_id=run.pk)
    run.refresh_from_db()
    context = panels.context(run, access.Rights.of(request.user, run), panels=("checkpoints",))
    context.update({"checkpoint_error": error, "checkpoint_notice": notice})
    return render(request, "runs/detail.html#checkpoints", context)


# --- diff ------------------------------------------------------------------------------------
def change_view(c) -> dict:
    lines = markup.diff_lines(c.diff) if c.diff else []
    return {
        "path": display(c.path),
        "status": c.status.replace("_", " "),
        "css": c.status,
        "old_size": c.old_size,
        "new_size": c.new_size,
        "old_hash": (c.old_hash or "")[:12],
        "new_hash": (c.new_hash or "")[:12],
        "binary": bool(c.binary),
        "old_target": c.old_target,
        "new_target": c.new_target,
        "lines": lines,
        "added": sum(1 for cls, _ in lines if cls == "add"),
        "removed": sum(1 for cls, _ in lines if cls == "del"),
        "note": c.note or "",
    }


def diff_context(changes) -> dict:
    """What templates/includes/diff.html shows: each change, and how many of each status."""
    views = [change_view(c) for c in changes]
    counts: dict[str, int] = {}
    for c in views:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    return {"changes": views, "counts": sorted(counts.items())}


@login_required
@require_GET
def checkpoint_diff(request: HttpRequest, run_id: int) -> HttpResponse:
    """?a=CHECKPOINT&b=CHECKPOINT|live (b defaults to live): what changed from a to b."""
    run = access.get_run_for_user(request.user, run_id)
    a, b = access.sides(run, request.GET.get("a"), request.GET.get("b"))
    return render(
        request,
        "runs/diff.html",
        {
            "run": run,
            "a": a,
            "b": b,
            **diff_context(checkpoints.diff(a, b)),
            "live_status": RunStatus(run.status).label,
        },
    )
