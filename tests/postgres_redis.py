"""The second half of `make test`: the tests that touch the database, the queue or the channel
layer, run again against the real PostgreSQL and Redis of this machine.

    python -m tests.postgres_redis [PYTEST ARGS]

SHIFTLOG_TEST_POSTGRES (default postgres://postgres@127.0.0.1:5432/postgres: the server, and a
database to connect to while pytest-django creates its own) and SHIFTLOG_TEST_REDIS (default
redis://127.0.0.1:6379/14) name the servers. When one does not answer, this says so plainly and
exits 0: the SQLite half has run everything already. SHIFTLOG_TEST_SERVICES=required makes a
missing server an error instead (for a CI that must test them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

POSTGRES = os.environ.get("SHIFTLOG_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("SHIFTLOG_TEST_REDIS", "redis://127.0.0.1:6379/14")
# Everything but the tests of pure code (sandbox, snapshots on disk, policy, providers, settings):
# those touch no database, queue or channel layer, and ran in the SQLite half; but the browser
# tests of what pages show (ui_only): the live feed's browser tests (through the Redis hub here)
# run again, the rest would only repeat the SQLite half's; and but the tests of what reads the
# same on any database (any_db: pages, forms, scripts, CLI wording, the API schema).
MARKER = "not no_services and not ui_only and not any_db"


def answers(url: str, default_port: int) -> str | None:
    """None when a TCP connection to the URL's host and port succeeds, else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as e:
        return f"{host}:{port} does not answer ({e.strerror or e})"


def main(argv: list[str]) -> int:
    problems = [f"PostgreSQL at {p}" for p in [answers(POSTGRES, 5432)] if p] + [
        f"Redis at {p}" for p in [answers(REDIS, 6379)] if p
    ]
    if problems:
        print(f"SKIPPED the PostgreSQL + Redis pass: {'; '.join(problems)}.", flush=True)
        return 1 if os.environ.get("SHIFTLOG_TEST_SERVICES") == "required" else 0
    # A database name of this run's own: pytest-django creates test_<name> and drops it after.
    parts = urlsplit(POSTGRES)
    database = urlunsplit(parts._replace(path=f"/shiftlog_{os.getpid()}"))
    env = {**os.environ, "DATABASE_URL": database, "REDIS_URL": REDIS}
    print(
        f"The PostgreSQL + Redis pass: {parts.hostname}:{parts.port or 5432} and {REDIS}",
        flush=True,
    )
    cmd = [sys.executable, "-m", "pytest", "-m", MARKER, *argv]
    try:
        return subprocess.call(cmd, env=env)
    finally:
        drop_leftover(f"test_shiftlog_{os.getpid()}")


def drop_leftover(name: str) -> None:
    """pytest-django drops its test database, unless a process it killed was still connected
    at that moment (PostgreSQL notices a dead client a little later): drop it regardless."""
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
