"""An external agent's fleet calls through the API (`spawn_runs`, `merge_children`), each done
as a worker does it: under the run's lease, through the fleet's parent part (`Fleet`)."""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import Any

from agents import sandbox
from agents.fleets.parent import Fleet
from agents.fleets.spawn import SpawnError
from agents.models import Event, EventKind, FleetChild
from agents.runtime.calls import call_event
from agents.runtime.external import ExternalError, _driving, status_of
from agents.runtime.slice import SliceOver


def spawn(
    run_id: int, *, actor: str, agent: str = "agent", call_id: str, tool_input: Any
) -> dict[str, Any]:
    """The agent's spawn_runs: children started from its latest upload (a checkpoint first), the
    run waiting for them. Asked again with the same call_id, the same children come back."""
    try:
        tool_input = sandbox.validate_input("spawn_runs", tool_input)
    except sandbox.ToolInputError as e:
        raise ExternalError(str(e), 422) from None
    done = FleetChild.objects.filter(parent_id=run_id, tool_use_id=call_id)
    if not done.exists():
        with _driving(run_id, actor, agent) as h:
            try:
                Fleet(h.s, h.gate).start_children(call_id, tool_input)
            except SpawnError as e:
                raise ExternalError(f"spawn_runs: {e}", 422) from None
    return {
        "children": list(done.order_by("index").values_list("child_id", flat=True)),
        "run_status": status_of(run_id),
    }


def merge(
    run_id: int, *, actor: str, agent: str = "agent", runs: list[int] | None
) -> dict[str, Any]:
    """The agent's merge_children, done as Shiftlog's own agent's is (a tool.call, the merge with
    a checkpoint before and after, its result); the merged workspace is the run's latest
    checkpoint, for the agent to download. A conflict a person decides leaves the run awaiting
    approval; the decision is applied at the agent's next call."""
    tool_input = {} if runs is None else {"runs": runs}
    block = {"id": f"ext_merge_{uuid.uuid4().hex[:16]}", "name": "merge_children"}
    with _driving(run_id, actor, agent) as h:
        called = h.s.append(call_event(h.s, block, tool_input)).events[0].seq
        with suppress(SliceOver):  # a person decides a conflict: the run waits
            Fleet(h.s, h.gate).merge(block, tool_input)
    after = Event.objects.filter(run_id=run_id, seq__gt=called)
    result = after.filter(kind=EventKind.TOOL_RESULT, payload__tool_use_id=block["id"])
    return {
        "output": result.values_list("payload", flat=True).first()["output"],
        "merges": list(
            after.filter(kind=EventKind.FLEET_MERGE)
            .order_by("seq")
            .values_list("payload", flat=True)
        ),
        "run_status": status_of(run_id),
    }
