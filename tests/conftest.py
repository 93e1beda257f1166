from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from agents import services

# The helpers the fixtures below use (tests import helpers from tests/helpers.py).
from tests.e2e.helpers import serving
from tests.helpers import FAKE_API_KEY, drive_until_idle, issue_token, user_with


@pytest.fixture
def viewer(db):
    """May watch every run, not control or decide."""
    return user_with("vic", "view_run")


@pytest.fixture
def supervisor(db):
    return user_with("sam", "view_run", "control_run", "decide_approval")


@pytest.fixture
def outsider(db):
    return user_with("otto")


@pytest.fixture
def owner(db):
    return get_user_model().objects.create_user("olivia", password="pw-olivia-1")


@pytest.fixture
def waiting_run(owner):
    """The demo at its risky step, waiting for a person: checkpoints at run start, at session
    1's end and before the approval."""
    run = drive_until_idle(services.create_demo_run(created_by=owner))
    assert run.status == "awaiting_approval", run.status_reason
    return run


@pytest.fixture
def stubborn_agent(monkeypatch):
    """Runs' agents play their scripts but ignore every request to hand off (the scripted one
    hands off when asked), so the harness has to write the handoff itself."""
    from agents import providers

    class Stubborn:
        name, offline = "stubborn", True

        def __init__(self, inner):
            self.inner = inner

        def next_turn(self, request):
            request.handoff_requested = False
            return self.inner.next_turn(request)

    original = providers.for_run
    monkeypatch.setattr(providers, "for_run", lambda run: Stubborn(original(run)))


@pytest.fixture
def fake_api(settings):
    """A local fake Messages API over real HTTP (tests/fake_anthropic.py), with the anthropic
    provider pointed at it: strict response validation, one retry."""
    from tests.fake_anthropic import FakeAnthropic

    with FakeAnthropic() as server:
        settings.SHIFTLOG = {
            **settings.SHIFTLOG,
            "ANTHROPIC_API_KEY": FAKE_API_KEY,
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_MAX_RETRIES": 1,
            "ANTHROPIC_STRICT": True,
        }
        yield server


@pytest.fixture
def procs(transactional_db, tmp_path):
    """Real processes (workers, commands) on the test's database; all dead at the end.

    Depends on transactional_db so it is torn down first: every process is dead before the
    database is flushed under it."""
    from tests.procs import Procs

    started = Procs(tmp_path)
    yield started
    started.close()


@pytest.fixture
def slice_per_session(settings):
    """Each session change ends the slice, as when a worker's slice is out of time at a
    handoff: what people do between two slices reaches the next session's first message."""
    settings.SHIFTLOG = {**settings.SHIFTLOG, "NEXT_SESSION_IN_SLICE": False}


@pytest.fixture
def decider(db):
    return user_with("dana", "decide_approval")


if os.environ.get("DATABASE_URL"):  # the PostgreSQL pass (tests/postgres_redis.py)

    @pytest.fixture(scope="session", autouse=True)
    def _no_stray_database_sessions(django_db_setup, django_db_blocker):
        """A worker the tests killed may still hold a connection for a moment (the server
        notices a dead client later): end such sessions before the test database is dropped,
        so teardown never finds it "being accessed by other users"."""
        yield
        from django.db import connection

        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


# The real Claude Code CLI's stage (tests/claude_stage.py): the processes it starts; the S3 blob
# store's tests: moto's server and a bucket per test (tests/s3.py).
from tests.claude_stage import namespace_procs  # noqa: E402, F401
from tests.s3 import moto_server, s3_env, s3_url  # noqa: E402, F401

# Tests of what reads the same on any database (pages and forms, CLI arguments and schedules'
# wording, scripts, checks, exports, the API's schema, the worked examples): they run once, in the
# SQLite pass, and not again on PostgreSQL + Redis (tests/postgres_redis.py), which keeps the
# tests of locking, leases, workers, queries, JSON fields, NUL bytes, the channel layer and the
# live feed. A test module may also mark single tests `any_db`.
ANY_DATABASE = {
    "test_admin",
    # Its processes run in a loopback-only network namespace, where this machine's PostgreSQL
    # and Redis are not: it runs on SQLite, once.
    "test_claude_code",
    "test_claude_code_browser",
    # shiftlog-claude's reading of a refusal, against a real serve; the server's side is in
    # test_chaos_findings, on both databases.
    "test_claude_driver_resumed",
    "test_mcp_server",
    "test_real_checks",
    "test_check_settings",
    "test_cli_demo_notice",
    "test_cli_schedules",
    "test_client_live",
    "test_compare",
    "test_config_approval",
    "test_dashboard_checkpoints",
    "test_dashboard_views",
    "test_demo_paths",
    "test_examples",
    "test_export",
    "test_export_views",
    "test_events",
    "test_framework_adapters",
    "test_external_pages",
    "test_fleet_views",
    "test_login",
    "test_mail",
    "test_memory_views",
    "test_new_run_form",
    "test_redirects",
    "test_run_tokens",
    "test_schedule_views",
    "test_script_branches",
    "test_telemetry",
    "test_timeline_views",
    "test_upload_limits",
    "test_verification",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in ANY_DATABASE:
            item.add_marker(pytest.mark.any_db)


@pytest.fixture(scope="module")
def fake_slack():
    """A fake Slack Web API over real HTTP (tests/fake_slack.py), for a test module."""
    from tests.fake_slack import FakeSlack

    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def slack(settings, fake_slack, django_capture_on_commit_callbacks):
    """Slack set up against the fake (its calls forgotten), mail off, the queue drained."""
    from tests.fake_slack import SECRET, TOKEN
    from tests.helpers import drain

    settings.SHIFTLOG = {
        **settings.SHIFTLOG,
        "SLACK_BOT_TOKEN": TOKEN,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_CHANNEL": "C0DEFAULT",
        "SLACK_API_URL": fake_slack.base_url,
        "SLACK_BACKOFF_SECONDS": 0.0,
        "MAIL_NOTIFICATIONS": False,
    }
    drain()  # what an earlier test left queued goes to the fake, and is forgotten
    fake_slack.reset()
    return fake_slack


@pytest.fixture
def shiftlog(tmp_path):
    """A real server, the agent's token (read, write) and a person's (read, decide): for the
    worked examples and the framework adapters."""
    user_with("agent")
    user_with("boss", "decide_approval", "view_run")
    agent_token = issue_token(tmp_path, "agent", "read,write")
    boss_token = issue_token(tmp_path, "boss", "read,decide")
    with serving(tmp_path) as base:
        yield base, agent_token, boss_token
