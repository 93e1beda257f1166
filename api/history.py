"""What a run did and left: events (a page, or a live stream), checkpoints, diffs, exports,
artifacts."""

from __future__ import annotations

import asyncio
import json
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, StreamingHttpResponse
from ninja import Query, Router, Schema, Status
from pydantic import Field

from agents import access, blobstore, checkpoints, export, streaming
from agents.lifecycle import TERMINAL
from agents.models import Artifact, Checkpoint, Event, Run
from api import out
from api.auth import need
from api.common import actor, controlled_run, seen_run
from api.errors import Problem
from api.schemas import (
    ArtifactList,
    ArtifactOut,
    ChangeOut,
    CheckpointCreate,
    CheckpointList,
    CheckpointOut,
    DiffOut,
    EventPage,
    PathId,
)

router = Router(tags=["history"])

# The live stream: how often it looks for new events, and a comment line to keep proxies open.
POLL_SECONDS = 0.2
KEEPALIVE_SECONDS = 15.0
STREAM_BATCH = 500


class After(Schema):
    after: int = Field(0, ge=0, le=2**53, description="the seq to read after")
    limit: int = Field(200, ge=1, le=1000)


def _page(run_id: int, after: int, limit: int) -> list[Event]:
    return list(
        Event.objects.filter(run_id=run_id, seq__gt=after)
        .select_related("session")
        .order_by("seq")[:limit]
    )


@router.get("/runs/{run_id}/events", response=EventPage, summary="Events in seq order")
def events(request, run_id: PathId, page: Query[After]):
    run = seen_run(request, run_id)
    return {"items": out.events(_page(run.pk, page.after, page.limit)), "last_seq": run.last_seq}


