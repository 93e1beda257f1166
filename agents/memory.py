"""Memory: what a run learned (run memory) and what a project's runs share (project memory).

Run memory is events: `memory.saved`, `memory.changed`, `memory.deleted` (the agent's `remember`
tool, or a person), and a run's memory now is a fold over its live branch, so a rewind forgets
what was learned after the checkpoint and a fork keeps what its origin knew at the checkpoint.
How often an entry was recalled (the `recall` tool's results list their hits) ranks it.

Project memory is a table (ProjectMemory): entries the agent promoted (`remember` with
`project: true`) or a person did; every later run of the project is told them at wake-up. Each
change to it is also an event on the run it was made through, so the audit log shows it.

A session's first message carries the memory within a token budget
(SHIFTLOG["MEMORY_WAKE_TOKENS"]): pinned entries first, then the most used, then the newest;
what did not fit is listed by key.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agents import eventlog, inputs, sandbox
from agents.branches import abandoned, in_ranges
from agents.eventlog import NewEvent
from agents.models import Checkpoint, Event, EventKind, ProjectMemory, Run

KINDS = (EventKind.MEMORY_SAVED, EventKind.MEMORY_CHANGED, EventKind.MEMORY_DELETED)
RUN, PROJECT = "run", "project"
MAX_KEY = 100
MAX_TEXT = 4_000
RECALL_LIMIT = 20
# A fork of a fork of …: how far back a run's memory is looked for.
MAX_FORK_DEPTH = 50


@dataclass
class Entry:
    scope: str  # run | project
    key: str
    text: str
    pinned: bool = False
    uses: int = 0
    at: float = 0.0  # when it last changed (a timestamp): newer first
    by: str = ""  # who last changed it

    @property
    def ref(self) -> str:
        return f"{self.scope}:{self.key}"

    def as_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "key": self.key,
            "text": self.text,
            "pinned": self.pinned,
            "uses": self.uses,
            "by": self.by,
        }


# --- reading ----------------------------------------------------------------------------------
def _history(run_id: int, upto: int | None = None, depth: int = 0) -> list[tuple]:
    """(seq, kind, actor, payload, created_at) of the run's memory events and recall results on
    its live branch, after those of the run it was forked from (up to the checkpoint, on the
    branch that was live then)."""
    rows: list[tuple] = []
    run = Run.objects.filter(pk=run_id).values("forked_from_id", "created_at", "last_seq").first()
    if run and run["forked_from_id"] and depth < MAX_FORK_DEPTH:
        origin = Checkpoint.objects.filter(pk=run["forked_from_id"]).values("run_id", "seq").first()
        if origin:
            rows = _history(origin["run_id"], origin["seq"], depth + 1)
    if upto is None:
        ranges = Event.objects.abandoned_ranges(run_id)
        if run is not None:
            own = _scanned(run_id, run["created_at"], run["last_seq"])
            return rows + [r for r in own if not in_ranges(r[0], ranges)]
    else:  # the branches abandoned by then
        ranges = abandoned(
            (p["to_seq"], p["from_seq"])
            for p in Event.objects.filter(run_id=run_id, kind=EventKind.RUN_REWOUND, seq__lte=upto)
            .order_by("seq")
            .values_list("payload", flat=True)
        )
    qs = Event.objects.on_live_branch(run_id, ranges).filter(_MEMORY_ROWS)
    if upto is not None:
        qs = qs.filter(seq__lte=upto)
    rows += qs.order_by("seq").values_list("seq", "kind", "actor", "payload", "created_at")
    return rows


_MEMORY_ROWS = Q(kind__in=KINDS) | Q(kind=EventKind.TOOL_RESULT, payload__name="recall")

# A run's memory rows (every branch), read once and then only what is newer: finding the recall
# results means looking at every tool.result of the run, which at each session start cost time
# in proportion to the whole history. The log is append-only and every event up to the run's
# last_seq, read before, is committed, so (scanned, last_seq] is all that can be new. Keyed by
# the run's creation time too (SQLite may give a deleted run's id to a new one).
_scans: OrderedDict[tuple[int, Any], tuple[int, list[tuple]]] = OrderedDict()
_SCANS_KEPT = 64
_scans_lock = threading.Lock()


def _scanned(run_id: int, created_at: Any, last_seq: int) -> list[tuple]:
    key = (run_id, created_at)
    with _scans_lock:
        scanned, rows = _scans.get(key, (0, []))
    if last_seq > scanned:
        new = list(
            Event.objects.filter(run_id=run_id, seq__gt=scanned, seq__lte=last_seq)
            .filter(_MEMORY_ROWS)
            .order_by("seq")
            .values_list("seq", "kind", "actor", "payload", "created_at")
        )
        rows = [*rows, *new]
        with _scans_lock:
            if _scans.get(key, (0, []))[0] < last_seq:
                _scans[key] = (last_seq, rows)
            _scans.move_to_end(key)
            while len(_scans) > _SCANS_KEPT:
                _scans.popitem(last=False)
    return rows


def _fold(rows: list[tuple]) -> tuple[dict[str, Entry], Counter]:
    entries: dict[str, Entry] = {}
    uses: Counter = Counter()
    for _seq, kind, actor, p, at in rows:
        if kind == EventKind.TOOL_RESULT:
            uses.update((p.get("data") or {}).get("memory_hits") or [])
            continue
        if p.get("scope", RUN) != RUN:
            continue  # a project entry's change: ProjectMemory holds it, the event records it
        key = p.get("key", "")
        if kind == EventKind.MEMORY_DELETED:
            entries.pop(key, None)
            continue
        entry = entries.get(key)
        if entry is None:  # saving again under a key keeps its pin
            entry = entries[key] = Entry(RUN, key, p.get("text", ""))
        if "text" in p:
            entry.text = p["text"]
        if "pinned" in p:
            entry.pinned = bool(p["pinned"])
        entry.at, entry.by = at.timestamp(), actor
    return entries, uses


def run_entries(run_id: int) -> list[Entry]:
    """The run's memory now (its live branch), with how often each entry was recalled."""
    entries, uses = _fold(_history(run_id))
    for entry in entries.values():
        entry.uses = uses[entry.ref]
    return list(entries.values())


