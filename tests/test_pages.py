"""Keyset pages: the runs list (boundaries, equal timestamps, filters carried by the links, bad
cursors, the bounded count), a run page's older sessions, checkpoints and artifacts, and the
indexes that serve them (SQLite's query plans)."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import checkpoints as cps
from agents import pages
from agents.models import Artifact, Run, Session
from api.models import ApiToken
from tests.helpers import client_for, make_run

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ROW = re.compile(r'<tr id="run-(\d+)"')


def bulk_runs(user, n: int, *, same_time: int = 1, **fields) -> list[int]:
    """n runs, `same_time` of them sharing each created_at; their ids, oldest first."""
    goal = fields.pop("goal", "")
    made = Run.objects.bulk_create(
        Run(
            goal=goal or f"run {i}",
            model="m",
            created_by=user,
            created_at=T0 + timedelta(seconds=i // same_time),
            **fields,
        )
        for i in range(n)
    )
    return [r.pk for r in made]


def newest_first(ids: list[int], same_time: int = 1) -> list[int]:
    order = {pk: (i // same_time, pk) for i, pk in enumerate(ids)}
    return sorted(ids, key=lambda pk: order[pk], reverse=True)


def link(html: str, rel: str) -> str | None:
    m = re.search(rf'<a href="\?([^"]*)" rel="{rel}">', html)
    return m[1].replace("&amp;", "&") if m else None


def walk(c, start: str = "", rel: str = "next") -> list[list[int]]:
    pages_seen, query = [], start
    while query is not None:
        response = c.get(f"/?{query}")
        assert response.status_code == 200
        html = response.content.decode()
        pages_seen.append([int(x) for x in ROW.findall(html)])
        query = link(html, rel)
        assert len(pages_seen) < 100
    return pages_seen


# --- the runs list -----------------------------------------------------------------------------
def test_walking_the_runs_list_shows_every_run_once_newest_first(owner):
    ids = bulk_runs(owner, 51)
    c = client_for(owner)
    seen = walk(c)
    assert [len(p) for p in seen] == [25, 25, 1]
    assert [pk for p in seen for pk in p] == newest_first(ids)


def test_walking_back_with_newer_links_gives_the_same_pages(owner):
    ids = bulk_runs(owner, 60)
    c = client_for(owner)
    forward = walk(c)
    last = c.get(f"/?{link(c.get('/').content.decode(), 'next')}").content.decode()
    back = walk(c, link(last, "prev"), rel="prev")
    assert back[0] == forward[0] and [pk for p in forward for pk in p] == newest_first(ids)


def test_runs_made_in_the_same_instant_keep_a_stable_order_across_pages(owner):
    ids = bulk_runs(owner, 40, same_time=40)  # all at one created_at
    seen = walk(client_for(owner))
    flat = [pk for p in seen for pk in p]
    assert flat == sorted(ids, reverse=True) and len(set(flat)) == 40


def test_the_oldest_page_holds_the_oldest_runs_and_leads_back_up(owner):
    ids = bulk_runs(owner, 30, same_time=3)
    c = client_for(owner)
    html = c.get("/?oldest=1").content.decode()
    shown = [int(x) for x in ROW.findall(html)]
    assert shown == newest_first(ids, 3)[-25:]
    assert link(html, "next") is None and link(html, "first") == ""
    newer = c.get(f"/?{link(html, 'prev')}").content.decode()
    assert [int(x) for x in ROW.findall(newer)] == newest_first(ids, 3)[:5]
    assert link(newer, "prev") is None  # the top: no newer page


def test_filters_and_search_ride_along_with_the_cursor(owner):
    bulk_runs(owner, 30, status="paused", goal="tidy the docs")
    bulk_runs(owner, 30, status="paused", goal="fix the flaky test")
    flaky = bulk_runs(owner, 30, status="failed", goal="fix the flaky test")
    c = client_for(owner)
    first = c.get("/?status=failed&q=flaky").content.decode()
    older = link(first, "next")
    assert "status=failed" in older and "q=flaky" in older
    seen = walk(c, "status=failed&q=flaky")
    assert sorted(pk for p in seen for pk in p) == sorted(flaky)
    assert "30 runs match" in first


def test_a_bad_cursor_is_a_400_that_says_so_and_shows_the_newest_runs(owner):
    ids = bulk_runs(owner, 3)
    c = client_for(owner)
    for bad in (
        "garbage",
        "1-0",
        "١٢-٣",
        "1-2%00",
        "999999999999999999-1",
        "12-" + "9" * 19,
        "-5-3",
        "1.5-2",
    ):
        for param in ("after", "before"):
            response = c.get(f"/?{param}={bad}")
            html = response.content.decode()
            assert response.status_code == 400, (param, bad)
            assert 'id="page-error"' in html and "Showing the newest runs" in html
            assert [int(x) for x in ROW.findall(html)] == ids[::-1]


def test_a_cursor_past_the_end_shows_an_empty_page_with_the_way_back(owner):
    bulk_runs(owner, 3)
    response = client_for(owner).get("/?after=1-1")
    html = response.content.decode()
    assert response.status_code == 200 and not ROW.findall(html)
    assert link(html, "prev") == "before=1-1"


def test_an_old_page_number_link_still_opens_the_list(owner):
    bulk_runs(owner, 3)
    response = client_for(owner).get("/?page=7")
    assert response.status_code == 200 and len(ROW.findall(response.content.decode())) == 3


def test_the_count_stops_at_its_cap(owner, monkeypatch):
    bulk_runs(owner, 60)
    monkeypatch.setattr(pages, "COUNT_CAP", 50)
    html = client_for(owner).get("/").content.decode()
    assert "25 shown · 50+ runs" in html
    monkeypatch.setattr(pages, "COUNT_CAP", 60)
    assert "25 shown · 60 runs" in client_for(owner).get("/").content.decode()


def test_a_list_that_fits_one_page_is_not_counted_again(owner):
    bulk_runs(owner, 26)
    c = client_for(owner)
    with CaptureQueriesContext(connection) as two_pages:
        assert "25 shown · 26 runs" in c.get("/").content.decode()
    Run.objects.filter(pk=Run.objects.order_by("pk")[0].pk).delete()
    with CaptureQueriesContext(connection) as one_page:
        assert "25 shown · 25 runs" in c.get("/").content.decode()
    assert len(one_page) == len(two_pages) - 1


def test_a_cursor_shows_only_runs_the_user_may_see(owner, outsider):
    mine = bulk_runs(owner, 30)
    theirs = bulk_runs(outsider, 30)
    seen = [pk for p in walk(client_for(outsider)) for pk in p]
    assert sorted(seen) == sorted(theirs) and not set(seen) & set(mine)


def test_the_live_socket_adds_new_rows_only_on_the_first_page(owner):
    bulk_runs(owner, 30)
    c = client_for(owner)
    first = c.get("/").content.decode()
    assert 'ws-connect="/ws/live/runs/?page=1"' in first
    assert (
        'ws-connect="/ws/live/runs/?page=2"' in c.get(f"/?{link(first, 'next')}").content.decode()
    )


def test_a_page_of_runs_costs_the_same_queries_first_or_last(owner, supervisor):
    bulk_runs(owner, 80)
    c = client_for(supervisor)
    counts = []
    for query in ("", "oldest=1", f"after={pages.runs_cursor(Run.objects.order_by('pk')[40])}"):
        with CaptureQueriesContext(connection) as queries:
            assert c.get(f"/?{query}").status_code == 200
        counts.append(len(queries))
    assert len(set(counts)) == 1, counts


# --- the indexes behind them (SQLite's plans) --------------------------------------------------
def plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def page_query(c, url: str, table: str) -> str:
    with CaptureQueriesContext(connection) as queries:
        assert c.get(url).status_code == 200
    found = [q["sql"] for q in queries if f'FROM "{table}"' in q["sql"] and "LIMIT" in q["sql"]
             and "ORDER BY" in q["sql"] and "COUNT(" not in q["sql"][:40]]  # fmt: skip
    assert found, [q["sql"] for q in queries]
    return found[0]


@pytest.mark.parametrize(
    "who, query, index",
    [
        ("supervisor", "", "run_list_order"),
        ("supervisor", "oldest=1", "run_list_order"),
        ("supervisor", "after=CURSOR", "run_list_order"),
        ("supervisor", "status=paused&after=CURSOR", "run_list_by_status"),
        ("owner", "after=CURSOR", "run_list_by_owner"),
    ],
)
def test_the_runs_list_reads_its_page_from_an_index_without_sorting(
    request, owner, who, query, index
):
    if connection.vendor != "sqlite":
        pytest.skip("reads SQLite's query plans")
    bulk_runs(owner, 200, status="paused")
    cursor = pages.runs_cursor(Run.objects.order_by("pk")[100])
    c = client_for(request.getfixturevalue(who))
    explained = plan(page_query(c, "/?" + query.replace("CURSOR", cursor), "agents_run"))
    assert index in explained and "TEMP B-TREE" not in explained, explained


def test_a_run_pages_lists_read_from_their_unique_indexes(owner):
    if connection.vendor != "sqlite":
        pytest.skip("reads SQLite's query plans")
    run = make_run(created_by=owner)
    Session.objects.bulk_create(Session(run=run, index=i) for i in range(1, 80))
    c = client_for(owner)
    for panel, table in (("sessions", "agents_session"), ("checkpoints", "agents_checkpoint")):
        explained = plan(page_query(c, f"/runs/{run.pk}/{panel}/?before=50", table))
        assert "USING INDEX" in explained and "TEMP B-TREE" not in explained, explained
    explained = plan(page_query(c, f"/runs/{run.pk}/events/?before=2", "agents_event"))
    assert "(run_id=? AND seq<?)" in explained and "TEMP B-TREE" not in explained


# --- a run page's panels -----------------------------------------------------------------------
def test_earlier_sessions_come_a_page_at_a_time_to_the_first(owner):
    run = make_run(created_by=owner)
    Session.objects.bulk_create(Session(run=run, index=i) for i in range(1, 61))
    c = client_for(owner)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    panel = html.split('id="sessions"')[1].split("</section>")[0]
    assert re.findall(r'id="session-(\d+)"', panel) == [str(i) for i in range(36, 61)]
    assert "Earlier sessions… (35 more)" in panel and "?before=36" in panel
    shown, before = [], 36
    while before:
        fragment = c.get(f"/runs/{run.pk}/sessions/?before={before}", HTTP_HX_REQUEST="true")
        text = fragment.content.decode()
        assert fragment.status_code == 200 and "<html" not in text
        shown = [int(x) for x in re.findall(r'id="session-(\d+)"', text)] + shown
        m = re.search(r"\?before=(\d+)", text)
        before = int(m[1]) if m else None
    assert shown == list(range(1, 36))


def test_older_checkpoints_and_artifacts_come_in_pages_with_a_diff_across_the_edge(owner):
    run = make_run(created_by=owner)
    for i in range(30):
        cps.create(run.pk, kind="manual", label=f"cp-{i}")
    Artifact.objects.bulk_create(
        Artifact(run=run, seq=1, name=f"a{i}", kind="file", blob_hash="0" * 64, size=1)
        for i in range(27)
    )
    c = client_for(owner)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    timeline = html.split('id="checkpoints"')[1].split("</section>")[0]
    numbers = [int(x) for x in re.findall(r'<li id="checkpoint-(\d+)"', timeline)]
    assert numbers == list(range(30, 5, -1))
    assert "?a=5&amp;b=6" in timeline  # the page's last diffs with the first of the next
    older = c.get(f"/runs/{run.pk}/checkpoints/?before=6", HTTP_HX_REQUEST="true")
    assert re.findall(r'<li id="checkpoint-(\d+)"', older.content.decode()) == list("54321")
    artifacts = html.split('id="artifacts"')[1].split("</section>")[0]
    assert artifacts.count('<li id="artifact-') == 25 and "Older artifacts… (2 more)" in artifacts


def test_a_panel_page_without_script_is_a_page_of_its_own(owner):
    run = make_run(created_by=owner)
    Session.objects.bulk_create(Session(run=run, index=i) for i in range(1, 61))
    response = client_for(owner).get(f"/runs/{run.pk}/sessions/?before=36")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html and "Sessions of run" in html
    assert html.count('id="session-') == 25 and "?before=11" in html


@pytest.mark.parametrize("bad", ["x", "-1", "0", "1.5", "9" * 40])
def test_a_bad_panel_key_is_a_400_that_says_why(owner, bad):
    run = make_run(created_by=owner)
    response = client_for(owner).get(f"/runs/{run.pk}/checkpoints/?before={bad}")
    assert response.status_code == 400 and "before must be" in response.content.decode()


def test_a_panel_page_of_someone_elses_run_is_a_404(owner, outsider):
    run = make_run(created_by=owner)
    for panel in ("sessions", "checkpoints", "artifacts"):
        assert client_for(outsider).get(f"/runs/{run.pk}/{panel}/").status_code == 404


# --- the API: the same order and cursors -------------------------------------------------------
def api_client(user) -> Client:
    _, token = ApiToken.issue(user, ["read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def test_the_api_pages_runs_in_the_webs_order_even_in_one_instant(owner):
    ids = bulk_runs(owner, 23, same_time=5)
    c = api_client(owner)
    seen, cursor = [], None
    while True:
        page = c.get("/api/v1/runs", {"limit": 4, **({"cursor": cursor} if cursor else {})}).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    web = [pk for p in walk(client_for(owner)) for pk in p]
    assert seen == newest_first(ids, 5) == web


def test_the_api_still_takes_an_id_as_a_cursor_and_refuses_junk(owner):
    ids = bulk_runs(owner, 6)
    c = api_client(owner)
    page = c.get("/api/v1/runs", {"cursor": str(ids[3])}).json()
    assert [r["id"] for r in page["items"]] == ids[:3][::-1]
    for junk in ("zz", "1-0", "999999999999999999-1", str(10**30), "9" * 19, "١٢-٣"):
        response = c.get("/api/v1/runs", {"cursor": junk})
        assert response.status_code == 422, junk


def test_the_apis_pages_of_events_read_from_the_run_seq_index(owner):
    if connection.vendor != "sqlite":
        pytest.skip("reads SQLite's query plans")
    run = make_run(created_by=owner)
    c = api_client(owner)
    with CaptureQueriesContext(connection) as queries:
        assert c.get(f"/api/v1/runs/{run.pk}/events", {"after": 1, "limit": 5}).status_code == 200
    sql = next(q["sql"] for q in queries if 'FROM "agents_event"' in q["sql"])
    explained = plan(sql)
    assert "(run_id=? AND seq>?)" in explained and "TEMP B-TREE" not in explained, explained


# --- the CLI -----------------------------------------------------------------------------------
def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("list_runs", *args, stdout=out)
    return out.getvalue()


def test_list_runs_pages_through_many_runs_with_after(owner):
    ids = bulk_runs(owner, 1200, same_time=7)
    first = cli().splitlines()
    assert len(first) == 26 and first[-1].startswith("more: --after ")
    seen, after = [], None
    while True:
        page = json.loads(cli("--limit", "500", "--json", *(["--after", after] if after else [])))
        seen += [r["id"] for r in page["items"]]
        after = page["next_cursor"]
        if not after:
            break
    assert seen == newest_first(ids, 7)
    assert [int(line.split()[0]) for line in first[:-1]] == seen[:25]


def test_list_runs_filters_and_refuses_a_bad_cursor_or_limit(owner, outsider):
    bulk_runs(owner, 4, status="paused", goal="fix the flaky test")
    theirs = bulk_runs(outsider, 2, status="paused", goal="fix the flaky test")
    found = json.loads(
        cli("--status", "paused", "--q", "flaky", "--user", outsider.username, "--json")
    )
    assert [r["id"] for r in found["items"]] == theirs[::-1] and found["next_cursor"] is None
    assert cli("--status", "failed") == "no runs match\n"
    with pytest.raises(CommandError, match="--after: not a page link"):
        cli("--after", "nope")
    for bad in ("0", "1001", "x"):
        with pytest.raises(CommandError):
            cli("--limit", bad)
