"""A run's timeline, indexed in this web process's memory: what the timeline page asks of a run
answered with bisections, prefix sums and block maxima instead of a pass over its event log.

Reading the log for every request took 200-300 ms at 100,000 events (a model turn's latency and
usage, a tool call's name and error sit in the JSON payload), so each run's index is built once
(only the payload keys it needs are read, by the database) and then extended with only the events
appended since. The log is append-only, so an index is never wrong, only behind. One lock guards
every index; together they stay under `MEMORY_CAP_BYTES` (least recently used runs dropped).

Items (model turns and tool calls) are kept ordered by (session index, seq): a session's items, and
a lane of consecutive sessions, are then one contiguous range, and inside it both seq and start
time ascend (sessions run one after another).
"""

from __future__ import annotations

import json
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate, islice, pairwise
from typing import Any

from django.db import connection

from agents import events
from agents.models import Event, Run, Session

MEMORY_CAP_BYTES = 50 * 2**20
_SCAN = json.scanner.make_scanner(json.JSONDecoder())
BLOCK = 16  # items per block of the block maxima
TURN, TOOL = 0, 1
OPEN = -1.0  # the end of a call that has no result yet


def _num(value: Any) -> float:
    """A number from a payload (cost is stored as text); anything else counts as 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value) if isinstance(value, str) else 0.0
    except ValueError:
        return 0.0


@dataclass
class Span:
    """A stretch the run waited: for a person (`approval`) or paused (`paused`)."""

    kind: str
    start_seq: int
    start_ms: float
    end_seq: int | None = None
    end_ms: float | None = None


@dataclass
class Mark:
    """A checkpoint, or a rewind back to one."""

    seq: int
    ms: float
    checkpoint_id: int  # its number in the run (pages and commands name it by that)
    kind: str = ""
    label: str = ""
    to_seq: int = 0  # rewinds: the checkpoint's seq and the last seq it abandoned
    from_seq: int = 0


@dataclass
class RunIndex:
    run_id: int
    last_seq: int = 0
    # Every event, in seq order: its seq and time (ms since the epoch, never decreasing).
    ev_seq: array = field(default_factory=lambda: array("q"))
    ev_ms: array = field(default_factory=lambda: array("d"))
    # Sessions by index: the seqs of their first and last events; ids to indexes.
    session_index: dict[int, int] = field(default_factory=dict)
    session_seqs: dict[int, list[int]] = field(default_factory=dict)
    # Items, ordered by (session, seq). `key` is the start made non-decreasing, for bisection.
    it_seq: array = field(default_factory=lambda: array("q"))
    it_end_seq: array = field(default_factory=lambda: array("q"))
    it_start: array = field(default_factory=lambda: array("d"))
    it_end: array = field(default_factory=lambda: array("d"))
    it_key: array = field(default_factory=lambda: array("d"))
    it_kind: array = field(default_factory=lambda: array("b"))
    it_err: array = field(default_factory=lambda: array("b"))
    it_session: array = field(default_factory=lambda: array("l"))
    it_name: array = field(default_factory=lambda: array("l"))
    it_cost: array = field(default_factory=lambda: array("d"))
    it_tokens: array = field(default_factory=lambda: array("q"))
    # Prefix sums over items (length n + 1) and the longest finished item per BLOCK items.
    err_pre: array = field(default_factory=lambda: array("q", [0]))
    cost_pre: array = field(default_factory=lambda: array("d", [0.0]))
    tokens_pre: array = field(default_factory=lambda: array("q", [0]))
    block_max: array = field(default_factory=lambda: array("d"))
    # The first item of each session (by index), and one past its last.
    session_lo: dict[int, int] = field(default_factory=dict)
    session_hi: dict[int, int] = field(default_factory=dict)
    item_sessions: array = field(default_factory=lambda: array("l"))  # sessions with items
    tool_pos: array = field(default_factory=lambda: array("l"))  # the tool calls among items
    names: list[str] = field(default_factory=list)
    name_ids: dict[str, int] = field(default_factory=dict)
    open_calls: dict[str, int] = field(default_factory=dict)  # tool_use_id -> item
    # Model turns in seq order with the run's cumulative usage after each.
    turn_seq: array = field(default_factory=lambda: array("q"))
    turn_ms: array = field(default_factory=lambda: array("d"))
    cum_tokens: array = field(default_factory=lambda: array("q"))
    cum_cost: array = field(default_factory=lambda: array("d"))
    spans: list[Span] = field(default_factory=list)
    checkpoints: list[Mark] = field(default_factory=list)
    rewinds: list[Mark] = field(default_factory=list)
    _pending: list[list] = field(default_factory=list)  # items of a session already passed
    _pending_calls: dict[str, list] = field(default_factory=dict)

    # --- building ------------------------------------------------------------------------------
    def extend(self, upto: int) -> None:
        """Read the events appended after `last_seq`, up to `upto`, and add them."""
        if upto <= self.last_seq:
            return
        rows = _read(self.run_id, self.last_seq, upto)
        if not rows:
            return
        new_sessions = {r[2] for r in rows if r[2] is not None} - set(self.session_index)
        if new_sessions:
            self.session_index.update(
                Session.objects.filter(pk__in=new_sessions).values_list("pk", "index")
            )
        index, ev_ms, session_seqs = self.session_index, self.ev_ms, self.session_seqs
        last_ms = ev_ms[-1] if ev_ms else 0.0
        times = []
        scan = _SCAN  # json's own C scanner, without loads' checks around it (100,000 calls)
        # The hot path (a turn, a call, a result: nearly every event) inline, with locals:
        # building a 100,000-event index is this loop.
        pending, calls, name_ids = self._pending, self._pending_calls, self.name_ids
        turn_seq, turn_ms = self.turn_seq.append, self.turn_ms.append
        cum_tokens, cum_cost = self.cum_tokens, self.cum_cost
        tokens_total = cum_tokens[-1] if cum_tokens else 0
        cost_total = cum_cost[-1] if cum_cost else 0.0
        previous_id, session, seqs = object(), None, None
        for seq, kind, session_id, created, d in rows:
            ms = float(created)
            if ms < last_ms:
                ms = last_ms  # clocks of two processes: keep time from running backwards
            last_ms = ms
            times.append(ms)
            if session_id != previous_id:
                previous_id, session = session_id, index.get(session_id)
                seqs = None if session is None else session_seqs.setdefault(session, [seq, seq])
            if seqs is not None:
                seqs[1] = seq
            if d is None:
                continue
            if type(d) is str:
                d = scan(d, 0)[0]
            if kind == "tool.result":
                row = calls.pop(str(d[0]), None)
                if row is None:
                    self._close(str(d[0]), seq, ms, d[1] in (True, 1, "true"))
                else:
                    row[2], row[4], row[6] = seq, ms, 1 if d[1] in (True, 1, "true") else 0
            elif kind == "tool.call":
                name = d[1] or "tool"
                name_id = name_ids.get(name)
                if name_id is None:
                    name_id = name_ids[name] = len(self.names)
                    self.names.append(name)
                row = [session or 0, seq, 0, ms, OPEN, TOOL, 0, name_id, 0.0, 0]
                pending.append(row)
                calls[str(d[0])] = row
            elif kind == "model.turn":
                latency, i_tok, o_tok, cr_tok, cw_tok, cost, model = d
                try:
                    tokens = int((i_tok or 0) + (o_tok or 0) + (cr_tok or 0) + (cw_tok or 0))
                except TypeError:  # a count stored as text
                    tokens = int(_num(i_tok) + _num(o_tok) + _num(cr_tok) + _num(cw_tok))
                usd = _num(cost)
                turn_seq(seq)
                turn_ms(ms)
                tokens_total += tokens
                cost_total += usd
                cum_tokens.append(tokens_total)
                cum_cost.append(cost_total)
                name = model or "model"
                name_id = name_ids.get(name)
                if name_id is None:
                    name_id = name_ids[name] = len(self.names)
                    self.names.append(name)
                start = ms - max(0.0, _num(latency))
                pending.append([session or 0, seq, seq, start, ms, TURN, 0, name_id, usd, tokens])
            else:
                self._add(seq, kind, session, ms, d)
        self.ev_seq.extend(r[0] for r in rows)
        ev_ms.extend(times)
        self.last_seq = rows[-1][0]
        if self._pending:
            self._take_pending()

    def _add(self, seq: int, kind: str, session: int | None, ms: float, d: list) -> None:
        """The rarer kinds (turns, calls and results are added in `extend`)."""
        if kind == "run.status":
            self._status(str(d[0]), seq, ms)
        elif kind == "checkpoint.created":
            cid, ckind, label, number = d[:4]
            # Named by its number in the run (events from before numbers carry only the id).
            self.checkpoints.append(
                Mark(seq, ms, int(_num(number or cid)), str(ckind or ""), str(label or ""))
            )
        elif kind == "run.rewound":
            cid, to_seq, from_seq, number = d[:4]
            self.rewinds.append(
                Mark(
                    seq,
                    ms,
                    int(_num(number or cid)),
                    "rewind",
                    "",
                    int(_num(to_seq)),
                    int(_num(from_seq)),
                )
            )

    def _status(self, to: str, seq: int, ms: float) -> None:
        if self.spans and self.spans[-1].end_seq is None:
            self.spans[-1].end_seq, self.spans[-1].end_ms = seq, ms
        if to in ("awaiting_approval", "paused"):
            self.spans.append(Span("approval" if to == "awaiting_approval" else "paused", seq, ms))

    def _take_pending(self) -> None:
        rows, calls = self._pending, self._pending_calls
        self._pending, self._pending_calls = [], {}
        ordered = all(a[0] <= b[0] for a, b in pairwise(rows)) and (
            not self.it_session or rows[0][0] >= self.it_session[-1]
        )
        if not ordered:  # an older session's item: sort every item again
            rows, calls = self._everything(rows, calls)
        n0 = len(self.it_seq)
        self._append_many(rows)
        where = {id(row): n0 + i for i, row in enumerate(rows)}
        for tool_use_id, row in calls.items():
            self.open_calls[tool_use_id] = where[id(row)]

    def _append_many(self, rows: list[list]) -> None:
        n0 = len(self.it_seq)
        session, seq, end_seq, start, end, kind, err, name_id, cost, tokens = zip(
            *rows, strict=True
        )
        self.it_session.extend(session)
        self.it_seq.extend(seq)
        self.it_end_seq.extend(end_seq)
        self.it_start.extend(start)
        self.it_end.extend(end)
        self.it_kind.extend(kind)
        self.it_err.extend(err)
        self.it_name.extend(name_id)
        self.it_cost.extend(cost)
        self.it_tokens.extend(tokens)
        if n0:
            self.it_key.extend(islice(accumulate(start, max, initial=self.it_key[-1]), 1, None))
        else:
            self.it_key.extend(accumulate(start, max))
        self.err_pre.extend(islice(accumulate(err, initial=self.err_pre[-1]), 1, None))
        self.cost_pre.extend(islice(accumulate(cost, initial=self.cost_pre[-1]), 1, None))
        self.tokens_pre.extend(islice(accumulate(tokens, initial=self.tokens_pre[-1]), 1, None))
        self.tool_pos.extend(n0 + i for i, k in enumerate(kind) if k == TOOL)
        previous = None
        for i, s in enumerate(session):
            if s != previous:
                if s not in self.session_lo:
                    self.session_lo[s] = n0 + i
                    self.item_sessions.append(s)
                previous = s
        for i, s in enumerate(session):
            self.session_hi[s] = n0 + i + 1
        first_block = n0 // BLOCK
        lo = first_block * BLOCK
        it_start, it_end = self.it_start, self.it_end
        durations = [
            e - b if e != OPEN else 0.0 for b, e in zip(it_start[lo:], it_end[lo:], strict=True)
        ]
        del self.block_max[first_block:]
        self.block_max.extend(
            max(durations[i : i + BLOCK]) for i in range(0, len(durations), BLOCK)
        )

    def _close(self, tool_use_id: str, seq: int, ms: float, error: bool) -> None:
        pos = self.open_calls.pop(tool_use_id, None)
        if pos is None:
            row = self._pending_calls.pop(tool_use_id, None)
            if row is not None:  # a call still waiting to be sorted in
                row[2], row[4], row[6] = seq, ms, int(error)
            return
        self.it_end[pos] = ms
        self.it_end_seq[pos] = seq
        b = pos // BLOCK
        self.block_max[b] = max(self.block_max[b], ms - self.it_start[pos])
        if error and not self.it_err[pos]:
            self.it_err[pos] = 1
            for i in range(pos + 1, len(self.err_pre)):
                self.err_pre[i] += 1

    def _everything(self, rows: list[list], calls: dict[str, list]):
        """Every item (those in the arrays and the new `rows`) sorted by (session, seq), the
        arrays emptied for them, and the open calls as rows."""
        old = [
            [
                self.it_session[i],
                self.it_seq[i],
                self.it_end_seq[i],
                self.it_start[i],
                self.it_end[i],
                self.it_kind[i],
                self.it_err[i],
                self.it_name[i],
                self.it_cost[i],
                self.it_tokens[i],
            ]
            for i in range(len(self.it_seq))
        ]
        calls = {**{k: old[p] for k, p in self.open_calls.items()}, **calls}
        self.open_calls = {}
        for name in ("it_seq", "it_end_seq", "it_tokens"):
            setattr(self, name, array("q"))
        for name in ("it_start", "it_end", "it_key", "it_cost", "block_max"):
            setattr(self, name, array("d"))
        self.it_kind, self.it_err = array("b"), array("b")
        self.it_session, self.it_name = array("l"), array("l")
        self.err_pre = array("q", [0])
        self.cost_pre, self.tokens_pre = array("d", [0.0]), array("q", [0])
        self.session_lo, self.session_hi = {}, {}
        self.item_sessions, self.tool_pos = array("l"), array("l")
        return sorted(old + rows, key=lambda r: (r[0], r[1])), calls

    # --- reading -------------------------------------------------------------------------------
    def nbytes(self) -> int:
        arrays = [v for v in vars(self).values() if isinstance(v, array)]
        return sum(a.itemsize * len(a) for a in arrays) + 200 * (
            len(self.spans) + len(self.checkpoints) + len(self.rewinds) + len(self.session_seqs)
        )

    def ms_at(self, seq: int) -> float:
        """The time of the event at seq (or of the first one after it)."""
        i = min(bisect_left(self.ev_seq, seq), len(self.ev_seq) - 1)
        return self.ev_ms[i]

    def seq_at(self, ms: float) -> int:
        """The seq of the first event at or after `ms` (the last event when none is)."""
        i = min(bisect_left(self.ev_ms, ms), len(self.ev_seq) - 1)
        return self.ev_seq[i]

    def sessions_in(self, lo: int, hi: int) -> list[int]:
        """Session indexes with events in [lo, hi], in order."""
        return sorted(s for s, (a, b) in self.session_seqs.items() if a <= hi and b >= lo)

    def item_range(self, first: int, last: int, lo: int, hi: int) -> tuple[int, int]:
        """The items of sessions first..last (a lane) whose seq is in [lo, hi]."""
        i = bisect_left(self.item_sessions, first)
        j = bisect_right(self.item_sessions, last) - 1
        if i > j:
            return 0, 0
        a, b = self.session_lo[self.item_sessions[i]], self.session_hi[self.item_sessions[j]]
        return bisect_left(self.it_seq, lo, a, b), bisect_right(self.it_seq, hi, a, b)

    def longest(self, a: int, b: int, now_ms: float) -> tuple[int, float]:
        """The longest item in [a, b): its position and duration (a running call counts up to
        `now_ms`). The partial blocks at the ends item by item; in between, only the block whose
        maximum is largest."""
        best, best_d = -1, -1.0
        start, end = self.it_start, self.it_end
        full_lo, full_hi = -(-a // BLOCK), b // BLOCK
        if full_lo >= full_hi:
            scans = [(a, b)]
        else:
            scans = [(a, full_lo * BLOCK), (full_hi * BLOCK, b)]
            blocks = self.block_max
            k = max(range(full_lo, full_hi), key=blocks.__getitem__)
            scans.append((k * BLOCK, (k + 1) * BLOCK))
        for lo, hi in scans:
            for j in range(lo, hi):
                if end[j] != OPEN and end[j] - start[j] > best_d:
                    best, best_d = j, end[j] - start[j]
        for pos in self.open_calls.values():
            if a <= pos < b and now_ms - start[pos] > best_d:
                best, best_d = pos, now_ms - start[pos]
        if best < 0:
            best = a
        return best, max(best_d, 0.0)

    def usage_at(self, seq: int) -> tuple[int, float]:
        """The run's cumulative tokens and dollars after the events up to seq."""
        i = bisect_right(self.turn_seq, seq)
        return (self.cum_tokens[i - 1], self.cum_cost[i - 1]) if i else (0, 0.0)


