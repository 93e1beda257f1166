"""The append-only event log: the only way events are written.

Sequence numbers come from the run row's `last_seq` counter, bumped by one UPDATE ... RETURNING
inside the appending transaction. The row lock that UPDATE takes (PostgreSQL) or the write lock
of an IMMEDIATE transaction (SQLite) serialises appenders of one run, so `seq` is gap-free and
unique even with several processes appending at once; the unique (run, seq) constraint backs it.
The same statement checks the caller's lease and extends it, so a worker that lost its claim on
a run cannot write another event for it, and renewing the lease costs nothing extra.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from agents import events
from agents.models import Event, Run, Session

# Sent once the transaction that appended events has committed, with `events` (the new Event
# rows, in seq order). The dashboard listens when its channel layer reaches other processes
# (Redis), so a worker's events are pushed to browsers at once instead of waiting for a tail.
events_committed = Signal()


class LeaseLost(Exception):
    """The worker no longer holds the run's lease; it must stop driving the run."""


@dataclass
class NewEvent:
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    session_id: int | None = None
    actor: str = "harness"


@dataclass
class Appended:
    events: list[Event]
    status: str  # the run's status as of this append: workers read it to see pause/cancel


# A NUL byte (a command printing /dev/zero, say) is shown as this: PostgreSQL's JSON holds none.
NUL_SHOWN_AS = "\u2400"


