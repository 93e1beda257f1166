"""What every route needs: the run a token's user may see or control, and who acts."""

from __future__ import annotations

from django.http import Http404
from ninja.errors import AuthorizationError

from agents import access, services
from agents.models import Run
from api.auth import need


def actor(request) -> str:
    return services.actor_for(request.user)


def seen_run(request, run_id: int) -> Run:
    """The run, if the token may read and its user may see it (404 otherwise: ids reveal
    nothing)."""
    need(request, "read")
    return _visible(request, run_id)


def controlled_run(request, run_id: int, scope: str = "write") -> Run:
    need(request, scope)
    run = _visible(request, run_id)
    if not access.can_control(request.user, run):
        raise AuthorizationError(message="you may watch this run but not control it")
    return run


def runs_seen(request):
    """The runs the request's token may see: its user's, or only its run for a run's token."""
    rows = access.visible_runs(request.user)
    run_only = getattr(request.auth, "run_id", None)
    return rows if run_only is None else rows.filter(pk=run_only)


def _visible(request, run_id: int) -> Run:
    try:
        return runs_seen(request).get(pk=run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run with id {run_id}") from None
