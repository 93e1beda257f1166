"""What a run knows: its sessions with what each knew at wake-up, and its memory (the run's and
its project's), read and changed as on the run page and with manage.py memory / remember / forget
(agents/memory.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Query, Router, Schema
from pydantic import ConfigDict, Field

from agents import memory
from agents.models import Session
from api.common import actor, controlled_run, seen_run
from api.schemas import PathId

router = Router(tags=["memory and sessions"])

Key = Annotated[str, Field(min_length=1, max_length=100)]


class SessionOut(Schema):
    index: int
    status: str
    end_reason: str
    started_at: datetime
    ended_at: datetime | None
    turns: int
    input_tokens: int
    output_tokens: int
    cost_usd: str
    handoff: dict[str, Any] | None
    wake_up: dict[str, Any] | None = Field(
        description="what the session's first message was built from, part by part, each with "
        "its text and (estimated) tokens"
    )


class SessionList(Schema):
    items: list[SessionOut]


class EntryOut(Schema):
    scope: Literal["run", "project"]
    key: str
    text: str
    pinned: bool
    uses: int
    by: str


class MemoryOut(Schema):
    project: str
    items: list[EntryOut]


class EntryIn(Schema):
    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, Field(min_length=1, max_length=20_000)] | None = None
    pinned: bool | None = None
    scope: Literal["run", "project"] = "run"


class Scope(Schema):
    scope: Literal["run", "project"] = "run"


@router.get("/runs/{run_id}/sessions", response=SessionList, summary="Sessions and wake-ups")
def sessions(request, run_id: PathId):
    run = seen_run(request, run_id)
    rows = Session.objects.filter(run=run).order_by("index")
    return {
        "items": [
            {
                "index": s.index,
                "status": s.status,
                "end_reason": s.end_reason,
                "started_at": s.started_at,
                "ended_at": s.ended_at,
                "turns": s.turns,
                "input_tokens": s.input_tokens,
                "output_tokens": s.output_tokens,
                "cost_usd": str(s.cost_usd),
                "handoff": s.handoff,
                "wake_up": s.wake_up,
            }
            for s in rows
        ]
    }


def _memory(run) -> dict:
    return {
        "project": run.project,
        "items": [e.as_json() for e in memory.ranked(memory.entries(run))],
    }


@router.get("/runs/{run_id}/memory", response=MemoryOut, summary="The run's memory")
def read_memory(request, run_id: PathId):
    return _memory(seen_run(request, run_id))


@router.put(
    "/runs/{run_id}/memory/{key}",
    response=MemoryOut,
    summary="Add or change an entry (its text, its pin), of the run's memory or its project's",
)
def write_entry(request, run_id: PathId, key: Key, body: EntryIn):
    run = controlled_run(request, run_id)
    memory.set_entry(
        run.pk, key, actor=actor(request), text=body.text, pinned=body.pinned, scope=body.scope
    )
    return _memory(run)


@router.delete("/runs/{run_id}/memory/{key}", response=MemoryOut, summary="Forget an entry")
def delete_entry(request, run_id: PathId, key: Key, where: Query[Scope]):
    run = controlled_run(request, run_id)
    memory.delete_entry(run.pk, key, actor=actor(request), scope=where.scope)
    return _memory(run)


@router.post(
    "/runs/{run_id}/memory/{key}/promote",
    response=MemoryOut,
    summary="Promote a run's entry to its project's memory",
)
def promote(request, run_id: PathId, key: Key):
    run = controlled_run(request, run_id)
    memory.promote(run.pk, key, actor=actor(request))
    return _memory(run)
