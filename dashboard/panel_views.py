"""A run page's older pages of sessions, checkpoints and artifacts ("Earlier sessions…",
"Older checkpoints…"): keyset pages (agents/pages.py) read through dashboard/panels.py, as an
htmx fragment that replaces the link it came from, or as a page of their own without script."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import access, inputs
from dashboard import panels

# name in URLs → (the panel's page of items, the partial that renders it, what they are)
PANELS = {
    "sessions": (panels.sessions_page, "sessions-page", "sessions"),
    "checkpoints": (panels.checkpoints_page, "checkpoints-page", "checkpoints"),
    "artifacts": (panels.artifacts_page, "artifacts-page", "artifacts"),
}


@login_required
@require_GET
def panel_page(request: HttpRequest, run_id: int, panel: str) -> HttpResponse:
    """`?before=KEY`: the page of items below KEY (a session's index, a checkpoint's number, an
    artifact's id), newest page first without it. A bad KEY is a 400 that says why."""
    run = access.get_run_for_user(request.user, run_id)
    page_of, partial, what = PANELS[panel]
    before = None
    if request.GET.get("before", ""):
        try:
            before = inputs.whole_number(
                request.GET["before"], what="before", maximum=inputs.MAX_BIG_INT
            )
        except inputs.InputError as e:
            return render(
                request,
                "runs/panel_page.html",
                {"run": run, "what": what, "error": str(e)},
                status=400,
            )
    context = {"run": run, "rights": access.Rights.of(request.user, run), **page_of(run, before)}
    if request.htmx:
        return render(request, f"runs/detail.html#{partial}", context)
    context.update({"what": what, "fragment": f"runs/detail.html#{partial}"})
    return render(request, "runs/panel_page.html", context)
