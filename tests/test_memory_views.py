"""The run page's memory panel and the wake-up inspector: who may read and change, each change
an event naming the person, the diff against the previous session's wake-up."""

from __future__ import annotations

import pytest

from agents import memory
from agents.models import Event, EventKind, ProjectMemory
from tests.helpers import call, client_for, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db


def two_session_run(owner):
    return drive_until_idle(
        make_run(
            created_by=owner,
            project="shop",
            turns=[
                {"tool_calls": [call("remember", key="deps", text="make deps first")]},
                {"tool_calls": [call("handoff", summary="half way")]},
                finish_turn(),
            ],
        )
    )


def test_the_run_page_shows_the_memory_and_links_each_sessions_wake_up(owner):
    run = two_session_run(owner)
    page = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert 'id="memory"' in page and "make deps first" in page
    assert "Promote to project" in page and "Add an entry" in page
    assert f"/runs/{run.pk}/sessions/2/wake-up" in page
    assert "What it knew at wake-up" in page


def test_the_wake_up_inspector_shows_parts_tokens_and_the_diff(owner):
    run = two_session_run(owner)
    c = client_for(owner)
    first = c.get(f"/runs/{run.pk}/sessions/1/wake-up").content.decode()
    assert "Session 1: what it knew at wake-up" in first and "The run's first session" in first
    assert 'data-part="goal"' in first and "(estimate)" in first
    second = c.get(f"/runs/{run.pk}/sessions/2/wake-up", headers={"HX-Request": "true"})
    html = second.content.decode()
    assert "<html" not in html  # the fragment for the run page
    assert "Compared with session 1" in html
    assert 'id="wake-up-memory"' in html and "w-new" in html  # memory is new in session 2
    assert 'id="wake-up-handoff"' in html and "half way" in html
    assert '<span class="add">+half way</span>' in html
    assert 'id="wake-up-goal" data-part="goal"' in html or "unchanged" in html
    assert c.get(f"/runs/{run.pk}/sessions/9/wake-up").status_code == 404


def test_people_edit_pin_delete_and_promote_from_the_page(owner):
    run = two_session_run(owner)
    c = client_for(owner)
    url = f"/runs/{run.pk}/memory/change"
    hx = {"HX-Request": "true"}
    r = c.post(url, {"action": "save", "key": "deps", "text": "make deps, then test"}, headers=hx)
    assert r.status_code == 200 and "make deps, then test" in r.content.decode()
    c.post(url, {"action": "pin", "key": "deps"}, headers=hx)
    c.post(url, {"action": "promote", "key": "deps"}, headers=hx)
    c.post(url, {"action": "save", "key": "new", "text": "added", "scope": "project"}, headers=hx)
    r = c.post(url, {"action": "delete", "key": "new", "scope": "project"}, headers=hx)
    assert "delete done" in r.content.decode()
    events = list(
        Event.objects.filter(run=run, actor="user:olivia", kind__startswith="memory.")
        .order_by("seq")
        .values_list("kind", "payload")
    )
    assert [k for k, _ in events] == [
        "memory.changed",
        "memory.changed",
        "memory.changed",
        "memory.saved",
        "memory.deleted",
    ]
    entry = memory.run_entries(run.pk)[0]
    assert entry.text == "make deps, then test" and entry.pinned
    assert list(ProjectMemory.objects.values_list("key", flat=True)) == ["deps"]
    bad = c.post(url, {"action": "delete", "key": "nope"}, headers=hx)
    assert bad.status_code == 400 and "no run memory entry" in bad.content.decode()
    plain = c.post(url, {"action": "pin", "key": "deps"})
    assert plain.status_code == 302


def test_watchers_see_the_memory_but_cannot_change_it(owner, viewer, outsider):
    run = two_session_run(owner)
    page = client_for(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert "make deps first" in page and "Add an entry" not in page
    url = f"/runs/{run.pk}/memory/change"
    assert client_for(viewer).post(url, {"action": "delete", "key": "deps"}).status_code == 403
    assert client_for(outsider).post(url, {"action": "delete", "key": "deps"}).status_code == 404
    assert client_for(outsider).get(f"/runs/{run.pk}/sessions/1/wake-up").status_code == 404
    assert not Event.objects.filter(run=run, kind=EventKind.MEMORY_DELETED).exists()


def test_the_new_run_form_takes_a_project(owner):
    r = client_for(owner).post(
        "/runs/new/", {"goal": "g", "checks": "true", "provider": "scripted", "project": "shop"}
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    run = owner.run_set.get()
    assert run.project == "shop"
