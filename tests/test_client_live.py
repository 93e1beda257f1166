"""The Python client (clients/python) against a real `manage.py serve`: the client's own live
tests (clients/python/tests/test_client_live.py), run in a pytest of their own with
SHIFTLOG_TEST_URL and SHIFTLOG_TEST_TOKEN pointing at the server, a token made with
`manage.py create_token`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import serving
from tests.helpers import user_with
from tests.procs import BASE_DIR, Procs, dying_with_us

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CLIENT = BASE_DIR / "clients" / "python"


def issue_token(tmp_path, user: str, scopes: str = "read,write,decide") -> str:
    out = Procs(tmp_path).manage("create_token", "--user", user, "--scopes", scopes)
    return out.strip().splitlines()[-1]


def test_the_clients_live_tests_pass_against_a_real_server(tmp_path):
    user_with("agent", "decide_approval")
    token = issue_token(tmp_path, "agent")
    assert token.startswith("shl_")
    with serving(tmp_path) as base:
        env = {
            **os.environ,
            "SHIFTLOG_TEST_URL": base,
            "SHIFTLOG_TEST_TOKEN": token,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:django", "-p", "no:cacheprovider"]
        argv += ["--basetemp", str(tmp_path / "client-tests"), "tests/test_client_live.py"]
        done = subprocess.run(
            dying_with_us(argv),
            cwd=CLIENT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "skipped" not in report.splitlines()[-1], report
    assert " passed" in report.splitlines()[-1], report
