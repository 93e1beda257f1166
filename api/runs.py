"""Runs: create, list, show, pause, resume, cancel, note, rewind, fork."""

from __future__ import annotations

from typing import Literal

from django.db.models import Q
from ninja import Query, Router, Schema, Status
from pydantic import Field

from agents import access, checkpoints, pages, reach, rewinds, services
from agents.inputs import MAX_BIG_INT, InputError
from agents.models import Checkpoint, Run, RunStatus
from agents.runspec import RunSpec
from api import out
from api.auth import need
from api.common import actor, controlled_run, seen_run
from api.errors import Problem
from api.models import ApiToken, connect_command
from api.schemas import (
    ForkPreview,
    FromCheckpoint,
    Note,
    PathId,
    Reason,
    Resume,
    RewindOut,
    RunCreate,
    RunOut,
    RunPage,
    RunSlack,
    Seq,
)

router = Router(tags=["runs"])


class RunTokenOut(Schema):
    id: int
    prefix: str
    run: int
    scopes: list[str]
    token: str = Field(description="shown this once; only its hash is kept")
    command: str = Field(description="what puts Claude Code on the run with this token")


class RunFilter(Schema):
    status: RunStatus | None = None
    provider: Literal["scripted", "anthropic", "external"] | None = None
    q: str | None = Field(None, max_length=200, description="words in the goal")
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, max_length=40, description="next_cursor of the last page")


@router.get("/runs", response=RunPage, summary="List runs, newest first")
def list_runs(request, filters: Query[RunFilter]):
    need(request, "read")
    rows = access.visible_runs(request.user).select_related("forked_from")
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.provider:
        rows = rows.filter(provider=filters.provider)
    if filters.q:
        for word in filters.q.split()[:10]:
            rows = rows.filter(Q(goal__icontains=word))
    # The web's order and cursors (agents/pages.py): newest first by (created_at, id), each
    # page read from an index whatever its depth.
    page = list(pages.older_than(rows, _cursor(filters.cursor))[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    return {"items": out.runs(page), "next_cursor": pages.runs_cursor(page[-1]) if more else None}


def _cursor(text: str | None) -> pages.Cursor | None:
    if not text:
        return None
    # An id, as next_cursor was before it was (created_at, id).
    if text.isascii() and text.isdigit() and int(text) <= MAX_BIG_INT:
        found = Run.objects.filter(pk=int(text)).first()
        if found is not None:
            return pages.Cursor.of(found)
    try:
        return pages.Cursor.parse(text, what="cursor")
    except InputError:
        raise Problem(
            422, "cursor: not a cursor this API gave (use next_cursor as it is)"
        ) from None


@router.post("/runs", response={201: RunOut}, summary="Create a run (it is queued at once)")
def create_run(request, body: RunCreate):
    need(request, "write")
    spec = RunSpec.build(
        body.model_dump(exclude_none=True),
        script_name="from the API" if body.script is not None else "",
    )
    run = services.create_run(spec, created_by=request.user, actor=actor(request))
    return Status(201, out.run(run))


@router.get("/runs/{run_id}", response=RunOut, summary="One run")
def get_run(request, run_id: PathId):
    return out.run(seen_run(request, run_id))


def _fresh(run_id: int) -> dict:
    return out.run(Run.objects.select_related("forked_from").get(pk=run_id))


@router.post("/runs/{run_id}/pause", response=RunOut, summary="Pause a run")
def pause(request, run_id: PathId, body: Reason):
    controlled_run(request, run_id)
    services.pause_run(run_id, actor=actor(request), reason=body.reason)
    return _fresh(run_id)


@router.post("/runs/{run_id}/resume", response=RunOut, summary="Resume a paused run")
def resume(request, run_id: PathId, body: Resume):
    controlled_run(request, run_id)
    services.resume_run(run_id, actor=actor(request), budgets=services.Budgets(**body.dict()))
    return _fresh(run_id)


@router.post("/runs/{run_id}/cancel", response=RunOut, summary="Cancel a run")
def cancel(request, run_id: PathId, body: Reason):
    controlled_run(request, run_id)
    services.cancel_run(run_id, actor=actor(request), reason=body.reason)
    return _fresh(run_id)


@router.post("/runs/{run_id}/slack", response=RunOut, summary="Change a run's Slack settings")
def slack(request, run_id: PathId, body: RunSlack):
    """Where the run's Slack messages go and which run news it posts; its project's for what
    it leaves unset (agents/reach.py)."""
    run = controlled_run(request, run_id)
    given = body.model_fields_set
    news = body.slack_news if body.slack_news is not None else "project"
    reach.set_run_slack(
        run,
        channel=body.slack_channel if "slack_channel" in given else None,
        news=news if "slack_news" in given else None,
        actor=actor(request),
    )
    return _fresh(run_id)


@router.post("/runs/{run_id}/note", response={201: Seq}, summary="Steer a run with a note")
def note(request, run_id: PathId, body: Note):
    controlled_run(request, run_id)
    services.note_run(run_id, body.text, actor=actor(request), author=request.user.get_username())
    return Status(201, {"seq": Run.objects.get(pk=run_id).last_seq})


def _checkpoint(run: Run, number: int) -> Checkpoint:
    found = Checkpoint.objects.filter(run=run, number=number).first()
    if found is None:
        raise Problem(404, f"run {run.pk} has no checkpoint {number}")
    return found


@router.post(
    "/runs/{run_id}/rewind",
    response={200: RewindOut, 202: RewindOut},
    summary="Rewind a run to a checkpoint (or, with dry_run, see what it would discard)",
)
def rewind(request, run_id: PathId, body: FromCheckpoint):
    run = controlled_run(request, run_id)
    target = _checkpoint(run, body.checkpoint)
    discarded = rewinds.plan_rewind(run, target)
    if not body.dry_run:
        rewinds.request_rewind(run.pk, target.pk, actor=actor(request), note=body.note)
    answer = {
        "checkpoint": target.number,
        "dry_run": body.dry_run,
        "discarded": discarded.as_dict(),
    }
    return Status(200 if body.dry_run else 202, answer)


@router.post(
    "/runs/{run_id}/fork",
    response={201: RunOut, 200: ForkPreview},
    summary="Fork a new run from a checkpoint",
)
def fork(request, run_id: PathId, body: FromCheckpoint):
    run = controlled_run(request, run_id)  # as on the web: forking is controlling the run
    source = _checkpoint(run, body.checkpoint)
    if body.dry_run:
        return Status(
            200,
            {
                "checkpoint": source.number,
                "dry_run": True,
                "would_copy": {
                    "goal": run.goal,
                    "files": source.files,
                    "bytes_total": source.bytes_total,
                    "provider": run.provider,
                    "handoff": bool(source.handoff),
                },
            },
        )
    new = checkpoints.fork(
        run.pk, source.pk, actor=actor(request), created_by=request.user, note=body.note
    )
    return Status(201, out.run(new))


@router.post(
    "/runs/{run_id}/tokens",
    response={201: RunTokenOut},
    summary="Make a token for this run's agent: it acts for this run only and never decides",
)
def run_token(request, run_id: PathId):
    run = controlled_run(request, run_id)
    if not (run.is_external and run.is_live):
        raise Problem(409, "only a live run driven by an external agent takes an agent token")
    row, token = ApiToken.for_run(request.user, run)
    base = request.build_absolute_uri("/").rstrip("/")
    return Status(
        201,
        {
            "id": row.pk,
            "prefix": row.prefix,
            "run": run.pk,
            "scopes": row.scopes,
            "token": token,
            "command": connect_command(base, token, run.pk),
        },
    )
