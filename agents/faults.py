"""Fault points for the recovery tests: a worker started with SHIFTLOG_FAULTS=NAME[,NAME...]
kills itself (SIGKILL, as `kill -9` would) when it reaches a point of that name. Unset (always,
outside those tests) a point costs one environment lookup."""

from __future__ import annotations

import os
import signal


def point(name: str) -> None:
    if name in os.environ.get("SHIFTLOG_FAULTS", "").split(","):
        os.kill(os.getpid(), signal.SIGKILL)
