"""The tool ledger: an operator's outside record of every tool execution.

With SHIFTLOG_TOOL_LEDGER set to a file (outside every workspace), each call of a tool with
effects outside the database (the workspace tools: bash, file writes, ...) appends one line,
`RUN TOOL_USE_ID TOOL`, just before the tool runs. The agent cannot reach the file, and a line is
written whether or not the result is ever recorded, so the ledger shows what the event log cannot:
a tool that ran twice. Harness tools (handoff, finish, memory) change only the database, in the
transaction that records them, so a retry of one is not a second effect and is not listed.
bench/chaos.py counts on it; nothing else reads it.
"""

from __future__ import annotations

import os

from django.conf import settings


def record(run_id: int, tool_use_id: str, tool: str) -> None:
    path = settings.SHIFTLOG.get("TOOL_LEDGER")
    if not path:
        return
    line = f"{run_id} {tool_use_id} {tool}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write of an O_APPEND file: whole lines, never interleaved
    finally:
        os.close(fd)
