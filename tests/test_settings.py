from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dashboard.settings import ImproperlyConfigured, env_bool, env_number


def test_env_helpers_fail_loudly_on_bad_values(monkeypatch):
    monkeypatch.setenv("X_NUM", "ten")
    with pytest.raises(ImproperlyConfigured, match="X_NUM must be a number"):
        env_number("X_NUM", 1)
    monkeypatch.setenv("X_NUM", "-3")
    with pytest.raises(ImproperlyConfigured, match="must not be negative"):
        env_number("X_NUM", 1)
    monkeypatch.setenv("X_BOOL", "maybe")
    with pytest.raises(ImproperlyConfigured, match="X_BOOL must be true or false"):
        env_bool("X_BOOL", False)
    monkeypatch.setenv("X_BOOL", "yes")
    assert env_bool("X_BOOL", False) is True
    monkeypatch.delenv("X_NUM")
    assert env_number("X_NUM", 7) == 7


def _check(env_overrides: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
    }
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_bad_setting_stops_start_up_naming_the_variable(tmp_path):
    proc = _check({"SHIFTLOG_LEASE_SECONDS": "soon"}, tmp_path)
    assert proc.returncode != 0
    assert "SHIFTLOG_LEASE_SECONDS must be a number" in proc.stderr


def test_database_url_must_be_postgres(tmp_path):
    proc = _check({"DATABASE_URL": "mysql://x@localhost/db"}, tmp_path)
    assert proc.returncode != 0
    assert "DATABASE_URL must be a postgres://" in proc.stderr


def test_the_embedded_defaults_are_sqlite_wal_immediate_and_a_separate_huey_file(settings):
    db = settings.DATABASES["default"]
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
    from dashboard import settings as real

    assert real.HUEY["huey_class"] == "agents.queue.SqliteHuey"
    assert real.HUEY["filename"] != db["NAME"]
    assert real.HUEY["immediate"] is False
    assert real.HUEY["consumer"]["graceful_signal"] == "TERM"
