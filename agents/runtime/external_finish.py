"""An external agent's `finish`: the harness runs the checks itself, in a worker (the
`external_finish` task), never in the web request that asked (a check run may outlast any
proxy's timeout); the agent long-polls the verdict."""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import Any

from agents import eventlog, jobs, sandbox
from agents.models import (
    Event,
    EventKind,
    ExternalCall,
    ExternalCallDecision,
    PauseCause,
    Run,
    RunStatus,
)
from agents.runtime.calls import call_event
from agents.runtime.external import ExternalError, _driving, _external, status_of
from agents.runtime.loop import DISK_FULL
from agents.runtime.slice import SliceOver

# How soon a finish whose run was busy (another call of its agent held the lease) tries again.
FINISH_RETRY_SECONDS = 0.5


def finish(run_id: int, *, actor: str, agent: str = "agent", summary: Any) -> dict[str, Any]:
    """The agent says it is done: the harness runs the checks itself, in its sandbox, on the
    workspace last uploaded, in a worker (`run_finish`): the answer comes at once (202), and the
    verdict from `finish_verdict` (a long poll). Only passing checks make the run succeed. Asked
    again while its checks run, the same finish answers."""
    try:
        summary = sandbox.validate_input("finish", {"summary": summary})["summary"]
    except sandbox.ToolInputError as e:
        raise ExternalError(str(e), 422) from None
    _external(run_id)
    pending = ExternalCall.objects.filter(
        run_id=run_id, tool="finish", result_seq__isnull=True
    ).first()
    if pending is None:
        block = {"id": f"ext_{uuid.uuid4().hex}", "name": "finish", "input": {"summary": summary}}
        with _driving(run_id, actor, agent, knows_rewinds=True) as h:
            h.s.append(call_event(h.s, block))
            pending = ExternalCall.objects.create(
                run_id=run_id,
                tool_use_id=block["id"],
                tool="finish",
                input=block["input"],
                decision=ExternalCallDecision.ALLOW,
                reason="the harness runs the checks",
                called_seq=h.s.known_seq,
            )
    jobs.later(
        "external_finish", run_id=run_id, call_id=pending.tool_use_id, actor=actor, agent=agent
    )
    return {"id": pending.tool_use_id, "state": "checking", "run_status": status_of(run_id)}


def run_finish(*, run_id: int, call_id: str, actor: str, agent: str) -> bool:
    """The checks of a finish, in a worker, under the run's lease (True when it is over; a run
    busy with another call of its agent is tried again shortly)."""
    call = ExternalCall.objects.filter(run_id=run_id, tool_use_id=call_id).first()
    if call is None or call.result_seq is not None:
        return True
    block = {"id": call.tool_use_id, "name": "finish", "input": call.input}
    try:
        with _driving(run_id, actor, agent, knows_rewinds=True) as h:
            call.refresh_from_db()
            if call.result_seq is not None:
                return True
            try:
                with suppress(SliceOver):
                    h.finish.finish(block)
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                # As for the harness's own runs (agents/runtime/loop.py): the run waits for
                # room; the agent is told, and calls finish again once it is resumed.
                reason = f"the disk is full: {e.strerror}; resume the run once there is room"
                h.s.transition(
                    RunStatus.PAUSED,
                    reason=reason,
                    expect={RunStatus.VERIFYING, RunStatus.RUNNING},
                    cause=PauseCause.DISK_FULL,
                )
                raise ExternalError(f"run {run_id} is paused: {reason}") from e
    except ExternalError as e:
        if "busy" in str(e):
            jobs.schedule(
                "external_finish",
                delay=FINISH_RETRY_SECONDS,
                run_id=run_id,
                call_id=call_id,
                actor=actor,
                agent=agent,
            )
            return False
        if (told := _told(run_id, call)) is not None:
            # The checks ran and the finish was answered, then the run moved (a person paused it
            # as they passed): the answer stands, and the resume completes the success.
            ExternalCall.objects.filter(pk=call.pk).update(result_seq=told)
            return True
        # Paused, cancelled, another agent: the finish is over without checks; it says why.
        event = eventlog.append(
            run_id,
            EventKind.TOOL_RESULT,
            {
                "tool_use_id": call_id,
                "name": "finish",
                "output": f"The checks did not run: {e}",
                "is_error": True,
                "data": {},
            },
            actor=f"external:{actor}:{agent}",
        )
        ExternalCall.objects.filter(pk=call.pk).update(result_seq=event.seq)
        return True
    told = _told(run_id, call)
    ExternalCall.objects.filter(pk=call.pk).update(
        result_seq=told or Run.objects.filter(pk=run_id).values_list("last_seq", flat=True)[0]
    )
    return True


def _told(run_id: int, call: ExternalCall) -> int | None:
    """The seq of the finish's answer (its tool.result), if it has one."""
    return (
        Event.objects.filter(
            run_id=run_id, seq__gt=call.called_seq or 0, kind=EventKind.TOOL_RESULT
        )
        .filter(payload__tool_use_id=call.tool_use_id)
        .values_list("seq", flat=True)
        .first()
    )


def finish_verdict(run_id: int, call_id: str) -> dict[str, Any]:
    """Where a finish stands: checking, or done with the checks' results and the run's status."""
    call = ExternalCall.objects.filter(run_id=run_id, tool_use_id=str(call_id)[:100]).first()
    if call is None or call.tool != "finish":
        raise ExternalError(f"run {run_id} has no finish {str(call_id)[:100]}", 404)
    status = status_of(run_id)
    if call.result_seq is None:
        return {
            "id": call.tool_use_id,
            "state": "checking",
            "passed": False,
            "run_status": status,
            "checks": [],
            "summary": "",
        }
    rows = Event.objects.filter(
        run_id=run_id, seq__gt=call.called_seq or 0, seq__lte=call.result_seq
    ).order_by("seq")
    checks = [
        {k: e.payload.get(k) for k in ("command", "passed", "exit_code", "output", "timed_out")}
        for e in rows
        if e.kind == EventKind.CHECK_RESULT
    ]
    told = next(
        (
            e.payload
            for e in rows
            if e.kind == EventKind.TOOL_RESULT and e.payload.get("tool_use_id") == call_id
        ),
        {},
    )
    return {
        "id": call.tool_use_id,
        "state": "done",
        "passed": status == RunStatus.SUCCEEDED,
        "run_status": status,
        "checks": checks,
        "summary": told.get("output", ""),
    }
