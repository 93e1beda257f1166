from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shiftlog.settings import ImproperlyConfigured, env_bool, env_number

# Settings are read from the environment of fresh processes: nothing here for the
# PostgreSQL + Redis pass to repeat.
pytestmark = pytest.mark.no_services


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
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
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


def test_database_url_and_redis_url_switch_database_queue_channel_layer_and_live_push(tmp_path):
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.DATABASES['default']['ENGINE'], s.DATABASES['default']['NAME'], "
        "s.HUEY['huey_class'], s.HUEY['url'], s.CHANNEL_LAYERS['default']['BACKEND'], s.CHANNEL_LAYERS['hub']['BACKEND'], "
        "s.SHIFTLOG['LIVE_PUSH']]))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
        "DATABASE_URL": "postgres://someone@db.example:5433/shiftlog",
        "REDIS_URL": "redis://cache.example:6380/2",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        "django.db.backends.postgresql",
        "shiftlog",
        "agents.worker.RedisHuey",
        "redis://cache.example:6380/2",
        "channels.layers.InMemoryChannelLayer",  # this process's sockets
        "channels_redis.core.RedisChannelLayer",  # between processes
        True,
    ]


def test_the_embedded_defaults_are_sqlite_wal_immediate_and_a_separate_huey_file(settings):
    db = settings.DATABASES["default"]
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
    from shiftlog import settings as real

    assert real.HUEY["huey_class"] == "agents.worker.SqliteHuey"
    assert real.HUEY["filename"] != db["NAME"]
    assert real.HUEY["immediate"] is False
    assert real.HUEY["consumer"]["graceful_signal"] == "TERM"
    assert real.SHIFTLOG["LIVE_PUSH"] is False  # each web process tails the log instead


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('[{"tool": "bash", "action": "sure"}]', "rule 1: action must be one of"),
        ('{"tool": "bash", "action": "deny"}', "a tool policy is a list of rules"),
        ("[{tool: bash}]", "Expecting property name"),
    ],
)
def test_a_bad_global_tool_policy_stops_start_up_saying_what_is_wrong(tmp_path, value, message):
    proc = _check({"SHIFTLOG_TOOL_POLICY": value}, tmp_path)
    assert proc.returncode != 0
    assert f"SHIFTLOG_TOOL_POLICY: {message}" in proc.stderr


def test_the_people_in_the_loop_settings_are_read_from_the_environment(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
        "SHIFTLOG_WEBHOOK_URLS": "http://a.example/hook,https://b.example/hook",
        "SHIFTLOG_TOOL_POLICY": '[{"tool": "bash", "pattern": "^git push", "action": "deny"}]',
        "SHIFTLOG_APPROVAL_TIMEOUT": "90",
    }
    keys = ["WEBHOOK_URLS", "TOOL_POLICY", "APPROVAL_TIMEOUT_SECONDS"]
    code = (
        "import json; from django.conf import settings; "
        f"print(json.dumps({{k: settings.SHIFTLOG[k] for k in {keys!r}}}))"
    )
    proc = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "WEBHOOK_URLS": ["http://a.example/hook", "https://b.example/hook"],
        "TOOL_POLICY": [{"tool": "bash", "pattern": "^git push", "action": "deny"}],
        "APPROVAL_TIMEOUT_SECONDS": 90,
    }


def test_shiftlog_https_makes_the_deployment_checks_pass_for_cookies_redirect_and_hsts(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
        "SECRET_KEY": "x" * 60 + "-a-long-random-enough-key-for-the-deploy-check",
        "ALLOWED_HOSTS": "shiftlog.example",
    }
    plain = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"security.{warning}" in plain.stderr + plain.stdout
    secure = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env={**env, "SHIFTLOG_HTTPS": "true", "SHIFTLOG_HSTS_SECONDS": "31536000"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"security.{warning}" not in secure.stderr + secure.stdout, secure.stderr


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "hooks.example/x", "ftp://example.org/x", "http://"]
)
def test_a_global_webhook_url_that_is_not_http_stops_start_up(tmp_path, url):
    proc = _check({"SHIFTLOG_WEBHOOK_URLS": f"https://ok.example/hook,{url}"}, tmp_path)
    assert proc.returncode != 0
    assert "SHIFTLOG_WEBHOOK_URLS" in proc.stderr and "http:// or https://" in proc.stderr
    assert _check({"SHIFTLOG_WEBHOOK_URLS": "https://ok.example/hook"}, tmp_path).returncode == 0


def test_a_malformed_webhook_secret_stops_start_up_and_a_missing_one_is_made(tmp_path):
    proc = _check({"SHIFTLOG_WEBHOOK_SECRET": "not-a-secret"}, tmp_path)
    assert proc.returncode != 0 and "SHIFTLOG_WEBHOOK_SECRET must be whsec_" in proc.stderr
    assert _check({}, tmp_path).returncode == 0
    made = (tmp_path / "webhook_secret").read_text()
    assert made.startswith("whsec_") and (tmp_path / "webhook_secret").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    ("value", "said"), [("many", "must be a number"), ("11", "must be 0 to 10"), ("-1", "negative")]
)
def test_a_bad_trusted_proxy_count_stops_start_up(tmp_path, value, said):
    proc = _check({"SHIFTLOG_TRUSTED_PROXIES": value}, tmp_path)
    assert (
        proc.returncode != 0 and "SHIFTLOG_TRUSTED_PROXIES" in proc.stderr and said in proc.stderr
    )


def _sqlite_synchronous(tmp_path, **env_overrides: str) -> subprocess.CompletedProcess:
    """PRAGMA synchronous as a real connection of the production settings reads it back."""
    code = (
        "import django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); print(c.execute('PRAGMA synchronous').fetchone()[0])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTLOG_", "DATABASE_URL"))}
    env.update({"DJANGO_SETTINGS_MODULE": "shiftlog.settings", "SHIFTLOG_DATA_DIR": str(tmp_path)})
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_sqlite_sync_level_is_a_setting_that_reaches_the_connection(tmp_path):
    # SQLite's synchronous: 1 = NORMAL (the default), 2 = FULL (an fsync per commit).
    default = _sqlite_synchronous(tmp_path)
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip() == "1"
    full = _sqlite_synchronous(tmp_path, SHIFTLOG_SQLITE_SYNC="full")
    assert full.returncode == 0, full.stderr
    assert full.stdout.strip() == "2"


@pytest.mark.parametrize("value", ["OFF", "EXTRA", "NORMAL;PRAGMA foo", "2"])
def test_a_bad_sqlite_sync_level_stops_start_up_naming_the_choices(tmp_path, value):
    proc = _check({"SHIFTLOG_SQLITE_SYNC": value}, tmp_path)
    assert proc.returncode != 0
    assert "SHIFTLOG_SQLITE_SYNC must be NORMAL or FULL" in proc.stderr


def test_postgres_connections_come_from_a_bounded_pool_of_a_set_size(tmp_path):
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "d = s.DATABASES['default']; print(json.dumps([d['CONN_MAX_AGE'], d['OPTIONS']]))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shiftlog.settings",
        "SHIFTLOG_DATA_DIR": str(tmp_path),
        "DATABASE_URL": "postgres://someone@db.example:5433/shiftlog",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, {"pool": {"min_size": 2, "max_size": 20, "timeout": 30.0}}]
    env["SHIFTLOG_DB_POOL_SIZE"] = "5"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout)[1]["pool"]["max_size"] == 5
