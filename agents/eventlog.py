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
) -> Appended:
    """Append events to a run's log in one transaction, in order.

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
    now = timezone.now()
    params: list[Any] = [len(new), *(increments[name] for name in names)]
    if lease_owner is not None:
        params += [now + timedelta(seconds=settings.SHIFTLOG["LEASE_SECONDS"]), run_id, lease_owner]
    else:
        params.append(run_id)
    secrets = _secret_values()
    stored = [_stored(item.payload, secrets) for item in new]
    raw = _raw_cursor()
    events: list[Event] = []
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
                    first = last_seq - len(new) + 1
                    events = [
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
                    _insert(cursor, events, [text for _, text in stored], now, raw is not None)
        finally:
            cursor.close()
        if events and events_committed.has_listeners():  # nobody listens embedded: no cost
            transaction.on_commit(
                lambda: events_committed.send(sender=Event, events=events), robust=True
            )
    if not events:
        if lease_owner is not None and Run.objects.filter(pk=run_id).exists():
            raise LeaseLost(f"run {run_id}: lease no longer held by {lease_owner}")
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return Appended(events=events, status=status)


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


def _short(text: Any, limit: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


SESSION_ENDINGS = {
    "handoff": "ended with a handoff",
    "finished": "ended: the agent finished and the checks passed",
    "verification_failed": "ended: the checks failed",
    "budget": "ended: a budget ran out",
    "cancelled": "ended: the run was cancelled",
    "failed": "ended: the run failed",
    "crashed_recovered": "ended when its worker crashed (the run recovered)",
    "rewound": "was ended by a rewind",
}


def _number(p: dict[str, Any]) -> Any:
    """A checkpoint's number in its run (events from before numbers had only the id)."""
    return p.get("number", p.get("checkpoint_id"))


