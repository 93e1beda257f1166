"""Schedules, triggers and wake-ups (agents/schedules/cron.py, agents/schedules/triggers.py), as on the web and
with manage.py schedule_run / create_trigger / resume_run --at."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Annotated, Literal

from django.http import HttpResponse
from ninja import Router, Schema, Status
from pydantic import ConfigDict, Field

from agents import access, services
from agents.models.schedules import Schedule, Trigger
from agents.schedules import cron as schedules
from agents.schedules import triggers
from agents.schedules.triggers import url_for
from api import out
from api.auth import need
from api.common import actor, controlled_run
from api.errors import Problem
from api.schemas import PathId, RunOut

router = Router(tags=["schedules and triggers"])


class ScheduleIn(Schema):
    model_config = ConfigDict(extra="forbid")
    from_run: Annotated[int, Field(ge=1, le=2**53)]
    cron: Annotated[str, Field(min_length=1, max_length=200)]
    timezone: Annotated[str, Field(max_length=64)] = "UTC"
    overlap: Literal["skip", "queue"] = "skip"


class ScheduleOut(Schema):
    id: int
    template: int
    cron: str
    timezone: str
    overlap: str
    paused: bool
    next_at: datetime | None
    last_tick_at: datetime | None
    runs: list[int]
    created_at: datetime


class ScheduleList(Schema):
    items: list[ScheduleOut]


class TriggerIn(Schema):
    model_config = ConfigDict(extra="forbid")
    from_run: Annotated[int, Field(ge=1, le=2**53)]
    signed: bool = Field(False, description="also require an HMAC-SHA256 signature")
    goal: Annotated[str, Field(max_length=20_000)] = Field(
        "", description="the new runs' goal; {payload.path} is filled from the request's JSON"
    )


class TriggerOut(Schema):
    id: int
    template: int
    token_prefix: str
    signed: bool
    goal: str
    created_at: datetime
    revoked_at: datetime | None
    last_delivery_at: datetime | None


class TriggerMade(TriggerOut):
    url: str = Field(description="the webhook URL, with its token: shown this once")
    secret: str = Field(description="the signing secret (empty when not signed): shown this once")


class TriggerList(Schema):
    items: list[TriggerOut]


class WakeIn(Schema):
    model_config = ConfigDict(extra="forbid")
    at: datetime = Field(description="ISO 8601 with a time zone")


def _schedule(s: Schedule) -> dict:
    return {
        "id": s.pk,
        "template": s.template_id,
        "cron": s.cron,
        "timezone": s.timezone,
        "overlap": s.overlap,
        "paused": s.paused,
        "next_at": s.next_at,
        "last_tick_at": s.last_tick_at,
        "runs": sorted(r.pk for r in s.runs.all()),  # prefetched by the list: one query
        "created_at": s.created_at,
    }


def _trigger(t: Trigger) -> dict:
    return {
        "id": t.pk,
        "template": t.template_id,
        "token_prefix": t.token_prefix,
        "signed": bool(t.secret),
        "goal": t.goal,
        "created_at": t.created_at,
        "revoked_at": t.revoked_at,
        "last_delivery_at": t.last_delivery_at,
    }


def _seen_schedule(request, schedule_id: int, *, control: bool = False) -> Schedule:
    need(request, "write" if control else "read")
    found = access.visible_schedules(request.user).filter(pk=schedule_id).first()
    if found is None:
        raise Problem(404, f"no schedule with id {schedule_id}")
    if control:
        controlled_run(request, found.template_id)
    return found


@router.get("/schedules", response=ScheduleList, summary="Schedules")
def list_schedules(request):
    need(request, "read")
    rows = access.visible_schedules(request.user).prefetch_related("runs").order_by("pk")
    return {"items": [_schedule(s) for s in rows]}


@router.post("/schedules", response={201: ScheduleOut}, summary="Schedule a run's template")
def create_schedule(request, body: ScheduleIn):
    template = controlled_run(request, body.from_run)
    made = schedules.create(
        template,
        body.cron,
        tz=body.timezone,
        overlap=body.overlap,
        created_by=request.user,
        actor=actor(request),
    )
    return Status(201, _schedule(made))


@router.get("/schedules/{schedule_id}", response=ScheduleOut, summary="One schedule")
def get_schedule(request, schedule_id: PathId):
    return _schedule(_seen_schedule(request, schedule_id))


@router.post("/schedules/{schedule_id}/{action}", response=ScheduleOut, summary="Pause or resume")
def schedule_action(request, schedule_id: PathId, action: Literal["pause", "resume"]):
    _seen_schedule(request, schedule_id, control=True)
    act = schedules.pause if action == "pause" else schedules.resume
    return _schedule(act(schedule_id, actor=actor(request)))


@router.delete("/schedules/{schedule_id}", response={204: None}, summary="Delete a schedule")
def delete_schedule(request, schedule_id: PathId):
    _seen_schedule(request, schedule_id, control=True)
    schedules.delete(schedule_id)
    return HttpResponse(status=204)


@router.get("/triggers", response=TriggerList, summary="Triggers")
def list_triggers(request):
    need(request, "read")
    return {"items": [_trigger(t) for t in access.visible_triggers(request.user).order_by("pk")]}


@router.post("/triggers", response={201: TriggerMade}, summary="A webhook that starts runs")
def create_trigger(request, body: TriggerIn):
    template = controlled_run(request, body.from_run)
    secret = secrets.token_urlsafe(32) if body.signed else ""
    made, token = triggers.create(template, secret=secret, goal=body.goal, created_by=request.user)
    response = {**_trigger(made), "url": url_for(request, token), "secret": secret}
    return Status(201, response)


@router.delete("/triggers/{trigger_id}", response=TriggerOut, summary="Revoke a trigger")
def revoke_trigger(request, trigger_id: PathId):
    need(request, "write")
    found = access.visible_triggers(request.user).filter(pk=trigger_id).first()
    if found is None:
        raise Problem(404, f"no trigger with id {trigger_id}")
    controlled_run(request, found.template_id)
    return _trigger(triggers.revoke(trigger_id))


@router.put("/runs/{run_id}/wake", response=RunOut, summary="Resume a paused run at a time")
def wake(request, run_id: PathId, body: WakeIn):
    controlled_run(request, run_id)
    return out.run(services.wake_at(run_id, body.at, actor=actor(request)))


@router.delete("/runs/{run_id}/wake", response=RunOut, summary="Cancel a run's wake-up")
def cancel_wake(request, run_id: PathId):
    controlled_run(request, run_id)
    return out.run(services.cancel_wake(run_id, actor=actor(request)))
