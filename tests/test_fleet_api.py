"""An external agent's fleet through the API: POST /api/v1/runs/{id}/spawn."""

from __future__ import annotations

import pytest

from agents.models import Event, FleetChild, Run
from tests.helpers import call, drive_until_idle, finish_turn, script
from tests.test_api_external import bearer, make_external, tarball

pytestmark = pytest.mark.django_db


def spawn_body(**extra) -> dict:
    return {
        "children": [
            {
                "goal": "add b.txt",
                "checks": ["test -f b.txt"],
                "from": "src",
                "script": script(
                    {"text": "w", "tool_calls": [call("write_file", path="b.txt", content="b")]},
                    finish_turn(),
                ),
            },
            {"goal": "nothing", "checks": ["true"], "script": script(finish_turn())},
        ],
        **extra,
    }


@pytest.fixture
def external_run(owner):
    api = bearer(owner, "read", "write")
    run_id = make_external(api)
    api.get(f"/api/v1/runs/{run_id}/context")
    r = api.put(
        f"/api/v1/runs/{run_id}/workspace",
        tarball({"src/a.txt": "a", "top.txt": "t"}),
        content_type="application/gzip",
    )
    assert r.status_code == 201, r.content
    return api, run_id


def test_an_external_agent_spawns_children_and_waits_for_them(external_run, owner):
    api, run_id = external_run
    r = api.post(
        f"/api/v1/runs/{run_id}/spawn",
        spawn_body(call_id="plan-1"),
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    answer = r.json()
    assert answer["run_status"] == "waiting_for_children"
    kids = list(Run.objects.filter(parent_id=run_id).order_by("pk"))
    assert answer["children"] == [k.pk for k in kids]
    assert sorted(p.name for p in kids[0].workspace_path.iterdir()) == ["a.txt"]
    assert kids[0].provider == "scripted" and kids[0].created_by == owner

    # The same call again: the same children, none made twice.
    again = api.post(
        f"/api/v1/runs/{run_id}/spawn",
        spawn_body(call_id="plan-1"),
        content_type="application/json",
    )
    assert again.status_code == 201 and again.json()["children"] == answer["children"]
    assert FleetChild.objects.filter(parent_id=run_id).count() == 2
    # A new spawn while it waits is refused: the run is not being driven.
    busy = api.post(f"/api/v1/runs/{run_id}/spawn", spawn_body(), content_type="application/json")
    assert busy.status_code == 409 and "waiting for children" in busy.json()["detail"]

    for kid in kids:
        assert drive_until_idle(kid).status == "succeeded"
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued"
    assert Event.objects.filter(run=run, kind="fleet.woke").count() == 1
    # The agent's next call reads how each child did.
    ctx = api.get(f"/api/v1/runs/{run_id}/context").json()
    told = [m["text"] for m in ctx["messages"] if m["text"].startswith("Your child runs:")]
    assert len(told) == 1 and f"Run {kids[0].pk} (succeeded" in told[0], ctx
    assert "Files changed: src/b.txt" in told[0]
    assert ctx["run_status"] == "running"
    merged = api.post(f"/api/v1/runs/{run_id}/merge-children", {}, content_type="application/json")
    assert merged.status_code == 200, merged.content
    body = merged.json()
    assert [(m["run_id"], m["result"]) for m in body["merges"]] == [
        (kids[0].pk, "applied"),
        (kids[1].pk, "applied"),
    ]
    assert body["merges"][0]["files"] == ["src/b.txt"] and body["run_status"] == "running"
    assert (Run.objects.get(pk=run_id).workspace_path / "src/b.txt").read_text() == "b"
    again = api.post(
        f"/api/v1/runs/{run_id}/merge-children",
        {"runs": [kids[0].pk]},
        content_type="application/json",
    ).json()
    assert "merged already" in again["output"] and again["merges"] == []
    shown = api.get(f"/api/v1/runs/{run_id}").json()
    assert shown["children"] == answer["children"] and shown["rollup"]["tokens"] >= 0


def test_bad_spawns_are_refused_and_make_nothing(external_run, owner):
    api, run_id = external_run
    bad = [
        ({"children": []}, 422),
        ({"children": [{"goal": "x", "checks": []}]}, 422),
        ({"children": [{"goal": "x", "checks": ["true"], "unknown": 1}]}, 422),
        ({"children": [{"goal": "x", "checks": ["true"], "from": "missing"}]}, 422),
        ({"children": [{"goal": "x", "checks": ["true"]}], "wait": "some"}, 422),
    ]
    for body, status in bad:
        r = api.post(f"/api/v1/runs/{run_id}/spawn", body, content_type="application/json")
        assert r.status_code == status, (body, r.content)
    assert not Run.objects.filter(parent_id=run_id).exists()
    reader = bearer(owner, "read")
    r = reader.post(f"/api/v1/runs/{run_id}/spawn", spawn_body(), content_type="application/json")
    assert r.status_code == 403
    assert Run.objects.get(pk=run_id).status == "running"
