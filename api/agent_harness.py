"""External agents: the harness calls of a process outside Shiftlog (agents/runtime/external.py)."""

from __future__ import annotations

import tempfile
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from ninja import Query, Router, Status

from agents import isolation, wakeups
from agents.fleets import external as fleet_external
from agents.models import ExternalCall
from agents.providers.base import Usage
from agents.runtime import external, external_finish
from api.auth import need
from api.common import actor, controlled_run, runs_seen
from api.errors import Problem
from api.schemas import (
    ContextOut,
    FinishIn,
    FinishOut,
    FinishQueuedOut,
    HandoffIn,
    MergeIn,
    MergeOut,
    PathId,
    ResultIn,
    ResultOut,
    SpawnIn,
    SpawnOut,
    StatusOut,
    ToolCallIn,
    ToolCallOut,
    TurnIn,
    TurnOut,
    UploadOut,
)

router = Router(tags=["external agents"])


MAX_WAIT_SECONDS = 60


def agent(request) -> str:
    """The calling agent's stable id: its Shiftlog-Agent header, else its token's."""
    try:
        return external.agent_id(
            request.headers.get("Shiftlog-Agent"), getattr(request.auth, "pk", None)
        )
    except external.ExternalError as e:
        raise Problem(e.status, str(e)) from None


@router.get("/runs/{run_id}/context", response=ContextOut, summary="What a session starts from")
def context(request, run_id: PathId):
    controlled_run(request, run_id)
    return external.context(run_id, actor=actor(request), agent=agent(request))


@router.post("/runs/{run_id}/heartbeat", response=StatusOut, summary="The agent is alive")
def heartbeat(request, run_id: PathId):
    controlled_run(request, run_id)
    return {
        "run_status": external.heartbeat(run_id, agent(request)),
        "rewound": external.rewound(run_id),
    }


@router.post("/runs/{run_id}/turns", response={201: TurnOut}, summary="A model turn and its usage")
def turn(request, run_id: PathId, body: TurnIn):
    controlled_run(request, run_id)
    usage = Usage(
        input_tokens=body.input_tokens,
        output_tokens=body.output_tokens,
        cache_read_input_tokens=body.cache_read_tokens,
        cache_creation_input_tokens=body.cache_write_tokens,
    )
    return Status(
        201,
        external.turn(
            run_id,
            actor=actor(request),
            agent=agent(request),
            text=body.text,
            model=body.model,
            usage=usage,
        ),
    )


@router.post(
    "/runs/{run_id}/tool-calls",
    response={201: ToolCallOut},
    summary="Ask before running a tool: allow, ask (an approval waits) or deny",
)
def propose(request, run_id: PathId, body: ToolCallIn):
    controlled_run(request, run_id)
    decided = external.propose(
        run_id,
        actor=actor(request),
        agent=agent(request),
        tool=body.tool,
        tool_input=body.input,
        call_id=body.call_id,
        root=body.root,
    )
    return Status(201, decided)


def _own_calls(request):
    return runs_seen(request).values("pk")


@router.get(
    "/tool-calls/{call_id}",
    response=ToolCallOut,
    summary="A tool call's decision; with ?wait=S, waits up to S seconds for a person",
)
async def poll(request, call_id: str, wait: float = Query(0, ge=0, le=MAX_WAIT_SECONDS)):
    if len(call_id) > 100:
        raise Problem(404, f"no tool call {call_id[:100]}")
    run_id, who = await sync_to_async(_checked_call_run)(request, call_id)
    who_agent = await sync_to_async(agent)(request)
    deadline = time.monotonic() + min(wait, settings.SHIFTLOG["API_MAX_WAIT_SECONDS"])
    began: list[str] = []

    def read():
        return sync_to_async(_decision)(request, call_id, who, who_agent)

    def done(answer: dict) -> bool:
        began[:] = began or [answer["run_status"]]
        # Decided, or the run paused, cancelled or rewound meanwhile: the agent hears at once.
        return (
            answer["decision"] != "pending"
            or answer["run_status"] != began[0]
            or bool(answer.get("rewound"))
        )

    # Woken by the run's next committed event (agents.wakeups), not by polling.
    return await wakeups.long_poll(run_id, read, done, deadline)


def _decision(request, call_id: str, who: str, who_agent: str) -> dict:
    return external.decision(call_id, run_ids=_own_calls(request), actor=who, agent=who_agent)


def _checked_call(request, call_id: str) -> str:
    return _checked_call_run(request, call_id)[1]


def _checked_call_run(request, call_id: str) -> tuple[int, str]:
    call = ExternalCall.objects.filter(tool_use_id=call_id).values_list("run_id", flat=True).first()
    if call is None:
        raise Problem(404, f"no tool call {call_id}")
    controlled_run(request, call)
    return call, actor(request)


