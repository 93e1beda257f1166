"""The Overview page (the fleet at a glance) and Compare two runs. The figures are
agents.overview's and the comparison agents.compare's; these views choose the runs the user may
see (dashboard.access) and render them."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import overview
from dashboard import access


@login_required
@require_GET
def overview_page(request: HttpRequest) -> HttpResponse:
    """Every figure links to the runs list filtered to exactly the runs behind it; an htmx
    request (the page polls every few seconds) gets the figures alone."""
    figures = overview.compute(
        access.visible_runs(request.user), access.pending_approvals(request.user)
    )
    context = {
        "o": figures,
        "nav": "overview",
    }
    template = "overview/page.html#figures" if request.htmx else "overview/page.html"
    return render(request, template, context)
