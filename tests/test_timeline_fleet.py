"""A fleet's parent's timeline: its children as lanes (one a child, "child #N") below its own,
their work in blocks of the parent's window, bounded; only children the user may see."""

from __future__ import annotations

import pytest

from agents.models import Run
from dashboard import timeline_index
from dashboard.fleets import timeline as timeline_fleet
from tests.helpers import client_for
from tests.test_timeline import HAND_MADE, hand_made, ms
from tests.timeline_runs import turn, write_log

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_indexes():
    timeline_index.forget_all()
    yield
    timeline_index.forget_all()


def child(parent: Run, owner, start: float, turns: int = 3, error: bool = False) -> Run:
    """A child whose session starts `start` s after T0, with `turns` turns a second apart."""
    kid = Run.objects.create(goal="piece", model="m", created_by=owner, parent=parent, depth=1)
    specs = [(start, "run.created", {"goal": "piece"}, None),
             (start, "session.started", {"index": 1}, 1)]  # fmt: skip
    for i in range(turns):
        t = start + 1 + i
        specs.append((t, "model.turn", turn(500, 10, 1, "0.001", "bash"), 1))
        specs.append((t, "tool.call", {"tool_use_id": f"c{i}", "name": "bash", "input": {}}, 1))
        specs.append(
            (t + 0.5, "tool.result",
             {"tool_use_id": f"c{i}", "name": "bash", "output": "", "is_error": error}, 1)
        )  # fmt: skip
    return write_log(kid, specs)


def data(user, run: Run, query: str = "") -> dict:
    response = client_for(user).get(f"/runs/{run.pk}/timeline.json" + query)
    assert response.status_code == 200, response.content
    return response.json()


def test_children_are_lanes_below_the_parents_own(owner):
    parent = hand_made(owner)
    a = child(parent, owner, start=2.0)
    b = child(parent, owner, start=40.0, turns=2, error=True)  # after the parent's last event
    d = data(owner, parent)
    own = len(d["lanes"])
    kids = d["children"]
    assert [lane["label"] for lane in kids["lanes"]] == [f"child #{a.pk}", f"child #{b.pk}"]
    assert [lane["id"] for lane in kids["lanes"]] == [own, own + 1]
    assert kids["total"] == 2
    by_lane = {}
    for block in kids["blocks"]:
        by_lane.setdefault(block["lane"], []).append(block)
    assert sum(x["n"] for x in by_lane[own]) == 6  # three turns and three calls
    assert sum(x["errors"] for x in by_lane[own + 1]) == 2
    first = min(by_lane[own], key=lambda x: x["b"])
    assert first["seq"] == 3 and first["sessions"] == [1, 1]  # the child's own seq and session
    # the window reaches the latest child's work, past the parent's own last event
    assert d["window"]["end_ms"] >= ms(40.0 + 2 + 0.5)
    assert max(x["b"] for x in by_lane[own + 1]) < 1200 // 4


def test_a_window_of_the_parents_past_shows_only_the_childrens_work_in_it(owner):
    parent = hand_made(owner)
    child(parent, owner, start=40.0)
    d = data(owner, parent, "?from=1&to=10")
    assert d["children"]["blocks"] == []
    assert d["window"]["end_ms"] < ms(40.0)


def test_a_run_without_children_has_no_children_key(owner):
    run = hand_made(owner)
    assert "children" not in data(owner, run)


def test_a_child_the_user_may_not_see_is_no_lane(owner, outsider):
    parent = hand_made(owner)
    mine = child(parent, owner, start=2.0)
    child(parent, outsider, start=3.0)
    lanes = data(owner, parent)["children"]["lanes"]
    assert [lane["run_id"] for lane in lanes] == [mine.pk]


def test_child_lanes_are_bounded(owner, monkeypatch):
    monkeypatch.setattr(timeline_fleet, "MAX_CHILD_LANES", 3)
    parent = hand_made(owner)
    kids = [child(parent, owner, start=2.0 + i, turns=1) for i in range(5)]
    d = data(owner, parent)
    assert [lane["run_id"] for lane in d["children"]["lanes"]] == [k.pk for k in kids[:3]]
    assert d["children"]["total"] == 5
    assert {b["lane"] for b in d["children"]["blocks"]} <= {
        lane["id"] for lane in d["children"]["lanes"]
    }


def test_a_child_with_no_event_yet_has_an_empty_lane(owner):
    parent = hand_made(owner)
    kid = Run.objects.create(goal="not started", model="m", created_by=owner, parent=parent)
    d = data(owner, parent)
    assert d["children"]["lanes"][0]["run_id"] == kid.pk and d["children"]["blocks"] == []


def test_the_timeline_page_keys_the_child_lanes_only_for_a_parent(owner):
    parent = hand_made(owner)
    c = client_for(owner)
    assert "k-child" not in c.get(f"/runs/{parent.pk}/timeline/").content.decode()
    child(parent, owner, start=2.0)
    html = c.get(f"/runs/{parent.pk}/timeline/").content.decode()
    assert "k-child" in html and f'data-run-url="/runs/{parent.pk}/"' in html


def test_the_last_seq_is_the_parents(owner):
    parent = hand_made(owner)
    child(parent, owner, start=2.0, turns=30)
    d = data(owner, parent)
    assert d["run"]["last_seq"] == len(HAND_MADE)
    assert d["window"]["bucket_seqs"][-1] == len(HAND_MADE)
