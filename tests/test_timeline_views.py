"""The timeline's pages and its data over HTTP: who may see them, every bad parameter, and no
inline script or style on them."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agents.models import Run
from dashboard import timeline_index
from tests.helpers import client_for
from tests.test_timeline import HAND_MADE, hand_made
from tests.timeline_runs import write_log

LAST = len(HAND_MADE)


@pytest.fixture(autouse=True)
def _fresh_indexes():
    timeline_index.forget_all()
    yield
    timeline_index.forget_all()


@pytest.fixture
def run(owner) -> Run:
    return hand_made(owner)


def data_url(run: Run, query: str = "") -> str:
    return f"/runs/{run.pk}/timeline.json" + (f"?{query}" if query else "")


def assert_no_inline_script_or_style(html: str) -> None:
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag, tag
    assert all(
        not body.strip() for body in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S)
    )
    assert not re.search(r"<style\b", html)
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)


def test_the_owner_sees_the_timeline_page(owner, run):
    response = client_for(owner).get(f"/runs/{run.pk}/timeline/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="tl-canvas"' in html and f'data-json="/runs/{run.pk}/timeline.json"' in html
    assert "vendor/uplot/1.6.32/uPlot.iife.min.js" in html and "shiftlog/timeline.js" in html
    assert "<details" in html and "tl-table" in html  # the text alternative
    assert 'aria-label="Timeline of run' in html
    assert "ws-connect" not in html
    assert_no_inline_script_or_style(html)


def test_the_run_page_links_to_its_timeline(owner, run):
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert f'<a class="timeline-link" href="/runs/{run.pk}/timeline/">Timeline</a>' in html


def test_the_owner_gets_the_whole_run_by_default(owner, run):
    response = client_for(owner).get(data_url(run))
    assert response.status_code == 200
    assert response["Server-Timing"].startswith("timeline;dur=")
    data = response.json()
    assert (data["window"]["from"], data["window"]["to"], data["window"]["width"]) == (
        1,
        LAST,
        1200,
    )
    assert len(data["items"]) == 10 and data["server_ms"] >= 0
    assert set(data) >= {"run", "window", "lanes", "items", "spans", "checkpoints", "rewinds",
                         "charts", "server_ms"}  # fmt: skip


def test_a_viewer_sees_it_too(viewer, run):
    assert client_for(viewer).get(f"/runs/{run.pk}/timeline/").status_code == 200
    assert client_for(viewer).get(data_url(run)).status_code == 200
    assert client_for(viewer).get(f"/runs/{run.pk}/events/13/").status_code == 200


def test_an_outsider_gets_404_everywhere(outsider, run):
    c = client_for(outsider)
    assert c.get(f"/runs/{run.pk}/timeline/").status_code == 404
    response = c.get(data_url(run))
    assert response.status_code == 404 and response.json() == {"error": "no such run"}
    assert c.get(f"/runs/{run.pk}/events/13/").status_code == 404


def test_a_run_that_does_not_exist_is_a_json_404(owner):
    response = client_for(owner).get("/runs/999999/timeline.json")
    assert response.status_code == 404 and "error" in response.json()


def test_anonymous_visitors_are_sent_to_log_in_or_get_401(run):
    c = Client()
    assert c.get(f"/runs/{run.pk}/timeline/").status_code == 302
    assert c.get(f"/runs/{run.pk}/events/13/").status_code == 302
    response = c.get(data_url(run))
    assert response.status_code == 401 and response.json() == {"error": "log in first"}


def test_only_get(owner, run):
    c = client_for(owner)
    response = c.post(data_url(run))
    assert response.status_code == 405 and response["Allow"] == "GET"
    assert c.post(f"/runs/{run.pk}/timeline/").status_code == 405


@pytest.mark.parametrize(
    "query, says",
    [
        ("from=abc", "from must be a whole number"),
        ("from=1.5", "from must be a whole number"),
        ("from=0", "from must be at least 1"),
        ("from=-3", "from must be at least 1"),
        ("to=0", "to must be at least 1"),
        ("to=x", "to must be a whole number"),
        ("from=10&to=5", "from must not be after to"),
        (f"from={LAST + 1}", f"from is past the run's last event (#{LAST})"),
        ("from=" + "9" * 40, "from must be at most"),
        ("to=" + "9" * 19, "to must be at most"),
        ("width=199", "width must be at least 200"),
        ("width=4001", "width must be at most 4,000"),
        ("width=" + "9" * 60, "width must be at most 4,000"),
        ("width=wide", "width must be a whole number"),
    ],
)
def test_bad_parameters_are_a_400_that_says_why(owner, run, query, says):
    response = client_for(owner).get(data_url(run, query))
    assert response.status_code == 400, response.content
    assert says in response.json()["error"]


def test_to_past_the_end_means_the_end(owner, run):
    data = client_for(owner).get(data_url(run, "from=13&to=999999&width=4000")).json()
    assert (data["window"]["from"], data["window"]["to"], data["window"]["width"]) == (
        13,
        LAST,
        4000,
    )


def test_new_events_reach_the_next_answer(owner, run):
    c = client_for(owner)
    assert c.get(data_url(run)).json()["window"]["counts"]["events"] == LAST
    write_log(run, [(40.0, "human.note", {"text": "hi"}, None)])
    assert c.get(data_url(run)).json()["window"]["counts"]["events"] == LAST + 1


def test_the_event_page_is_the_run_page_at_that_event(owner, run):
    html = client_for(owner).get(f"/runs/{run.pk}/events/13/").content.decode()
    target = run.events.get(seq=13)
    assert f'data-target="event-{target.pk}"' in html
    assert 'id="run-header"' in html and 'id="meters"' in html and 'id="sessions"' in html
    assert "not live" in html and f'href="/runs/{run.pk}/"' in html
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]
    assert seqs == list(range(1, LAST + 1))  # the 25 either side: all of this small run
    assert "ws-connect" not in html
    assert_no_inline_script_or_style(html)


def test_the_event_page_shows_25_events_either_side(owner):
    run = Run.objects.create(goal="g", model="m", created_by=owner)
    write_log(run, [(i, "human.note", {"text": f"n{i}"}, None) for i in range(200)])
    html = client_for(owner).get(f"/runs/{run.pk}/events/100/").content.decode()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]
    assert seqs == list(range(75, 126))
    assert f'href="/runs/{run.pk}/events/49/"' in html  # earlier: the 51 before these
    assert f'href="/runs/{run.pk}/events/151/"' in html


def test_an_event_that_does_not_exist_is_a_404(owner, run):
    assert client_for(owner).get(f"/runs/{run.pk}/events/{LAST + 1}/").status_code == 404
    assert client_for(owner).get(f"/runs/{run.pk}/events/0/").status_code == 404
