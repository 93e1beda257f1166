"""Hundreds of runs per host: database connections are held only while the database is used,
and a busy database (no connection to be had) never fails a run.

Real `run_huey` consumers on the real PostgreSQL test database (the PostgreSQL pass only): one
counts the consumer's backends in pg_stat_activity while its slices wait on slow model calls;
the other makes the server refuse the consumer's connections (a role of its own with a
CONNECTION LIMIT, its connections all held by the test) while the consumer drives runs.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection

from agents.models import EventKind, Run, RunStatus
from tests.helpers import call, finish_turn, make_run, script
from tests.procs import dump_events, process_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL connections: the PostgreSQL pass runs this")


def url_with(url: str, *, user: str | None = None, **params: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(params)))


def backends(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]


def slow_runs(count: int, delay: float) -> list[Run]:
    turns = script(
        {"tool_calls": [call("write_file", path="a.txt", content="1")]},
        finish_turn(),
    )
    return [make_run(script={**turns, "turn_delay_seconds": delay}) for _ in range(count)]


def status_of(run: Run) -> str:
    return Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()


@pytest.mark.django_db(transaction=True)
def test_slices_waiting_on_slow_model_calls_hold_no_database_connection(procs, tmp_path):
    """Six slices wait on six-second model calls at once on a pool of two connections: only
    possible when a waiting slice gives its connection back (holding it, the other four would
    find none and could not even claim their runs). Without the pool, six threads held six."""
    postgres_only()
    name = f"shiftlog-wait-{uuid.uuid4().hex[:8]}"
    database_url = url_with(process_env(tmp_path)["DATABASE_URL"], application_name=name)
    runs = slow_runs(6, delay=6.0)
    ids = [r.pk for r in runs]
    procs.consumer(
        workers=6, DATABASE_URL=database_url, SHIFTLOG_DB_POOL_SIZE="2", SHIFTLOG_DB_POOL_MIN="1"
    )
    procs.enqueue(*ids)
    peak = 0

    def all_waiting() -> bool:
        nonlocal peak
        peak = max(peak, backends(name))
        leased = Run.objects.filter(pk__in=ids, status=RunStatus.RUNNING).exclude(lease_owner="")
        answered = Run.objects.filter(pk__in=ids, events__kind=EventKind.MODEL_TURN).exists()
        assert not answered, "a model answered before all six slices waited at once"
        return leased.count() == len(runs)

    wait_for(all_waiting, timeout=30, interval=0.05, what="six slices waiting at once")

    def ended(run: Run) -> bool:
        nonlocal peak
        peak = max(peak, backends(name))
        return status_of(run) in {"succeeded", "failed", "paused"}

    for run in runs:
        wait_for(
            lambda run=run: ended(run),
            timeout=60,
            what=f"run {run.pk} to end",
            details=lambda run=run: f"{dump_events(run.pk)}\n{procs.logs()}",
        )
        assert status_of(run) == RunStatus.SUCCEEDED, dump_events(run.pk)
    assert 0 < peak <= 2, f"{peak} connections for six slices on a pool of two"


@contextlib.contextmanager
def limited_role(limit: int):
    """A login role that may hold `limit` connections, with the rights the worker needs."""
    role = f"shiftlog_busy_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {limit}')
        cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
        cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    try:
        yield role
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [role],
            )
            cursor.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


@pytest.mark.django_db(transaction=True)
def test_a_database_refusing_connections_delays_runs_but_fails_none(procs, tmp_path):
    postgres_only()
    runs = slow_runs(3, delay=0.2)
    with limited_role(3) as role:
        worker_url = url_with(process_env(tmp_path)["DATABASE_URL"], user=role)
        # The test holds every connection the role may have: the server refuses the worker's
        # ("too many connections for role", SQLSTATE 53300), as a full server refuses with
        # "too many clients" (53300 too).
        held = [psycopg.connect(worker_url, autocommit=True) for _ in range(3)]
        try:
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                psycopg.connect(worker_url)
            procs.consumer(
                workers=3,
                DATABASE_URL=worker_url,
                SHIFTLOG_DB_POOL_TIMEOUT="2",
                SHIFTLOG_DB_POOL_SIZE="3",
            )
            procs.enqueue(*[r.pk for r in runs])
            time.sleep(12)  # the worker meets a database that refuses it, again and again
            assert all(status_of(r) == RunStatus.QUEUED for r in runs), [status_of(r) for r in runs]
        finally:
            for conn in held:
                conn.close()
        for run in runs:
            wait_for(
                lambda run=run: status_of(run) in {"succeeded", "failed", "paused", "cancelled"},
                timeout=90,
                what=f"run {run.pk} to end once connections come back",
                details=lambda run=run: f"{dump_events(run.pk)}\n{procs.logs()}",
            )
            assert status_of(run) == RunStatus.SUCCEEDED, f"{dump_events(run.pk)}\n{procs.logs()}"
        logs = procs.logs()
        assert "the database is busy or away" in logs, logs