@router.post("/tool-calls/{call_id}/result", response={201: ResultOut}, summary="What the tool did")
def result(request, call_id: str, body: ResultIn):
    if len(call_id) > 100:
        raise Problem(404, f"no tool call {call_id[:100]}")
    _checked_call(request, call_id)
    done = external.result(
        call_id,
        run_ids=_own_calls(request),
        actor=actor(request),
        agent=agent(request),
        output=body.output,
        is_error=body.is_error,
    )
    return Status(201, done)


@router.post(
    "/tool-calls/{call_id}/withdraw",
    response=ToolCallOut,
    summary="Take a call back before it runs: its approval leaves the inbox, marked withdrawn",
)
def withdraw(request, call_id: str):
    if len(call_id) > 100:
        raise Problem(404, f"no tool call {call_id[:100]}")
    _checked_call(request, call_id)
    return external.withdraw(
        call_id, run_ids=_own_calls(request), actor=actor(request), agent=agent(request)
    )


@router.post(
    "/runs/{run_id}/spawn",
    response={201: SpawnOut},
    summary="Start child runs from the workspace; the run waits for them (a fleet)",
)
def spawn(request, run_id: PathId, body: SpawnIn):
    controlled_run(request, run_id)
    need(request, "write")
    tool_input = body.dict(by_alias=True, exclude={"call_id"})
    tool_input["children"] = [
        {k: v for k, v in c.items() if v is not None} for c in tool_input["children"]
    ]
    return Status(
        201,
        fleet_external.spawn(
            run_id,
            actor=actor(request),
            agent=agent(request),
            call_id=body.call_id,
            tool_input=tool_input,
        ),
    )


@router.post(
    "/runs/{run_id}/merge-children",
    response=MergeOut,
    summary="Three-way merge the succeeded children's work into the run's workspace",
)
def merge_children(request, run_id: PathId, body: MergeIn):
    controlled_run(request, run_id)
    need(request, "write")
    return fleet_external.merge(run_id, actor=actor(request), agent=agent(request), runs=body.runs)


@router.put(
    "/runs/{run_id}/workspace",
    response={201: UploadOut},
    summary="Upload the agent's workspace (.tar.gz): it becomes the run's, and a checkpoint",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "a .tar.gz of the workspace (sent as application/gzip or "
            "application/octet-stream)",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
def upload(request, run_id: PathId):
    # Under daphne a body over this cap is refused as it arrives (dashboard/body_limits.py).
    run = controlled_run(request, run_id)
    cap = isolation.upload_cap(run)
    run_cap = isolation.workspace_cap(run)
    too_large = Problem(
        413,
        f"the archive is over {cap / 2**20:.3g} MB (an upload is at most "
        f"{settings.SHIFTLOG['API_MAX_UPLOAD_MB']} MB"
        + (f"; the run's workspace cap is {run_cap / 2**20:g} MB)" if run_cap else ")"),
    )
    length = request.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > cap:
        raise too_large
    with tempfile.TemporaryFile() as spool:
        size = 0
        while chunk := request.read(1024 * 1024):
            size += len(chunk)
            if size > cap:
                raise too_large
            spool.write(chunk)
        if not size:
            raise Problem(422, "the body must be a .tar.gz of the workspace")
        spool.seek(0)
        return Status(
            201,
            external.upload_workspace(
                run_id, actor=actor(request), agent=agent(request), archive=spool
            ),
        )


@router.post(
    "/runs/{run_id}/handoff",
    response=ContextOut,
    summary="End the session with a handoff; the next starts from goal + handoff",
)
def handoff(request, run_id: PathId, body: HandoffIn):
    controlled_run(request, run_id)
    return external.hand_off(
        run_id, actor=actor(request), agent=agent(request), handoff=body.dict()
    )


@router.post(
    "/runs/{run_id}/finish",
    response={202: FinishQueuedOut},
    summary="The agent says it is done: the harness runs the checks itself (in a worker; "
    "GET /runs/ID/finish/FINISH_ID?wait=S for the verdict)",
)
def finish(request, run_id: PathId, body: FinishIn):
    controlled_run(request, run_id)
    return Status(
        202,
        external_finish.finish(
            run_id, actor=actor(request), agent=agent(request), summary=body.summary
        ),
    )


@router.get(
    "/runs/{run_id}/finish/{finish_id}",
    response=FinishOut,
    summary="A finish's verdict; with ?wait=S, waits up to S seconds for the checks",
)
async def finish_verdict(
    request, run_id: PathId, finish_id: str, wait: float = Query(0, ge=0, le=MAX_WAIT_SECONDS)
):
    await sync_to_async(controlled_run)(request, run_id)
    deadline = time.monotonic() + min(wait, settings.SHIFTLOG["API_MAX_WAIT_SECONDS"])
    return await wakeups.long_poll(
        run_id,
        lambda: sync_to_async(external_finish.finish_verdict)(run_id, finish_id),
        lambda answer: answer["state"] == "done",
        deadline,
    )
