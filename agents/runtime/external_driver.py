"""The one agent driving an external run (agents/runtime/external.py): its stable id, the
folder it declares, and the rewinds it has not been told of yet."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from agents.models import Event, EventKind, ExternalDriver, Run

# An agent's id: what it calls itself (the Shiftlog-Agent header), else its token's.
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,99}")


class ExternalError(ValueError):
    """The call cannot be done; `status` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class RewoundError(ExternalError):
    """The agent acts on what a person's rewind undid: it must read its context again (and
    restore its folder from the checkpoint) first. `rewound` says which rewind."""

    def __init__(self, rewind: dict[str, Any]) -> None:
        super().__init__(rewind_reason(rewind), 409)
        self.rewound = rewind


def _drive_as(run: Run, agent: str, now) -> None:
    driver, _ = ExternalDriver.objects.get_or_create(
        run_id=run.pk, defaults={"agent": agent, "seen_branch_seq": run.branch_seq}
    )
    if driver.agent == agent:
        return
    silent = run.silent_seconds(now)
    if silent <= run.heartbeat_window or not ExternalDriver.objects.filter(
        run_id=run.pk, agent=driver.agent
    ).update(agent=agent, since=now):
        raise ExternalError(
            f"run {run.pk} is driven by agent {driver.agent!r} (its last call {silent:.0f} s "
            f"ago): one agent drives a run at a time; it is free once that agent has been "
            f"silent for {run.heartbeat_window} s"
        )


def agent_id(header: str | None, token_id: Any) -> str:
    """The agent's stable id in the log: the Shiftlog-Agent header, else its token's."""
    if header:
        if not AGENT_ID.fullmatch(header):
            raise ExternalError(
                "the Shiftlog-Agent header must be 1 to 100 letters, digits or ._:@+- "
                "(starting with a letter or digit)",
                422,
            )
        return header
    return f"token-{token_id}" if token_id is not None else "agent"


def valid_root(root: Any) -> str | None:
    """The agent's folder as it sees it: an absolute, normal path other than /."""
    if root in (None, ""):
        return None
    if (
        not isinstance(root, str)
        or not root.startswith("/")
        or "\0" in root
        or len(root) > 1000
        or posixpath.normpath(root) != root.rstrip("/")
        or root.rstrip("/") == ""
    ):
        raise ExternalError(
            "root must be the agent's folder as an absolute, normal path (not /)", 422
        )
    return root.rstrip("/")


def rewound(run_id: int) -> dict[str, Any] | None:
    """A rewind its agent has not been told of yet (it reads its context again to take it in):
    the checkpoint's number, who rewound it, and their note."""
    run = Run.objects.filter(pk=run_id).values("branch_seq").first()
    seen = (
        ExternalDriver.objects.filter(run_id=run_id).values_list("seen_branch_seq", flat=True)
    ).first()
    if run is None or seen is None or run["branch_seq"] <= seen:
        return None
    event = Event.objects.filter(
        run_id=run_id, seq=run["branch_seq"], kind=EventKind.RUN_REWOUND
    ).first()
    if event is None:
        return None
    return {
        "checkpoint": event.payload.get("number"),
        "by": event.actor,
        "note": event.payload.get("note", ""),
    }


def rewind_reason(rewind: dict[str, Any]) -> str:
    note = f" ({rewind['note']})" if rewind.get("note") else ""
    return (
        f"the run was rewound to checkpoint {rewind['checkpoint']} by {rewind['by']}{note}: "
        "what was done since is undone. Restore the workspace from that checkpoint and read "
        "the run's context again before going on"
    )
