"""The run page's memory panel (read, edit, pin, delete, promote) and each session's wake-up
inspector: what its first message was built from, part by part, with the diff against the
previous session's. Access in agents.access; the changes in agents.memory."""

from __future__ import annotations

import difflib

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents import access, inputs, memory, services
from agents.models import Session
from agents.runtime import prompts
from dashboard import panels

LABELS = {
    "goal": "Goal",
    "done_conditions": "Done-conditions",
    "review_criteria": "Review criteria",
    "acceptance": "Acceptance criteria",
    "session": "This session",
    "handoff": "Latest handoff",
    "checks": "Latest check results",
    "memory": "Memory",
    "changed_by_people": "Memory changed by people",
    "rewind_note": "Rewind note",
    "notes": "Notes from people",
    "workspace": "Workspace listing",
}
ACTIONS = ("save", "pin", "unpin", "delete", "promote")


def memory_panel(request: HttpRequest, run, **extra) -> HttpResponse:
    context = panels.context(run, access.Rights.of(request.user, run), panels=("memory",))
    context.update(extra)
    return render(request, "runs/detail.html#memory", context)


@login_required
@require_GET
def run_memory(request: HttpRequest, run_id: int) -> HttpResponse:
    return memory_panel(request, access.get_run_for_user(request.user, run_id))


@login_required
@require_POST
def memory_change(request: HttpRequest, run_id: int) -> HttpResponse:
    """A person's change to one entry: save (add or edit its text), pin, unpin, delete, promote
    (to the project's memory). Each is an event naming them."""
    run = access.get_controllable_run(request.user, run_id)
    actor = services.actor_for(request.user)
    action = request.POST.get("action", "")
    key = request.POST.get("key", "")
    scope = memory.PROJECT if request.POST.get("scope") == memory.PROJECT else memory.RUN
    error = notice = ""
    try:
        if action == "save":
            memory.set_entry(
                run.pk, key, text=request.POST.get("text", ""), scope=scope, actor=actor
            )
        elif action in ("pin", "unpin"):
            memory.set_entry(run.pk, key, pinned=action == "pin", scope=scope, actor=actor)
        elif action == "delete":
            memory.delete_entry(run.pk, key, scope=scope, actor=actor)
        elif action == "promote":
            memory.promote(run.pk, key, actor=actor)
        else:
            raise inputs.InputError(f"choose one of: {', '.join(ACTIONS)}")
        notice = f"{key.strip()!r}: {action} done; the agent's next session is told"
    except inputs.InputError as e:
        error = str(e)
    if not request.htmx:
        (messages.error if error else messages.success)(request, error or notice)
        return redirect("run-detail", run_id=run.pk)
    response = memory_panel(request, run, memory_error=error, memory_notice=notice)
    if error:
        response.status_code = 400
    return response


def wake_up_parts(session: Session, previous: Session | None) -> list[dict]:
    """The session's parts in order, each with its size and how it differs from the previous
    session's (new, same, changed with the diff, or gone)."""
    before = previous.wake_up if previous is not None else {}
    now = session.wake_up or {}
    out = []
    for name in prompts.WAKE_UP_PARTS:
        part, old = now.get(name), before.get(name)
        if part is None and old is None:
            continue
        item = {"name": name, "label": LABELS.get(name, name), "part": part, "diff": []}
        if part is None:
            item["change"] = "gone"
        elif previous is None:
            item["change"] = ""
        elif old is None:
            item["change"] = "new"
        elif old["text"] == part["text"]:
            item["change"] = "same"
        else:
            item["change"] = "changed"
            lines = difflib.unified_diff(
                old["text"].splitlines(), part["text"].splitlines(), lineterm="", n=1
            )
            item["diff"] = [line for line in lines if not line.startswith(("---", "+++"))]
        out.append(item)
    return out


@login_required
@require_GET
def wake_up(request: HttpRequest, run_id: int, index: int) -> HttpResponse:
    """What a session knew at wake-up; in the run page (htmx) or on its own."""
    run = access.get_run_for_user(request.user, run_id)
    session = get_object_or_404(Session, run=run, index=index)
    previous = Session.objects.filter(run=run, index__lt=index).order_by("-index").first()
    if not session.wake_up:
        raise Http404("this session has no wake-up record (it started before they were kept)")
    parts = wake_up_parts(session, previous)
    context = {
        "run": run,
        "session": session,
        "previous": previous,
        "parts": parts,
        "total": sum(p["part"]["tokens"] for p in parts if p["part"]),
    }
    template = "runs/wake_up.html#wake-up" if request.htmx else "runs/wake_up.html"
    return render(request, template, context)