def _clean(value: Any, secrets: list[str]) -> Any:
    """The payload as stored: secrets redacted, NUL bytes made visible (and storable)."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "[redacted]")
        return value.replace("\x00", NUL_SHOWN_AS) if "\x00" in value else value
    if isinstance(value, dict):
        return {
            (k.replace("\x00", NUL_SHOWN_AS) if isinstance(k, str) else k): _clean(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_clean(v, secrets) for v in value]
    return value


def redact(value: Any) -> Any:
    """`value` with the secrets the log knows of redacted, as the log stores payloads: for
    copies of logged text that leave the house (a trace's content, agents/trace_content.py)."""
    return _clean(value, _secret_values())


def _secret_values() -> list[str]:
    # Secrets never reach the log, even when a tool prints one it somehow got hold of.
    candidates = [
        settings.SHIFTLOG.get("ANTHROPIC_API_KEY"),
        settings.SHIFTLOG.get("METRICS_TOKEN"),
        settings.SECRET_KEY,
        getattr(settings, "DATABASE_URL", ""),
        getattr(settings, "REDIS_URL", ""),
    ]
    return [s for s in candidates if s and len(s) >= 8]


# Run counters a caller may add to in the same statement (the runtime adds a turn's usage).
COUNTERS = frozenset(
    {
        "turns",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cost_usd",
    }
)


def append_many(
    run_id: int,
    new: list[NewEvent],
    *,
    lease_owner: str | None = None,
    increments: dict[str, Any] | None = None,
    session_usage: tuple[int, int] | None = None,
) -> Appended:
    """Append events to a run's log in one transaction, in order.

    `session_usage` (session pk, its last input tokens): the same `increments` are added to
    that session's counters too (add_to_session), in the same statement on PostgreSQL.

    Inside a caller's transaction no savepoint is taken: a failure here (a lost lease, a run
    that is gone) fails the caller's transaction as a whole, which is what every caller wants.
    Each event's payload is stored as given when nothing in it needed cleaning (no secret, no
    NUL): the Event holds the caller's object, not a copy, so do not change it afterwards.
    """
    if not new:
        raise ValueError("append_many needs at least one event")
    names = tuple(increments or ())
    for name in names:
        if name not in COUNTERS:
            raise ValueError(f"not a run counter: {name}")
    for item in new:
        # Through its kind's type: an unknown kind or a payload with a wrong field is refused
        # here, before anything is written (agents/events.py).
        events.check(item.kind, item.payload)
    now = timezone.now()
    params: list[Any] = [len(new), *(increments[name] for name in names)]
    if lease_owner is not None:
        params += [now + timedelta(seconds=settings.SHIFTLOG["LEASE_SECONDS"]), run_id, lease_owner]
    else:
        params.append(run_id)
    secrets = _secret_values()
    stored = [_stored(item.payload, secrets) for item in new]
    if connection.vendor == "postgresql":
        rows, status = _append_in_one_statement(
            run_id, new, stored, names, params, now, lease_owner, session_usage, increments
        )
        if rows and events_committed.has_listeners():
            transaction.on_commit(
                lambda: events_committed.send(sender=Event, events=rows), robust=True
            )
        if not rows:
            _raise_not_written(run_id, lease_owner)
        return Appended(events=rows, status=status)
    raw = _raw_cursor()
    rows: list[Event] = []
    with transaction.atomic(savepoint=False):
        cursor = raw or connection.cursor()
        try:
            with connection.wrap_database_errors:
                cursor.execute(_update_sql(names, lease_owner is not None, raw is not None), params)
                row = cursor.fetchone()
                # No row: nothing was written, so the transaction ends normally and the error
                # is raised after it (a caller's transaction stays usable).
                if row is not None:
                    last_seq, status = row
                    rows = _events(run_id, last_seq - len(new) + 1, new, stored, now)
                    _insert(cursor, rows, [text for _, text in stored], now, raw is not None)
        finally:
            cursor.close()
        if rows and session_usage is not None:
            add_to_session(session_usage[0], increments or {}, last_input_tokens=session_usage[1])
        if rows and events_committed.has_listeners():  # nobody listens embedded: no cost
            transaction.on_commit(
                lambda: events_committed.send(sender=Event, events=rows), robust=True
            )
    if not rows:
        _raise_not_written(run_id, lease_owner)
    return Appended(events=rows, status=status)


def _raise_not_written(run_id: int, lease_owner: str | None) -> None:
    if lease_owner is not None and Run.objects.filter(pk=run_id).exists():
        raise LeaseLost(f"run {run_id}: lease no longer held by {lease_owner}")
    raise Run.DoesNotExist(f"run {run_id} does not exist")


def _append_in_one_statement(
    run_id: int,
    new: list[NewEvent],
    stored: list[tuple[dict[str, Any], str]],
    names: tuple[str, ...],
    params: list[Any],
    now,
    lease_owner: str | None,
    session_usage: tuple[int, int] | None,
    increments: dict[str, Any] | None,
) -> tuple[list[Event], str | None]:
    """PostgreSQL: the run row's UPDATE (seq, counters, lease) and the events' INSERT as one
    statement (a data-modifying WITH), so an append is one round trip and, outside a caller's
    transaction, its own transaction without BEGIN and COMMIT sent apart: a third of the
    round trips it took. The UPDATE's row lock orders appends exactly as before, and a lease
    not held (or a run gone) inserts nothing."""
    payload_field = Event._meta.get_field("payload")
    created_at = connection.ops.adapt_datetimefield_value(now)
    values: list[Any] = []
    for i, (item, (payload, _)) in enumerate(zip(new, stored, strict=True)):
        values += [
            i,
            item.session_id,
            item.kind,
            item.actor,
            payload_field.get_db_prep_save(payload, connection),
        ]
    notify = not settings.SHIFTLOG["LIVE_PUSH"]  # no Redis hub: waiters LISTEN (wakeups.py)
    session: list[Any] = []
    if session_usage is not None:
        session = [session_usage[1], *((increments or {})[name] for name in names)]
        session.append(session_usage[0])
    with connection.cursor() as cursor:
        cursor.execute(
            _one_statement_sql(names, lease_owner is not None, len(new), notify, bool(session)),
            [
                *params,
                *([str(run_id)] if notify else []),
                *session,
                run_id,
                len(new),
                created_at,
                *values,
            ],
        )
        returned = cursor.fetchall()
    if not returned:
        return [], None
    status = returned[0][2]
    ids = {seq: pk for pk, seq, _ in returned}
    rows = _events(run_id, min(ids), new, stored, now)
    for event in rows:
        event.pk = ids[event.seq]
        event._state.adding = False
        event._state.db = connection.alias
    return rows, status


def _events(
    run_id: int, first: int, new: list[NewEvent], stored: list[tuple[dict[str, Any], str]], now
) -> list[Event]:
    """The appended events as model instances, numbered from `first`."""
    return [
        Event(
            run_id=run_id,
            seq=first + i,
            session_id=item.session_id,
            kind=item.kind,
            actor=item.actor,
            payload=payload,
            created_at=now,
        )
        for i, (item, (payload, _)) in enumerate(zip(new, stored, strict=True))
    ]


# PostgreSQL without Redis: every append NOTIFYs this channel with its run's id, delivered at
# commit (and only then), which wakes the long polls waiting on that run (agents/wakeups.py).
NOTIFY_CHANNEL = "shiftlog_events"


@functools.cache
def _one_statement_sql(
    names: tuple[str, ...], leased: bool, count: int, notify: bool, session: bool
) -> str:
    update = _update_sql(names, leased, False)
    values = ", ".join(["(%s::int, %s::bigint, %s::text, %s::text, %s::jsonb)"] * count)
    columns = ", ".join(_EVENT_COLUMNS)
    told = f", n AS (SELECT pg_notify('{NOTIFY_CHANNEL}', %s) FROM r)" if notify else ""
    # The session's counters move only with the run's row (a lost lease changes nothing).
    counted = ""
    if session:
        sql = _session_sql(names, False).replace(" WHERE id = %s", "")
        counted = f", s AS ({sql} WHERE id = %s AND EXISTS (SELECT 1 FROM r))"
    return (
        f"WITH r AS ({update}){told}{counted} "
        f"INSERT INTO {Event._meta.db_table} ({columns}) "
        "SELECT %s, r.last_seq - %s + 1 + v.i, v.session_id, v.kind, v.actor, v.payload, %s "
        f"FROM r{', n' if notify else ''}, (VALUES {values}) AS v(i, session_id, kind, actor, payload) "
        "ORDER BY v.i "
        "RETURNING id, seq, (SELECT status FROM r)"
    )


def _raw_cursor():
    """SQLite's own cursor, past Django's wrappers (their cost was a third of a step's), unless
    queries are being logged (DEBUG, a test counting them): then None, and Django's is used."""
    if connection.vendor != "sqlite" or connection.queries_logged:
        return None
    connection.ensure_connection()
    return connection.connection.cursor()


@functools.cache
def _update_sql(names: tuple[str, ...], leased: bool, qmark: bool) -> str:
    """The run row's UPDATE: seq counter, counters, lease; RETURNING the new last_seq and status."""
    sql = f"UPDATE {Run._meta.db_table} SET last_seq = last_seq + %s"
    for name in names:
        sql += f", {name} = {name} + %s"
    if leased:
        sql += ", lease_expires_at = %s, lease_renewals = lease_renewals + 1"
    sql += " WHERE id = %s"
    if leased:
        sql += " AND lease_owner = %s"
    sql += " RETURNING last_seq, status"
    return sql.replace("%s", "?") if qmark else sql


def _stored(payload: dict[str, Any], secrets: list[str]) -> tuple[dict[str, Any], str]:
    """(the payload as stored, its JSON). The JSON is searched for each secret and for NUL as
    JSON writes them (escaping is character by character, so a secret inside a string shows
    as the secret's own escaped form); only a payload that has one is walked and cleaned."""
    text = json.dumps(payload)
    if "\\u0000" in text or any(_json_form(secret) in text for secret in secrets):
        payload = _clean(payload, secrets)
        text = json.dumps(payload)
    return payload, text


@functools.lru_cache(maxsize=64)
def _json_form(secret: str) -> str:
    return json.dumps(secret)[1:-1]


_EVENT_COLUMNS = ("run_id", "seq", "session_id", "kind", "actor", "payload", "created_at")


@functools.cache
def _insert_sql(rows: int, qmark: bool) -> str:
    mark = "?" if qmark else "%s"
    values = ", ".join(["(" + ", ".join([mark] * len(_EVENT_COLUMNS)) + ")"] * rows)
    return (
        f"INSERT INTO {Event._meta.db_table} ({', '.join(_EVENT_COLUMNS)}) "
        f"VALUES {values} RETURNING id, seq"
    )


def _insert(cursor, events: list[Event], texts: list[str], now, raw: bool) -> None:
    """INSERT the events in one statement, without the ORM's bulk_create compiler."""
    created_at = connection.ops.adapt_datetimefield_value(now)
    params: list[Any] = []
    if connection.vendor == "sqlite":
        payloads = texts  # what Django's JSONField would send: json.dumps of the payload
    else:
        payload_field = Event._meta.get_field("payload")
        payloads = [payload_field.get_db_prep_save(e.payload, connection) for e in events]
    for event, payload in zip(events, payloads, strict=True):
        params += [
            event.run_id,
            event.seq,
            event.session_id,
            event.kind,
            event.actor,
            payload,
            created_at,
        ]
    cursor.execute(_insert_sql(len(events), raw), params)
    ids = {seq: pk for pk, seq in cursor.fetchall()}
    for event in events:
        event.pk = ids[event.seq]
        event._state.adding = False
        event._state.db = connection.alias


def add_to_session(session_id: int, increments: dict[str, Any], *, last_input_tokens: int) -> None:
    """Add a turn's usage to its session's counters: one plain UPDATE, like the run's.

    (The ORM F() update took ~0.43 ms a step, almost all of it building the query; this ~0.03 ms.)
    """
    names = tuple(increments)
    for name in names:
        if name not in COUNTERS:
            raise ValueError(f"not a session counter: {name}")
    raw = _raw_cursor()
    cursor = raw or connection.cursor()
    try:
        with connection.wrap_database_errors:
            cursor.execute(
                _session_sql(names, raw is not None),
                [last_input_tokens, *(increments[name] for name in names), session_id],
            )
    finally:
        cursor.close()


@functools.cache
def _session_sql(names: tuple[str, ...], qmark: bool) -> str:
    sql = f"UPDATE {Session._meta.db_table} SET last_input_tokens = %s"
    for name in names:
        sql += f", {name} = {name} + %s"
    sql += " WHERE id = %s"
    return sql.replace("%s", "?") if qmark else sql


def append(
    run_id: int,
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    session_id: int | None = None,
    actor: str = "harness",
    lease_owner: str | None = None,
) -> Event:
    appended = append_many(
        run_id,
        [NewEvent(kind=kind, payload=payload or {}, session_id=session_id, actor=actor)],
        lease_owner=lease_owner,
    )
    return appended.events[0]


# A one-line summary of an event, for the CLI and the admin: each kind's is in its registry.
describe = events.summary
SESSION_ENDINGS = events.SESSION_ENDINGS
