"""Test settings: the real settings, with the queue in memory for in-process tests.

Tests that need a real worker start `run_huey` processes with their own SqliteHuey file (see
tests/procs.py); everything else drives runs directly with the runtime.
"""

from __future__ import annotations

import os
import tempfile

_tmp = tempfile.mkdtemp(prefix="shiftlog-test-")
os.environ.setdefault("SHIFTLOG_DATA_DIR", _tmp)

from dashboard.settings import *  # noqa: E402,F403
from dashboard.settings import HUEY  # noqa: E402

HUEY = {**HUEY, "huey_class": "huey.MemoryHuey", "immediate": False}
SHIFTLOG = {**SHIFTLOG, "DEMO_TURN_DELAY_SECONDS": 0.0}  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
