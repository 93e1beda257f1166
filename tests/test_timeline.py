"""The timeline's answers (dashboard.timeline over dashboard.timeline_index), exact on a small
hand-made run of three sessions, and bounded and consistent on a 20,000-event run."""

from __future__ import annotations

import statistics
from decimal import Decimal

import pytest

from agents.models import Event, Run
from dashboard import timeline, timeline_index
from tests.timeline_runs import T0, big_run, turn, write_log

T0_MS = T0.timestamp() * 1000


def ms(seconds: float) -> float:
    return round(T0_MS + seconds * 1000, 1)


# (seconds after T0, kind, payload, session)
HAND_MADE = [
    (0.0, "run.created", {"goal": "g"}, None),  # 1
    (0.0, "run.status", {"from": "queued", "to": "running"}, None),  # 2
    (1.0, "session.started", {"index": 1}, 1),  # 3
    (3.0, "model.turn", turn(2000, 100, 10, "0.01", "bash"), 1),  # 4
    (3.0, "tool.call", {"tool_use_id": "t1", "name": "bash", "input": {}}, 1),  # 5
    (5.0, "tool.result", {"tool_use_id": "t1", "name": "bash", "output": "", "is_error": False}, 1),
    (8.0, "model.turn", turn(3000, 200, 20, "0.02", "read_file"), 1),  # 7
    (8.0, "tool.call", {"tool_use_id": "t2", "name": "read_file", "input": {}}, 1),  # 8
    (
        8.5,
        "tool.result",
        {"tool_use_id": "t2", "name": "read_file", "output": "no such file", "is_error": True},
        1,
    ),  # 9
    (9.0, "checkpoint.created", {"checkpoint_id": 1, "kind": "session_end", "label": ""}, 1),
    (9.0, "session.ended", {"index": 1, "reason": "handoff"}, 1),  # 11
    (10.0, "session.started", {"index": 2}, 2),  # 12
    (12.0, "model.turn", turn(1500, 300, 30, "0.03", "bash"), 2),  # 13
    (12.0, "approval.requested", {"tool": "bash", "approval_id": 1, "input": {}}, 2),  # 14
    (12.0, "run.status", {"from": "running", "to": "awaiting_approval"}, None),  # 15
    (20.0, "run.status", {"from": "awaiting_approval", "to": "queued"}, None),  # 16
    (20.5, "run.status", {"from": "queued", "to": "running"}, None),  # 17
    (20.5, "tool.call", {"tool_use_id": "t3", "name": "bash", "input": {}}, 2),  # 18
    (
        23.5,
        "tool.result",
        {"tool_use_id": "t3", "name": "bash", "output": "", "is_error": False},
        2,
    ),  # 19
    (24.0, "checkpoint.created", {"checkpoint_id": 2, "kind": "manual", "label": "before"}, 2),
    (25.0, "model.turn", turn(500, 50, 5, "0.005", "write_file"), 2),  # 21
    (25.0, "tool.call", {"tool_use_id": "t4", "name": "write_file", "input": {}}, 2),  # 22
    (26.0, "run.status", {"from": "running", "to": "paused"}, None),  # 23
    (30.0, "run.rewound", {"checkpoint_id": 2, "to_seq": 20, "from_seq": 23}, None),  # 24
    (30.0, "run.status", {"from": "paused", "to": "queued"}, None),  # 25
    (31.0, "session.started", {"index": 3}, 3),  # 26
    (33.0, "model.turn", turn(1000, 100, 10, "0.01", "bash"), 3),  # 27
    (33.0, "tool.call", {"tool_use_id": "t5", "name": "bash", "input": {}}, 3),  # 28
]


@pytest.fixture(autouse=True)
def _fresh_indexes():
    timeline_index.forget_all()
    yield
    timeline_index.forget_all()


def hand_made(owner, upto: int = len(HAND_MADE)) -> Run:
    run = Run.objects.create(
        goal="g",
        model="claude-test",
        created_by=owner,
        max_tokens=1000,
        max_cost_usd=Decimal("0.5"),
    )
    return write_log(run, HAND_MADE[:upto])


def answer(run: Run, first: int = 1, last: int | None = None, width: int = 1200) -> dict:
    run.refresh_from_db()
    with timeline_index.LOCK:
        index = timeline_index.index_for(run)
        window = timeline.Window(first, run.last_seq if last is None else last, width)
        return timeline.Answer(run, index, window).as_json()