def describe(kind: str, payload: dict[str, Any]) -> str:
    """A one-line summary of an event, for the CLI and the admin."""
    p = payload
    if kind == "run.created":
        return f"goal: {_short(p.get('goal'))}"
    if kind == "run.status":
        reason = f" ({_short(p['reason'])})" if p.get("reason") else ""
        return f"{p.get('from')} → {p.get('to')}{reason}"
    if kind == "session.started":
        return f"session {p.get('index')} started"
    if kind == "session.ended":
        how = SESSION_ENDINGS.get(p.get("reason"), f"ended ({p.get('reason')})")
        return f"session {p.get('index')} {how}"
    if kind == "model.turn":
        usage = p.get("usage", {})
        tools = [b.get("name") for b in p.get("content", []) if b.get("type") == "tool_use"]
        calls = f" → {', '.join(tools)}" if tools else ""
        return (
            f"{_short(p.get('text') or '(no text)', 80)}{calls} "
            f"[{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out]"
        )
    if kind == "tool.call":
        args = p.get("input") or {}
        main = args.get("command") or args.get("path") or args.get("summary") or ""
        return f"{p.get('name')} {_short(main, 80)}".rstrip()
    if kind == "tool.result":
        mark = "error" if p.get("is_error") else "ok"
        return f"{p.get('name')} {mark}: {_short(p.get('output', ''), 80)}"
    if kind == "check.result":
        state = "passed" if p.get("passed") else f"failed (exit {p.get('exit_code')})"
        return f"`{p.get('command')}` {state}"
    if kind == "check.regressed":
        return (
            f"REGRESSION: `{p.get('command')}` passed at #{p.get('passed_at_seq')} and fails now "
            f"({p.get('at', 'finish')}); the run cannot succeed while it fails"
        )
    if kind == "check.tampered":
        files = p.get("files") or []
        changes = ", ".join(f"{f.get('path')} ({f.get('change')})" for f in files)
        return (
            f"TAMPERED: {len(files)} protected file(s) changed, the checks ran against the "
            f"originals: {_short(changes, 80)}"
        )
    if kind == "drift.warning":
        coverage, threshold = p.get("coverage"), p.get("threshold")
        number = (int, float)
        share = f"{coverage:.0%}" if isinstance(coverage, number) else "?"
        below = f" (below {threshold:.0%})" if isinstance(threshold, number) else ""
        which = "forced handoff (the agent's last words)" if p.get("forced") else "handoff"
        missing = ", ".join(str(w) for w in (p.get("goal_words_missing") or [])[:8])
        return _short(
            f"drift: the {which} speaks of {share} of the goal{below}; missing: {missing}", 160
        )
    if kind == "judge.verdict":
        criteria = [c for c in p.get("criteria") or [] if isinstance(c, dict)]
        met = sum(1 for c in criteria if c.get("passed") is True)
        marks = "; ".join(
            f"{'✔' if c.get('passed') is True else '✘'} {c.get('criterion')}: {c.get('reason', '')}"
            for c in criteria
        )
        error = f" ({p['error']})" if p.get("error") else ""
        verdict = "accepted" if p.get("passed") else "rejected"
        return _short(
            f"judge {verdict}, {met} of {len(criteria)} criteria met{error}: {marks}", 160
        )
    if kind in {"human.note", "harness.message"}:
        return _short(p.get("text", ""))
    if kind in {"budget.warning"}:
        return f"{p.get('budget')}: {p.get('used')} of {p.get('limit')}"
    if kind in {"budget.exceeded", "error"}:
        return _short(p.get("reason") or p.get("message", ""))
    if kind == "approval.requested":
        args = p.get("input") or {}
        return f"{p.get('tool')} {_short(args.get('command') or args.get('path') or args, 70)} ({p.get('reason')})"
    if kind == "approval.decided":
        comment = f": {_short(p['comment'], 60)}" if p.get("comment") else ""
        edited = " with edits" if p.get("edited_input") else ""
        return f"approval {p.get('approval_id')} {p.get('decision')}{edited}{comment}"
    if kind == "run.updated":
        if "rule_added" in p:
            rule = p["rule_added"]
            return f"tool policy: rule added ({rule.get('action')} {rule.get('tool')})"
        return (
            "tool policy changed" if "tool_policy" in p else f"budgets raised: {p.get('budgets')}"
        )
    if kind == "checkpoint.created":
        label = f": {_short(p['label'], 60)}" if p.get("label") else ""
        return (
            f"checkpoint {_number(p)} ({p.get('kind')}){label}, {p.get('files')} "
            f"files, the store grew by {p.get('bytes_added', 0)} bytes"
        )
    if kind == "run.rewound":
        note = f"; note: {_short(p['note'], 60)}" if p.get("note") else ""
        return (
            f"rewound to checkpoint {_number(p)} (#{p.get('to_seq')}): events "
            f"#{(p.get('to_seq') or 0) + 1}-#{p.get('from_seq')} abandoned ({p.get('events')} "
            f"events, {p.get('tokens')} tokens, ${p.get('cost_usd')}){note}"
        )
    if kind == "run.rewind_requested":
        note = f"; note: {_short(p['note'], 60)}" if p.get("note") else ""
        return f"rewind to checkpoint {_number(p)} (#{p.get('to_seq')}) requested{note}"
    if kind == "run.forked":
        return f"forked from checkpoint {_number(p)} into run {p.get('fork_run_id')}"
    if kind == "acceptance.updated":
        changed = ", ".join(str(c) for c in p.get("changed") or [])
        return f"acceptance {p.get('passing')}/{p.get('total')} passing" + (
            f" (changed: {_short(changed, 80)})" if changed else ""
        )
    if kind == "notification.failed":
        return (
            f"webhook {p.get('event')} to {p.get('url')} failed after {p.get('attempts')} "
            f"attempt(s): {_short(p.get('error', ''), 80)}"
        )
    if kind in {"memory.saved", "memory.changed", "memory.deleted"}:
        where = f"project {p.get('project_name')!r}" if p.get("scope") == "project" else "run"
        what = {"memory.saved": "saved", "memory.changed": "changed", "memory.deleted": "deleted"}
        text = f": {_short(p['text'], 80)}" if "text" in p else ""
        pin = {True: " (pinned)", False: " (unpinned)"}.get(p.get("pinned"), "")
        shared = " (and for the project)" if p.get("project") else ""
        return f"{where} memory {what[kind]} {p.get('key')}{pin}{shared}{text}"
    if kind == "artifact.saved":
        return f"{p.get('name')} ({p.get('kind')}, {p.get('size')} bytes)"
    if kind.startswith("fleet."):
        return describe_fleet(kind, p)
    if kind == "workspace.restored":
        at = f"checkpoint {p['checkpoint']}" if p.get("checkpoint") else "its last committed state"
        return (
            f"workspace restored on {p.get('host')} from {at}: {p.get('files')} files, "
            f"{p.get('bytes')} bytes, {p.get('written')} written, in {p.get('milliseconds')} ms"
        )
    return _short(p)


def describe_fleet(kind: str, p: dict[str, Any]) -> str:
    """A fleet event in one line (agents/fleets/parent.py, agents/lifecycle.py)."""
    if kind == "fleet.spawned":
        ids = ", ".join(str(c.get("run_id")) for c in p.get("children") or [])
        return f"spawned child runs {ids} (wait {p.get('wait', 'all')})"
    if kind == "fleet.child_ended":
        return f"child run {p.get('run_id')} {p.get('status')}"
    if kind == "fleet.woke":
        return f"woke: {_short(p.get('reason', ''), 80)}"
    if kind == "fleet.merge":
        files = ", ".join(p.get("conflicts") or []) if p.get("result") == "conflict" else ""
        return _short(
            f"merge of child run {p.get('run_id')}: {p.get('result')}"
            + (f" in {files}" if files else f", {len(p.get('files') or [])} file(s)"),
            120,
        )
    if kind == "fleet.cascade":
        return f"{p.get('action')} with its parent: {_short(p.get('cause', ''), 80)}"
    return _short(p)
