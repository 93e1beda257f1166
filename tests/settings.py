"""Test settings: the real settings, with the queue in memory for in-process tests.

Tests that need a real worker start `run_huey` processes with their own SqliteHuey file (see
tests/procs.py); everything else drives runs directly with the runtime.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Not under /tmp: bubblewrap gives every command a private /tmp, which would hide a data folder
# there by accident, and a containment test with such a data folder would prove nothing.
_tmp = tempfile.mkdtemp(
    prefix="shiftlog-test-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None
)
os.environ.setdefault("SHIFTLOG_DATA_DIR", _tmp)
# An event whose payload its kind's model does not accept fails the test that writes it (and the
# processes the tests start, which inherit this); a served product logs it and keeps the event.
os.environ.setdefault("SHIFTLOG_STRICT_EVENTS", "1")
# /var/tmp is not emptied at boot as /tmp may be: remove the folder when the tests end.
atexit.register(shutil.rmtree, _tmp, ignore_errors=True)

from shiftlog.settings import *  # noqa: E402,F403
from shiftlog.settings import HUEY  # noqa: E402

HUEY = {**HUEY, "huey_class": "huey.MemoryHuey", "immediate": False}
# The in-process tests run inside one transaction that a second thread's connection cannot see:
# the session-end checks run inline here. Real workers (tests/procs.py) defer them, and
# tests/test_deferred_checks.py turns it on with transactional tests.
SHIFTLOG = {**SHIFTLOG, "DEMO_TURN_DELAY_SECONDS": 0.0, "DEFER_SESSION_CHECKS": False}  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The plain storage: no test needs `collectstatic` (tests/test_operators.py runs it where the
# hashed names are the point).
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
