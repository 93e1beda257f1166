"""Database connections held only while the database is used, and which database errors pass.

With PostgreSQL each process has one bounded pool (settings: SHIFTLOG_DB_POOL_SIZE), so the
connections a worker holds do not grow with its threads. A thread gives its connection back to
the pool before it waits on something that is not the database (a model call, a tool run):
`release()`. Its next query takes one from the pool again (tens of microseconds).

`transient(e)` says whether a database error is the database being busy or away for now (too
many clients, no pooled connection free in time, the server starting or shutting down, the
connection lost, SQLite's lock held past its timeout): the work is then tried again later, and
never fails the run (agents.runtime.loop.drive).
"""

from __future__ import annotations

import sqlite3

from django.db import DatabaseError, connections

try:  # the postgres extra (shiftlog[postgres]); the embedded mode runs without it
    import psycopg
    from psycopg_pool import PoolTimeout
except ImportError:  # pragma: no cover (the package test's bare install)
    psycopg = None
    PoolTimeout = None

# SQLSTATEs of a server that is busy or away (class 08: connection exception; 53300 too many
# connections; 53000 insufficient resources; 57P01-57P03: shutting down, crashed, starting up).
TRANSIENT_SQLSTATES = frozenset({"53000", "53300", "57P01", "57P02", "57P03"})


def pooled(conn) -> bool:
    return bool(conn.settings_dict.get("OPTIONS", {}).get("pool"))


def release() -> None:
    """Give this thread's pooled connections back before a wait that does not need them. A
    connection inside a transaction (atomic block) is kept: closing it would end the
    transaction. Without a pool (SQLite, or the pool turned off) nothing changes."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and pooled(conn) and not conn.in_atomic_block:
            conn.close()


def discard() -> None:
    """After a transient error: drop this thread's connections (a broken one goes back to the
    pool, which checks and replaces it), so the next attempt starts afresh."""
    for conn in connections.all(initialized_only=True):
        try:
            if conn.in_atomic_block:
                conn.needs_rollback = True
                continue
            conn.close()
        except DatabaseError:
            conn.connection = None


def transient(error: BaseException) -> bool:
    """True for a database error that says "busy or away for now", not "this is wrong"."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if PoolTimeout is not None and isinstance(e, PoolTimeout):
            return True
        if psycopg is not None and isinstance(e, psycopg.OperationalError):
            state = getattr(e, "sqlstate", None)
            # No SQLSTATE: the connection itself failed (refused, too many clients at connect,
            # closed by the server).
            return state is None or state.startswith("08") or state in TRANSIENT_SQLSTATES
        if psycopg is not None and isinstance(e, psycopg.InterfaceError):
            return True  # "the connection is closed"
        if isinstance(e, sqlite3.OperationalError):
            return "locked" in str(e) or "busy" in str(e)
        e = e.__cause__ or e.__context__
    return False
