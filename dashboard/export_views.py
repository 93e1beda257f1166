"""Downloads of a checkpoint: its workspace as a .tar.gz, and the change between two checkpoints
(or a checkpoint and the live workspace) as a patch for `git apply`. The work is agents.export's;
these views check access (viewers may download, outsiders get 404) and stream the result.

agents.export checks before the first byte what it can (trees, blobs, the workspace): such a
problem is a plain-text 409. A problem found later (a corrupt blob, a live file that changed)
breaks the download off, so nobody is handed a wrong file that looks complete.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from agents import access, export, streaming
from agents.models import Checkpoint


@login_required
@require_GET
def checkpoint_export(request: HttpRequest, run_id: int, number: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    checkpoint = get_object_or_404(Checkpoint, number=number, run=run)
    checkpoint.run = run
    try:
        chunks = export.tar_chunks(checkpoint)
    except export.ExportError as e:
        return _cannot(e)
    return streaming.attachment(
        request, chunks, f"{export.tar_name(checkpoint)}.tar.gz", "application/gzip"
    )


@login_required
@require_GET
def checkpoint_patch(request: HttpRequest, run_id: int) -> HttpResponse:
    """?a=CHECKPOINT&b=CHECKPOINT|live, read as the diff page reads them."""
    run = access.get_run_for_user(request.user, run_id)
    a, b = access.sides(run, request.GET.get("a"), request.GET.get("b"))
    try:
        chunks = export.patch_chunks(a, b)
    except export.ExportError as e:
        return _cannot(e)
    return streaming.attachment(
        request, chunks, f"{export.patch_name(a, b)}.patch", "text/x-diff; charset=utf-8"
    )


def _cannot(e: export.ExportError) -> HttpResponse:
    return HttpResponse(
        f"The export cannot be made: {e}\n", status=409, content_type="text/plain; charset=utf-8"
    )