def project_entries(project: str, uses: Counter | None = None) -> list[Entry]:
    if not project:
        return []
    return [
        Entry(
            PROJECT,
            row.key,
            row.text,
            row.pinned,
            (uses or Counter())[f"{PROJECT}:{row.key}"],
            row.updated_at.timestamp(),
            row.updated_by,
        )
        for row in ProjectMemory.objects.filter(project=project).order_by("key")
    ]


def entries(run: Run) -> list[Entry]:
    """Run memory, then the project's entries (those whose key the run has not overridden)."""
    rows = _history(run.pk)
    own, uses = _fold(rows)
    for entry in own.values():
        entry.uses = uses[entry.ref]
    shared = [e for e in project_entries(run.project, uses) if e.key not in own]
    return [*own.values(), *shared]


def ranked(items: list[Entry]) -> list[Entry]:
    """Pinned first, then the most used, then the newest."""
    return sorted(items, key=lambda e: (not e.pinned, -e.uses, -e.at))


def _line(entry: Entry) -> str:
    where = "project" if entry.scope == PROJECT else "run"
    pin = ", pinned" if entry.pinned else ""
    return f"- [{where}{pin}] {entry.key}: {entry.text}"


def wake_up_section(run: Run, budget: int | None = None) -> tuple[str, list[str]]:
    """The memory part of a first message, and the keys left out to keep within the budget
    (tokens, estimated at 4 characters a token; pinned entries always go in)."""
    budget = settings.SHIFTLOG["MEMORY_WAKE_TOKENS"] if budget is None else budget
    items = ranked(entries(run))
    if not items:
        return "", []
    # An external agent has no `recall` or `remember` (unless it is given Shiftlog's MCP
    # server): its first message does not name tools it lacks.
    tools = "" if run.is_external else "; `recall` searches it, `remember` adds to it"
    heading = (
        "# Memory (what earlier sessions"
        + (f" and runs of project {run.project!r}" if run.project else "")
        + f" learned{tools})"
    )
    lines, left_out, used = [], [], 0
    for entry in items:
        line = _line(entry)
        cost = -(-len(line) // 4)
        if entry.pinned or used + cost <= budget:
            lines.append(line)
            used += cost
        else:
            left_out.append(entry.key)
    if left_out:
        lines.append(
            f"Left out to keep within {budget} tokens"
            + ("" if run.is_external else " (`recall` reads them)")
            + ": "
            + ", ".join(left_out)
        )
    return heading + "\n" + "\n".join(lines), left_out


def changes_by_people(
    run_id: int, after_seq: int, ranges: list[tuple[int, int]] | None = None
) -> list[str]:
    """What people changed in the memory since `after_seq` (on the live branch, without the
    `ranges` abandoned, when the caller has them), in words."""
    qs = (
        Event.objects.on_live_branch(run_id, ranges)
        .filter(kind__in=KINDS, seq__gt=after_seq)
        .exclude(actor__in=["agent", "harness"])
        .order_by("seq")
    )
    lines = []
    for kind, actor, p in qs.values_list("kind", "actor", "payload"):
        if not (actor.startswith("user:") or actor.startswith("cli:")):
            continue
        lines.append(f"{actor} {describe(kind, p)}")
    return lines


def describe(kind: str, p: dict[str, Any]) -> str:
    where = "project memory" if p.get("scope") == PROJECT else "run memory"
    key = p.get("key", "?")
    if kind == EventKind.MEMORY_DELETED:
        return f"deleted `{key}` from {where}"
    bits = []
    if p.get("promoted"):
        bits.append("promoted it to project memory")
    if "text" in p:
        bits.append(f"text: {_short(p['text'])}")
    if "pinned" in p:
        bits.append("pinned" if p["pinned"] else "unpinned")
    verb = "saved" if kind == EventKind.MEMORY_SAVED else "changed"
    also = " and project memory" if p.get("project") else ""
    return f"{verb} `{key}` in {where}{also}" + (f" ({'; '.join(bits)})" if bits else "")


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the agent's tools ------------------------------------------------------------------------
def remember(
    run: Run, tool_input: dict[str, Any], *, actor: str
) -> tuple[sandbox.ToolResult, list]:
    """The `remember` tool: the result, and the event that records the entry (appended with
    the result). With `project`, the entry is promoted to the run's project memory as well."""
    key, text = tool_input["key"].strip(), tool_input["text"].strip()
    if not key or not text:
        return sandbox.ToolResult("remember: key and text must not be blank", is_error=True), []
    promote = bool(tool_input.get("project"))
    payload: dict[str, Any] = {"key": key, "text": text, "scope": RUN}
    note = ""
    if promote and not run.project:
        note = " This run belongs to no project, so it went into run memory only."
    elif promote:
        _upsert_project(run, key, text=text, actor=actor)
        payload["project"] = True
    where = f"run memory and project {run.project!r}" if payload.get("project") else "run memory"
    result = sandbox.ToolResult(f"Remembered {key!r} in {where}.{note}", data={"key": key})
    return result, [NewEvent(EventKind.MEMORY_SAVED, payload, actor=actor)]


def recall(run: Run, query: str) -> sandbox.ToolResult:
    """The `recall` tool: entries whose key or text holds the query (case-insensitive), or any
    of its words; the most matching first. `*` lists them all."""
    query = query.strip().lower()
    words = [w for w in query.split() if len(w) > 1]
    scored = []
    for entry in entries(run):
        hay = f"{entry.key}\n{entry.text}".lower()
        whole = query == "*" or query in hay
        score = len(words) + 1 if whole else sum(w in hay for w in words)
        if score:
            scored.append((score, entry))
    scored.sort(key=lambda pair: (-pair[0], not pair[1].pinned, -pair[1].uses, -pair[1].at))
    found = [entry for _, entry in scored[:RECALL_LIMIT]]
    if not found:
        return sandbox.ToolResult(f"Nothing in memory matches {query!r}.", data={"memory_hits": []})
    lines = [_line(e) for e in found]
    more = len(scored) - len(found)
    if more:
        lines.append(f"({more} more match; narrow the query)")
    return sandbox.ToolResult("\n".join(lines), data={"memory_hits": [e.ref for e in found]})


# --- people -----------------------------------------------------------------------------------
def _clean_key(key: Any) -> str:
    return inputs.text(key, what="a memory key", max_length=MAX_KEY, field="key")


def _clean_text(text: Any) -> str:
    return inputs.text(text, what="a memory entry's text", max_length=MAX_TEXT, field="text")


def _upsert_project(run: Run, key: str, *, actor: str, **fields: Any) -> ProjectMemory:
    row, _ = ProjectMemory.objects.update_or_create(
        project=run.project,
        key=key,
        defaults={**fields, "source_run": run, "updated_by": actor, "updated_at": timezone.now()},
        create_defaults={
            "text": fields.get("text", ""),
            **fields,
            "source_run": run,
            "updated_by": actor,
        },
    )
    return row


def set_entry(
    run_id: int,
    key: Any,
    *,
    actor: str,
    text: Any = None,
    pinned: bool | None = None,
    scope: str = RUN,
) -> None:
    """A person adds or changes an entry (its text, its pin), of the run's memory or its
    project's: an event on the run either way."""
    run = Run.objects.get(pk=run_id)
    key = _clean_key(key)
    if scope not in (RUN, PROJECT):
        raise inputs.InputError("scope must be run or project", "scope")
    if scope == PROJECT and not run.project:
        raise inputs.InputError(f"run {run_id} belongs to no project", "scope")
    if text is not None:
        text = _clean_text(text)
    if scope == RUN:
        exists = any(e.key == key for e in run_entries(run_id))
    else:
        exists = ProjectMemory.objects.filter(project=run.project, key=key).exists()
    if not exists and text is None:
        raise inputs.InputError(f"no {scope} memory entry {key!r}", "key")
    payload: dict[str, Any] = {"key": key, "scope": scope}
    if text is not None:
        payload["text"] = text
    if pinned is not None:
        payload["pinned"] = bool(pinned)
    if scope == PROJECT:
        payload["project_name"] = run.project
    kind = EventKind.MEMORY_CHANGED if exists else EventKind.MEMORY_SAVED
    with transaction.atomic():
        if scope == PROJECT:
            fields = {k: payload[k] for k in ("text", "pinned") if k in payload}
            _upsert_project(run, key, actor=actor, **fields)
        eventlog.append(run_id, kind, payload, actor=actor)


def delete_entry(run_id: int, key: Any, *, actor: str, scope: str = RUN) -> None:
    run = Run.objects.get(pk=run_id)
    key = _clean_key(key)
    with transaction.atomic():
        if scope == PROJECT:
            deleted, _ = ProjectMemory.objects.filter(project=run.project, key=key).delete()
            if not run.project or not deleted:
                raise inputs.InputError(f"no project memory entry {key!r}", "key")
        elif not any(e.key == key for e in run_entries(run_id)):
            raise inputs.InputError(f"no run memory entry {key!r}", "key")
        payload = {"key": key, "scope": scope}
        if scope == PROJECT:
            payload["project_name"] = run.project
        eventlog.append(run_id, EventKind.MEMORY_DELETED, payload, actor=actor)


def promote(run_id: int, key: Any, *, actor: str) -> None:
    """A person promotes a run memory entry to the run's project memory."""
    run = Run.objects.get(pk=run_id)
    key = _clean_key(key)
    if not run.project:
        raise inputs.InputError(f"run {run_id} belongs to no project", "key")
    entry = next((e for e in run_entries(run_id) if e.key == key), None)
    if entry is None:
        raise inputs.InputError(f"no run memory entry {key!r}", "key")
    with transaction.atomic():
        _upsert_project(run, key, actor=actor, text=entry.text, pinned=entry.pinned)
        eventlog.append(
            run_id,
            EventKind.MEMORY_CHANGED,
            {
                "key": key,
                "scope": PROJECT,
                "text": entry.text,
                "promoted": True,
                "project_name": run.project,
            },
            actor=actor,
        )
