"""The Overview page (the fleet at a glance) and Compare two runs. The figures are
agents.overview's and the comparison agents.compare's; these views choose the runs the user may
see (agents.access) and render them."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import access, compare, inputs, overview
from dashboard.checkpoint_views import diff_context


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


# --- compare ---------------------------------------------------------------------------------
def _run_id(value: str | None, what: str) -> int:
    if not (value or "").strip():
        raise inputs.InputError(f"give {what}'s id")
    return inputs.object_id(value, what=f"{what}'s id")


@login_required
@require_GET
def run_compare(request: HttpRequest) -> HttpResponse:
    """?a=ID&b=ID: two runs side by side, and the diff from a's latest checkpoint to b's.
    ?fork=ID compares a fork with the run it was forked from. Missing or bad ids get the form
    again with the reason; a run the user may not see is a 404."""
    get = request.GET
    context: dict = {"a_id": get.get("a", ""), "b_id": get.get("b", "")}
    if not any(get.get(k) for k in ("a", "b", "fork")):
        return render(request, "runs/compare.html", context)
    try:
        if get.get("fork"):
            b = access.get_run_for_user(request.user, _run_id(get["fork"], "the fork"))
            origin = compare.origin_of(b)
            if origin is None:
                raise inputs.InputError(f"run {b.pk} is not a fork: give two run ids")
            a = access.get_run_for_user(request.user, origin)
        else:
            a_id, b_id = _run_id(get.get("a"), "run A"), _run_id(get.get("b"), "run B")
            if a_id == b_id:
                raise inputs.InputError("choose two different runs")
            a = access.get_run_for_user(request.user, a_id)
            b = access.get_run_for_user(request.user, b_id)
    except inputs.InputError as e:
        context["error"] = str(e)
        return render(request, "runs/compare.html", context, status=400)
    found = compare.compare(a, b)
    context.update(
        {
            "c": found,
            "a_id": a.pk,
            "b_id": b.pk,
            "rows": _check_rows(found),
            **(diff_context(found.changes) if found.changes is not None else {}),
        }
    )
    return render(request, "runs/compare.html", context)


def _check_rows(found: compare.Comparison) -> list[dict]:
    return [
        {
            "command": command,
            "a": found.a.checks.get(command, []),
            "b": found.b.checks.get(command, []),
        }
        for command in found.commands
    ]
