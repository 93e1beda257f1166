"""The "Connect an agent" card of an external run: a token made for that run, shown once with the
whole command (`shiftlog-claude --run N`). Only people who may drive the run may make one.
A page of the API app (the token is the API's), routed by the project shell (shiftlog/urls.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from agents import access
from api.models import ApiToken, connect_command


@login_required
@require_POST
def run_token(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    if not (run.is_external and run.is_live):
        raise PermissionDenied("only a live run driven by an external agent takes an agent token")
    row, token = ApiToken.for_run(request.user, run)
    context = {
        "run": run,
        "row": row,
        "command": connect_command(request.build_absolute_uri("/").rstrip("/"), token, run.pk),
    }
    template = "runs/connect_token.html"
    return render(request, f"{template}#made" if request.htmx else template, context)