# The payload keys each kind needs, read by the database as one small JSON array a row (the
# payloads themselves, a tool's whole output say, never reach Python).
KEYS = {
    kind: events.keys(kind, *names)
    for kind, names in {
        "model.turn": (
            "latency_ms",
            "usage.input_tokens",
            "usage.output_tokens",
            "usage.cache_read_input_tokens",
            "usage.cache_creation_input_tokens",
            "cost_usd",
            "model",
        ),
        "tool.call": ("tool_use_id", "name"),
        "tool.result": ("tool_use_id", "is_error"),
        "run.status": ("to", "from"),
        "checkpoint.created": ("checkpoint_id", "kind", "label", "number"),
        "run.rewound": ("checkpoint_id", "to_seq", "from_seq", "number"),
    }.items()
}


def _extract(keys: tuple[str, ...]) -> str:
    """The keys as one JSON array: the payload is parsed once a row, by the database."""
    if connection.vendor == "postgresql":
        paths = ", ".join("payload #> '{" + k.replace(".", ",") + "}'" for k in keys)
        return f"jsonb_build_array({paths})::text"
    paths = ", ".join(f"'$.{k}'" for k in keys)
    return f"json_extract(payload, {paths})"


def _read(run_id: int, after: int, upto: int) -> list[tuple]:
    """(seq, kind, session_id, created_at, the kind's keys as JSON text or None), in seq order."""
    cases = " ".join(f"WHEN '{kind}' THEN {_extract(keys)}" for kind, keys in KEYS.items())
    sql = (
        f"SELECT seq, kind, session_id, {_epoch_ms()}, CASE kind {cases} END "
        f"FROM {Event._meta.db_table} WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, after, upto])
        return cursor.fetchall()


def _epoch_ms() -> str:
    """created_at in ms since the epoch, computed by the database (no datetime per row)."""
    if connection.vendor == "postgresql":
        return "EXTRACT(EPOCH FROM created_at) * 1000"
    return "(julianday(created_at) - 2440587.5) * 86400000.0"  # stored as UTC text


# --- this process's indexes --------------------------------------------------------------------
LOCK = threading.Lock()
_INDEXES: OrderedDict[tuple[int, float], RunIndex] = OrderedDict()


def index_for(run: Run) -> RunIndex:
    """The run's index, extended to its last event. Call with LOCK held."""
    key = (run.pk, run.created_at.timestamp())  # a test database may hand an id out again
    index = _INDEXES.get(key)
    if index is None or index.last_seq > run.last_seq:
        index = _INDEXES[key] = RunIndex(run.pk)
    _INDEXES.move_to_end(key)
    index.extend(run.last_seq)
    _trim()
    return index


def _trim() -> None:
    total = sum(i.nbytes() for i in _INDEXES.values())
    while total > MEMORY_CAP_BYTES and len(_INDEXES) > 1:
        _, dropped = _INDEXES.popitem(last=False)
        total -= dropped.nbytes()


def forget_all() -> None:
    """Drop every index (tests)."""
    with LOCK:
        _INDEXES.clear()