def item(lane, kind, name, session, seq, end_seq, start, end, *, error=False, abandoned=False):
    return {
        "lane": lane,
        "kind": kind,
        "name": name,
        "session": session,
        "seq": seq,
        "end_seq": end_seq,
        "start": ms(start),
        "end": None if end is None else ms(end),
        "running": end is None,
        "error": error,
        "abandoned": abandoned,
    }


EXPECTED_ITEMS = [
    item(0, "turn", "claude-test", 1, 4, 4, 1.0, 3.0),
    item(0, "tool", "bash", 1, 5, 6, 3.0, 5.0),
    item(0, "turn", "claude-test", 1, 7, 7, 5.0, 8.0),
    item(0, "tool", "read_file", 1, 8, 9, 8.0, 8.5, error=True),
    item(1, "turn", "claude-test", 2, 13, 13, 10.5, 12.0),
    item(1, "tool", "bash", 2, 18, 19, 20.5, 23.5),
    item(1, "turn", "claude-test", 2, 21, 21, 24.5, 25.0, abandoned=True),
    item(1, "tool", "write_file", 2, 22, None, 25.0, None, abandoned=True),
    item(2, "turn", "claude-test", 3, 27, 27, 32.0, 33.0),
    item(2, "tool", "bash", 3, 28, None, 33.0, None),
]


def test_the_whole_hand_made_run_is_drawn_item_by_item(owner):
    data = answer(hand_made(owner))
    w = data["window"]
    assert (w["from"], w["to"], w["mode"]) == (1, 28, "detail")
    assert (w["start_ms"], w["end_ms"]) == (ms(0), ms(33))
    assert w["counts"] == {"events": 28, "items": 10, "errors": 1, "lanes": 3}
    assert len(w["bucket_seqs"]) == 1200 // 4 + 1 and w["bucket_seqs"][-1] == 28
    assert [lane["label"] for lane in data["lanes"]] == ["Session 1", "Session 2", "Session 3"]
    assert data["items"] == EXPECTED_ITEMS
    assert "buckets" not in data


def test_waits_checkpoints_and_the_rewind(owner):
    data = answer(hand_made(owner))
    assert data["spans"] == [
        {"kind": "approval", "seq": 15, "end_seq": 16, "start": ms(12), "end": ms(20),
         "open": False, "merged": 1},
        {"kind": "paused", "seq": 23, "end_seq": 25, "start": ms(26), "end": ms(30),
         "open": False, "merged": 1},
    ]  # fmt: skip
    assert data["checkpoints"] == [
        {"seq": 10, "ms": ms(9), "id": 1, "kind": "session_end", "label": "", "abandoned": False},
        {"seq": 20, "ms": ms(24), "id": 2, "kind": "manual", "label": "before", "abandoned": False},
    ]
    assert data["rewinds"] == [
        {"seq": 24, "ms": ms(30), "checkpoint_id": 2, "to_seq": 20, "to_ms": ms(24),
         "from_seq": 23},
    ]  # fmt: skip


def test_the_charts(owner):
    charts = answer(hand_made(owner))["charts"]
    assert charts["usage"] == {
        "t": [ms(0), ms(3), ms(8), ms(12), ms(25), ms(33)],
        "tokens": [0, 110, 330, 660, 715, 825],
        "cost": [0.0, 0.01, 0.03, 0.06, 0.065, 0.075],
        "max_tokens": 1000,
        "max_cost_usd": 0.5,
    }
    assert charts["sessions"] == [
        {"label": "1", "cost": 0.03, "tokens": 330},
        {"label": "2", "cost": 0.035, "tokens": 385},
        {"label": "3", "cost": 0.01, "tokens": 110},
    ]
    assert charts["tools"] == {
        "sampled": False,
        "calls": 3,
        "rows": [
            {"name": "bash", "n": 2, "median_ms": 2500.0, "p90_ms": 2900.0},
            {"name": "read_file", "n": 1, "median_ms": 500.0, "p90_ms": 500.0},
        ],
    }


def test_a_window_holds_only_what_is_in_it(owner):
    data = answer(hand_made(owner), first=13, last=19)
    assert [lane["label"] for lane in data["lanes"]] == ["Session 2"]
    assert [(i["seq"], i["lane"]) for i in data["items"]] == [(13, 0), (18, 0)]
    assert (data["window"]["start_ms"], data["window"]["end_ms"]) == (ms(12), ms(23.5))
    assert [s["kind"] for s in data["spans"]] == ["approval"]
    assert data["checkpoints"] == [] and data["rewinds"] == []
    assert data["charts"]["usage"]["tokens"] == [330, 660]  # from where the window starts
    assert data["charts"]["sessions"] == [{"label": "2", "cost": 0.03, "tokens": 330}]


