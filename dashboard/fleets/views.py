"""A fleet's parent's Fleet panel, read again by the page while the fleet is live (and fetched
when a fleet event is pushed): the tree as this user may see it, with the meters, whose fleet
spend moves with the children.

Why a poll and not the socket: the socket's renders are shared by every viewer with the same
rights (dashboard.live.feed's cache), and which children show depends on who looks; a child's events
also go to the child's own group, not the parent's. A request every few seconds while something
in the fleet is live, a bounded handful of queries each (dashboard.fleets.tree), stops by itself when
the fleet is over.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from agents import access
from dashboard import panels
from dashboard.fleets import tree as fleet


def context(user, run, rollup=None) -> dict:
    """What the run page shows of fleets: the tree below it and the fleet it belongs to
    (`rollup`: the fleet's spend, as the meters' context has it)."""
    return {
        "fleet": fleet.tree(user, run, rollup),
        "fleet_of": fleet.fleet_label(user, run),
        "fleet_poll": panels.FLEET_POLL_SECONDS,
    }


@login_required
@require_GET
def run_fleet(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    data = panels.context(run, access.Rights.of(request.user, run), panels=("meters",))
    data.update(fleet=fleet.tree(request.user, run, data["rollup"]))
    data["fleet_poll"] = panels.FLEET_POLL_SECONDS
    html = render_to_string("runs/detail.html#fleet", data, request=request)
    html += render_to_string("runs/detail.html#meters", {**data, "oob": True})
    response = HttpResponse(html)
    response["Cache-Control"] = "no-store"
    return response
