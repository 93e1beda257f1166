"""Runs made for the timeline's tests and benchmark: a log written straight into the events table
(bulk inserts with chosen times), so a hand-made run has exact times and a 100,000-event run
takes seconds, not the hours a real one would."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from agents.models import Event, Run, Session

T0 = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
BATCH = 5000


def write_log(run: Run, specs: list[tuple[float, str, dict[str, Any], int | None]]) -> Run:
    """Append events (seconds after T0, kind, payload, session index or None) after the run's
    last one, creating the sessions they name; the run's seq counter follows."""
    sessions = dict(Session.objects.filter(run=run).values_list("index", "pk"))
    wanted = sorted({s for *_, s in specs if s is not None} - set(sessions))
    if wanted:
        first_seqs: dict[int, int] = {}
        for i, (*_, s) in enumerate(specs):
            if s is not None:
                first_seqs.setdefault(s, run.last_seq + 1 + i)
        made = Session.objects.bulk_create(
            [Session(run=run, index=s, started_at=T0, first_seq=first_seqs[s]) for s in wanted]
        )
        sessions.update({s.index: s.pk for s in made})
    # Plain INSERTs (the ORM's bulk_create spent seconds on 20,000 rows building objects).
    when = Event._meta.get_field("created_at")
    rows = [
        (
            run.pk,
            run.last_seq + 1 + i,
            sessions.get(s) if s is not None else None,
            kind,
            "agent" if kind in {"model.turn", "tool.call"} else "harness",
            json.dumps(payload),
            when.get_db_prep_save(T0 + timedelta(seconds=t), connection),
        )
        for i, (t, kind, payload, s) in enumerate(specs)
    ]
    sql = (
        f"INSERT INTO {Event._meta.db_table} "
        "(run_id, seq, session_id, kind, actor, payload, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )
    with connection.cursor() as cursor:
        for i in range(0, len(rows), BATCH):
            cursor.executemany(sql, rows[i : i + BATCH])
    run.last_seq += len(rows)
    Run.objects.filter(pk=run.pk).update(last_seq=run.last_seq)
    return run


def turn(latency_ms: float, tokens_in: int, tokens_out: int, cost: str, tool: str = "") -> dict:
    content = [{"type": "text", "text": "Working."}]
    if tool:
        content.append({"type": "tool_use", "id": "x", "name": tool, "input": {}})
    return {
        "content": content,
        "text": "Working.",
        "stop_reason": "tool_use" if tool else "end_turn",
        "usage": {
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
        "cost_usd": cost,
        "price": "table",
        "model": "claude-test",
        "latency_ms": latency_ms,
        "context_seq": 0,
        "meta": {},
    }


def big_run(run: Run, events: int, *, per_session: int = 120) -> Run:
    """A long run's log: sessions of `per_session` events, each step a model turn (2-5 s), a
    tool call and its result (one in 40 an error), a checkpoint at each session's end, an approval
    wait every 25 sessions and a pause every 40."""
    specs: list[tuple[float, str, dict[str, Any], int | None]] = [
        (0.0, "run.created", {"goal": run.goal}, None),
        (0.01, "run.status", {"from": "queued", "to": "running"}, None),
    ]
    t, step, session = 1.0, 0, 1
    tools = ("read_file", "write_file", "bash", "list_files")
    while len(specs) < events:
        in_session = 0
        specs.append((t, "session.started", {"index": session}, session))
        in_session += 1
        while in_session < per_session - 4 and len(specs) < events - 3:
            step += 1
            latency = 2000 + (step * 37) % 3000
            t += latency / 1000
            tool = tools[step % len(tools)]
            specs.append((t, "model.turn", turn(latency, 1500, 60, "0.0021", tool), session))
            specs.append(
                (t, "tool.call", {"tool_use_id": f"t{step}", "name": tool, "input": {}}, session)
            )
            t += (50 + (step * 53) % (4000 if tool == "bash" else 400)) / 1000
            result = {
                "tool_use_id": f"t{step}",
                "name": tool,
                "output": "ok",
                "is_error": step % 40 == 0,
                "data": {},
            }
            specs.append((t, "tool.result", result, session))
            in_session += 3
        if len(specs) >= events:
            break
        t += 0.2
        specs.append((t, "checkpoint.created", {"checkpoint_id": session, "kind": "session_end",
                                                 "label": "", "files": 3}, session))  # fmt: skip
        specs.append((t, "session.ended", {"index": session, "reason": "handoff"}, session))
        if session % 25 == 0:
            specs.append((t, "run.status", {"from": "running", "to": "awaiting_approval"}, None))
            t += 90
            specs.append((t, "run.status", {"from": "awaiting_approval", "to": "queued"}, None))
            specs.append((t, "run.status", {"from": "queued", "to": "running"}, None))
        elif session % 40 == 0:
            specs.append((t, "run.status", {"from": "running", "to": "paused"}, None))
            t += 300
            specs.append((t, "run.status", {"from": "paused", "to": "queued"}, None))
            specs.append((t, "run.status", {"from": "queued", "to": "running"}, None))
        session += 1
        t += 1
    return write_log(run, specs[:events])
