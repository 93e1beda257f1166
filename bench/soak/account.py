"""The accounting at the end: every run in a legal state, nothing lost, nothing done twice."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

from .faults import Fault
from .viewers import Viewers

TERMINAL = {"succeeded", "failed", "cancelled"}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def account(run_ids: list[int], ledger: Path, viewers: Viewers, faults: list[Fault]) -> dict:
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db.models import Count, Max, Min

    from agents.models import Approval, Event, Run

    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids)}
    statuses = Counter(r.status for r in runs.values())
    stuck = sorted(pk for pk, r in runs.items() if r.status not in TERMINAL)

    lost_events = 0
    lost_runs = []
    per_run = (
        Event.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(n=Count("pk"), lo=Min("seq"), hi=Max("seq"))
    )
    for row in per_run:
        last = runs[row["run_id"]].last_seq
        gap = last - row["n"] + (row["lo"] != 1) + (row["hi"] != last)
        if gap:
            lost_events += gap
            lost_runs.append(row["run_id"])

    lines = ledger.read_text().splitlines() if ledger.exists() else []
    ran = Counter(tuple(line.split()[:2]) for line in lines if line.strip())
    doubled = sorted(f"run {r} call {t}" for (r, t), n in ran.items() if n > 1)

    lost_approvals = []
    decided_events = {
        e["payload__approval_id"]
        for e in Event.objects.filter(run_id__in=run_ids, kind="approval.decided").values(
            "payload__approval_id"
        )
    }
    for a in Approval.objects.filter(run_id__in=run_ids):
        if a.status == "pending" or a.pk not in decided_events:
            lost_approvals.append(f"approval {a.pk} of run {a.run_id} ({a.status})")

    stream_gaps = 0
    gap_notes = []
    for w in viewers.watches:
        run = runs.get(w.run_id)
        if run is None or run.status not in TERMINAL:
            continue  # its run never ended: counted among the stuck
        # A viewer leaves once it has seen the run end (the log's last seq then): events a
        # person's late act appends afterwards (a refused rewind's error) are not its to see.
        upto = min(run.last_seq, viewers.finished_runs.get(w.run_id, run.last_seq))
        if n := w.problems(upto):
            stream_gaps += n
            gap_notes.append(f"viewer of run {w.run_id}: {w.describe(upto)}")

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_store", stdout=out, stderr=err)
        missing_blobs = 0
    except CommandError:
        missing_blobs = len([line for line in err.getvalue().splitlines() if line.strip()])

    recovery = _recovery_ms(faults, run_ids)
    return {
        "runs": len(runs),
        "statuses": dict(statuses),
        "stuck_runs": len(stuck),
        "lost_events": lost_events,
        "doubled_tools": len(doubled),
        "lost_approvals": len(lost_approvals),
        "stream_gaps": stream_gaps,
        "missing_blobs": missing_blobs,
        "tool_calls": len(ran),
        "watches": len(viewers.watches),
        "recovery_p50_ms": percentile(recovery, 0.5),
        "recovery_p99_ms": percentile(recovery, 0.99),
        "details": {
            "stuck": [_describe(runs[pk]) for pk in stuck[:10]],
            "failed": [
                f"run {pk}: {r.status_reason[:160]}"
                for pk, r in runs.items()
                if r.status == "failed"
            ][:20],
            "lost_event_runs": lost_runs[:20],
            "doubled": doubled[:20],
            "lost_approvals": lost_approvals[:20],
            "stream": gap_notes[:20],
            "store": err.getvalue().splitlines()[:20],
        },
    }


def _recovery_ms(faults: list[Fault], run_ids: list[int]) -> list[float]:
    """Per fault: from the moment it struck to the next event of each run that was working then
    (queued or running, by the log: its last event before the fault was not a wait or an end)."""
    from agents.models import Event

    found: list[float] = []
    for fault in faults:
        if fault.detail.startswith(("could not", "simulated")):
            continue
        at = _aware(fault.at)
        for run_id in run_ids:
            before = (
                Event.objects.filter(run_id=run_id, created_at__lte=at).order_by("-seq").first()
            )
            if before is None or not _working(before):
                continue
            after = Event.objects.filter(run_id=run_id, created_at__gt=at).order_by("seq").first()
            if after is not None:
                found.append((after.created_at - at).total_seconds() * 1000)
    return found


def _working(event) -> bool:
    if event.kind == "run.status":
        return event.payload.get("to") in {"queued", "running"}
    return event.kind != "approval.requested"


def _aware(t: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, tz=UTC)


def _describe(run) -> str:
    from agents.models import Event

    last = Event.objects.filter(run=run).order_by("-seq")[:3]
    events = ", ".join(f"#{e.seq} {e.kind} {_short(e.payload)}" for e in reversed(last))
    lease = f"lease {run.lease_owner or '-'} until {run.lease_expires_at}"
    return f"run {run.pk} {run.status} ({run.status_reason[:80]}), {lease}; last: {events}"


def _short(payload) -> str:
    text = str(payload)
    return text if len(text) < 100 else text[:100] + "..."