@router.get(
    "/runs/{run_id}/events/stream",
    summary="Events as Server-Sent Events, live",
    description="`id:` is the seq; resume with `Last-Event-ID` (or `?after=`): no gap, no "
    "duplicate. Ends with `event: end` once the run is over and every event is sent.",
    response={200: None},
    openapi_extra={"responses": {200: {"content": {"text/event-stream": {}}}}},
)
async def stream(request, run_id: PathId, after: int | None = Query(None, ge=0, le=2**53)):
    run = await sync_to_async(seen_run)(request, run_id)
    last = request.headers.get("Last-Event-ID", "").strip()
    if after is None and last:
        if not (last.isascii() and last.isdigit() and len(last) < 17):
            raise Problem(422, "Last-Event-ID: not an event id this stream sent")
        after = int(last)
    response = StreamingHttpResponse(
        _sse(run.pk, after or 0), content_type="text/event-stream; charset=utf-8"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _sse(run_id: int, after: int):
    read = sync_to_async(_page)
    status = sync_to_async(
        lambda: Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    )
    quiet = 0.0
    # A stream is closed after a while (the client reconnects with Last-Event-ID): no connection
    # is held for ever, and proxies see traffic.
    closes_at = time.monotonic() + settings.SHIFTLOG["API_STREAM_SECONDS"]
    yield b"retry: 1000\n\n"
    while time.monotonic() < closes_at:
        rows = await read(run_id, after, STREAM_BATCH)
        for item in out.events(rows):
            data = json.dumps(item, cls=DjangoJSONEncoder)
            yield f"id: {item['seq']}\nevent: {item['kind']}\ndata: {data}\n\n".encode()
            after = item["seq"]
        if len(rows) == STREAM_BATCH:
            continue
        if rows:
            quiet = 0.0
        elif (await status()) in TERMINAL:
            # Over: one more look catches events committed with the final status.
            if not await read(run_id, after, 1):
                yield b"event: end\ndata: {}\n\n"
                return
            continue
        await asyncio.sleep(POLL_SECONDS)
        quiet += POLL_SECONDS
        if quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield b": keep-alive\n\n"


@router.get("/runs/{run_id}/checkpoints", response=CheckpointList, summary="Checkpoints")
def list_checkpoints(request, run_id: PathId):
    run = seen_run(request, run_id)
    rows = Checkpoint.objects.filter(run=run).select_related("session").order_by("number")
    return {"items": [out.checkpoint(c) for c in rows]}


@router.post("/runs/{run_id}/checkpoints", response={201: CheckpointOut}, summary="Checkpoint now")
def create_checkpoint(request, run_id: PathId, body: CheckpointCreate):
    run = controlled_run(request, run_id)
    try:
        made = checkpoints.create(run.pk, kind="manual", label=body.label, actor=actor(request))
    except OSError as e:
        raise Problem(409, f"could not checkpoint: {e}") from None
    return Status(201, out.checkpoint(made))


class Sides(Schema):
    a: int = Field(..., ge=1, le=2**31, description="a checkpoint's number")
    b: str = Field("live", max_length=12, description="a checkpoint's number, or live")


def _sides(run: Run, sides: Sides):
    try:
        return access.sides(run, str(sides.a), sides.b)
    except Http404 as e:
        raise Problem(
            404, f"{e}: a and b name checkpoints of run {run.pk} (b may be live)"
        ) from None


@router.get("/runs/{run_id}/diff", response=DiffOut, summary="What changed from a to b")
def diff(request, run_id: PathId, sides: Query[Sides]):
    run = seen_run(request, run_id)
    a, b = _sides(run, sides)
    changes = checkpoints.diff(a, b)
    return {
        "a": a.number,
        "b": b.number if b is not None else "live",
        "changes": [
            ChangeOut(path=c.path, change=c.status, kind=c.new_type or c.old_type, diff=c.diff)
            for c in changes
        ],
    }


@router.get(
    "/runs/{run_id}/diff.patch",
    summary="The change from a to b as a patch for git apply",
    response={200: None},
    openapi_extra={"responses": {200: {"content": {"text/x-diff": {}}}}},
)
def diff_patch(request, run_id: PathId, sides: Query[Sides]):
    run = seen_run(request, run_id)
    a, b = _sides(run, sides)
    try:
        chunks = export.patch_chunks(a, b)
    except export.ExportError as e:
        raise Problem(409, f"the patch cannot be made: {e}") from None
    return streaming.attachment(
        request, chunks, f"{export.patch_name(a, b)}.patch", "text/x-diff; charset=utf-8"
    )


@router.get(
    "/runs/{run_id}/checkpoints/{number}/export.tar.gz",
    summary="The workspace at a checkpoint, as a .tar.gz",
    response={200: None},
    openapi_extra={"responses": {200: {"content": {"application/gzip": {}}}}},
)
def export_tar(request, run_id: PathId, number: PathId):
    run = seen_run(request, run_id)
    checkpoint = Checkpoint.objects.filter(run=run, number=number).first()
    if checkpoint is None:
        raise Problem(404, f"run {run.pk} has no checkpoint {number}")
    checkpoint.run = run
    try:
        chunks = export.tar_chunks(checkpoint)
    except export.ExportError as e:
        raise Problem(409, f"the export cannot be made: {e}") from None
    return streaming.attachment(
        request, chunks, f"{export.tar_name(checkpoint)}.tar.gz", "application/gzip"
    )


@router.get("/runs/{run_id}/artifacts", response=ArtifactList, summary="Artifacts")
def list_artifacts(request, run_id: PathId):
    run = seen_run(request, run_id)
    rows = Artifact.objects.filter(run=run).select_related("session").order_by("pk")
    return {"items": [out.artifact(a) for a in rows]}


def _artifact(request, artifact_id: PathId) -> Artifact:
    found = (
        Artifact.objects.filter(pk=artifact_id, run__in=access.visible_runs(request.user))
        .select_related("session")
        .first()
    )
    if found is None:
        raise Problem(404, f"no artifact with id {artifact_id}")
    return found


@router.get("/artifacts/{artifact_id}", response=ArtifactOut, summary="One artifact")
def get_artifact(request, artifact_id: PathId):
    need(request, "read")
    return out.artifact(_artifact(request, artifact_id))


@router.get(
    "/artifacts/{artifact_id}/content",
    summary="An artifact's bytes",
    response={200: None},
    openapi_extra={"responses": {200: {"content": {"application/octet-stream": {}}}}},
)
def artifact_content(request, artifact_id: PathId):
    need(request, "read")
    artifact = _artifact(request, artifact_id)
    try:
        f = blobstore.configured().open(artifact.blob_hash)
    except (FileNotFoundError, ValueError):
        raise Problem(404, "the artifact's content is missing from the blob store") from None
    return streaming.file_response(
        request,
        f,
        as_attachment=True,
        filename=artifact.name.rsplit("/", 1)[-1],
        content_type="application/octet-stream",
    )