def test_an_index_extended_with_new_events_answers_as_a_fresh_one(owner):
    run = hand_made(owner, upto=18)  # t3 called, not answered yet
    first = answer(run)
    running = [i for i in first["items"] if i["running"]]
    assert [i["seq"] for i in running] == [18]
    write_log(run, HAND_MADE[18:])
    extended = answer(run)
    timeline_index.forget_all()
    assert extended == answer(run) and extended["items"] == EXPECTED_ITEMS


def test_items_of_an_older_session_arriving_late_are_sorted_into_its_lane(owner):
    run = hand_made(owner, upto=13)
    answer(run)
    late = [
        (13.0, "tool.call", {"tool_use_id": "t9", "name": "bash", "input": {}}, 1),
        (14.0, "tool.result", {"tool_use_id": "t9", "name": "bash", "is_error": True}, 1),
    ]
    write_log(run, late)
    data = answer(run)
    assert [(i["lane"], i["seq"]) for i in data["items"]] == [
        (0, 4), (0, 5), (0, 7), (0, 8), (0, 14), (1, 13),
    ]  # fmt: skip
    assert data["window"]["counts"]["errors"] == 2


@pytest.fixture
def big(owner):
    run = Run.objects.create(goal="long", model="claude-test", created_by=owner, max_tokens=10**8)
    return big_run(run, 20_000)


def durations_from_the_log(run: Run) -> list[tuple[int, float, bool]]:
    """(seq, duration ms, error) of every turn and finished call, read plainly from the log."""
    calls, out = {}, []
    for seq, kind, payload, created in Event.objects.filter(run=run).values_list(
        "seq", "kind", "payload", "created_at"
    ):
        t = created.timestamp() * 1000
        if kind == "model.turn":
            out.append((seq, payload["latency_ms"], False))
        elif kind == "tool.call":
            calls[payload["tool_use_id"]] = (seq, t, payload["name"])
        elif kind == "tool.result":
            seq0, t0, _ = calls.pop(payload["tool_use_id"])
            out.append((seq0, t - t0, payload["is_error"]))
    return out


def test_a_20k_event_run_zoomed_out_is_blocks_per_lane(big):
    data = answer(big, width=1200)
    w, truth = data["window"], durations_from_the_log(big)
    assert w["mode"] == "buckets" and "items" not in data
    assert w["counts"]["items"] == len(truth) == sum(b["n"] for b in data["buckets"])
    assert (
        w["counts"]["errors"]
        == sum(e for *_, e in truth)
        == sum(b["errors"] for b in data["buckets"])
    )
    assert len(data["lanes"]) <= timeline.MAX_LANES
    assert data["lanes"][0]["label"].startswith("Sessions 1\u2013")
    assert all(0 <= b["b"] < 300 for b in data["buckets"])
    assert max(b["longest"]["ms"] for b in data["buckets"]) == round(max(d for _, d, _ in truth), 1)
    assert len(data["checkpoints"]) <= timeline.MAX_MARKS
    assert len(data["charts"]["sessions"]) <= timeline.MAX_SESSION_BARS
    assert len(data["charts"]["usage"]["t"]) <= 301
    assert [s["kind"] for s in data["spans"]][:2] == ["approval", "paused"]
    bash_seqs = tool_seqs(big, "bash")
    bash = [d for seq, d, _ in truth if seq in bash_seqs]
    row = next(r for r in data["charts"]["tools"]["rows"] if r["name"] == "bash")
    assert row["n"] == len(bash) and row["median_ms"] == round(statistics.median(bash), 1)


def tool_seqs(run: Run, name: str) -> set[int]:
    return set(
        Event.objects.filter(run=run, kind="tool.call", payload__name=name).values_list(
            "seq", flat=True
        )
    )


def test_a_narrow_window_of_the_big_run_is_drawn_item_by_item(big):
    data = answer(big, first=10_000, last=10_800, width=4000)
    assert data["window"]["mode"] == "detail"
    assert all(10_000 <= i["seq"] <= 10_800 for i in data["items"])
    assert len(data["window"]["bucket_seqs"]) == 1001


def test_the_indexes_stay_under_their_memory_cap(big, owner, monkeypatch):
    other = hand_made(owner)
    answer(big)
    size = next(iter(timeline_index._INDEXES.values())).nbytes()
    monkeypatch.setattr(timeline_index, "MEMORY_CAP_BYTES", size + 100)
    answer(other)
    answer(big)  # the small one is dropped to make room
    assert [k[0] for k in timeline_index._INDEXES] == [big.pk]
