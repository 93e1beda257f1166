"""Seeing a fleet on the web: the parent's Fleet panel and its live re-read, a child's page, the
runs list grouped by fleet and filtered to fleets, the inbox's fleet label, the fleet events in
the stream; who may see what, queries counted, goals escaped."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import eventlog, services
from agents.models import Approval, Run, RunStatus
from tests.fleet_runs import child_of, fleet
from tests.helpers import client_for, drive_until_idle, make_run

pytestmark = pytest.mark.django_db


def panel(html: str) -> str:
    return html.split('id="fleet"', 1)[1].split("</section>", 1)[0]


# --- the parent's page -------------------------------------------------------------------------
def test_a_parents_page_shows_its_children_with_status_progress_spend_and_last_event(owner):
    parent = fleet(owner, children=2)
    kids = list(parent.children.order_by("pk"))
    html = client_for(owner).get(f"/runs/{parent.pk}/").content.decode()
    tree = panel(html)
    assert "Fleet</h2>" in tree and "2 child runs" in tree
    for kid in kids:
        row = tree.split(f'id="fleet-run-{kid.pk}"')[1].split("</tr>")[0]
        assert f'href="/runs/{kid.pk}/"' in row and kid.goal in row
        assert 'class="status s-running"' in row and "Running" in row
        assert "3 turns · 1 session" in row
        assert "120 tokens · $0.0100" in row
        assert '<span class="kind">session.started</span>' in row
    # live: the panel re-reads itself while the fleet is live
    assert f'hx-get="/runs/{parent.pk}/fleet" hx-trigger="every 3s"' in html


def test_the_meters_show_the_fleets_rolled_up_spend(owner):
    parent = fleet(owner, children=3)
    Run.objects.filter(pk=parent.pk).update(input_tokens=50, cost_usd="0.42")
    html = client_for(owner).get(f"/runs/{parent.pk}/").content.decode()
    meters = html.split('id="meters"')[1].split("</section>")[0]
    assert "$0.4200" in meters and "(fleet $0.4500)" in meters  # 0.42 + 3 x 0.01
    assert "(fleet 410)" in meters  # 50 + 3 x 120 tokens


def test_a_run_without_children_has_no_fleet_panel_and_no_fleet_figures(owner):
    run = make_run(created_by=owner)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert '<section id="fleet" class="card fleet" aria-labelledby="fleet-title" hidden>' in html
    assert "(fleet " not in html and 'id="fleet-of"' not in html
    assert 'id="fleet-refresh"' in html  # where a pushed fleet event's loader lands


def test_grandchildren_show_under_their_parent_and_deeper_runs_are_counted(owner):
    parent = fleet(owner, children=1)
    kid = parent.children.get()
    grandchild = child_of(kid, goal="a grandchild's piece")
    child_of(grandchild, goal="too deep to show")
    tree = panel(client_for(owner).get(f"/runs/{parent.pk}/").content.decode())
    assert tree.index(f'id="fleet-run-{kid.pk}"') < tree.index(f'id="fleet-run-{grandchild.pk}"')
    assert 'class="fleet-node level-2"' in tree and "too deep to show" not in tree
    assert "1 more below" in tree


def test_a_childs_page_names_its_fleet(owner):
    parent = fleet(owner, children=1, goal="the <b>plan</b>")
    kid = parent.children.get()
    html = client_for(owner).get(f"/runs/{kid.pk}/").content.decode()
    label = html.split('id="fleet-of"')[1].split("</p>")[0]
    assert f'<a href="/runs/{parent.pk}/">parent run #{parent.pk}</a>' in label
    assert "the &lt;b&gt;plan&lt;/b&gt;" in label and "<b>plan" not in label


def test_the_fleet_fragment_is_the_panel_and_the_meters(owner):
    parent = fleet(owner, children=2)
    response = client_for(owner).get(f"/runs/{parent.pk}/fleet", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="fleet"') and "<html" not in html
    assert '<section id="meters" class="meters" hx-swap-oob="true">' in html


def test_the_panel_stops_re_reading_when_the_fleet_is_over(owner):
    parent = fleet(owner, children=2)
    Run.objects.filter(pk__in=[parent.pk, *parent.children.values_list("pk", flat=True)]).update(
        status=RunStatus.SUCCEEDED
    )
    html = client_for(owner).get(f"/runs/{parent.pk}/fleet").content.decode()
    assert "Fleet</h2>" in html and "hx-trigger" not in html.split("</section>")[0]


# --- who may see -------------------------------------------------------------------------------
def test_the_fleet_fragment_requires_login_and_sight_of_the_run(owner, outsider, viewer):
    parent = fleet(owner, children=1)
    url = f"/runs/{parent.pk}/fleet"
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    assert client_for(outsider).get(url).status_code == 404
    assert "Fleet</h2>" in client_for(viewer).get(url).content.decode()
    assert Client().post(url).status_code in (302, 405)


def test_a_child_the_user_may_not_see_is_not_in_the_tree(owner, outsider):
    parent = fleet(owner, children=1)
    mine = parent.children.get()
    theirs = child_of(parent, goal="someone else's secret piece", created_by=outsider)
    below_theirs = child_of(theirs, goal="under the secret piece", created_by=owner)
    c = client_for(owner)
    for url in (f"/runs/{parent.pk}/", f"/runs/{parent.pk}/fleet"):
        tree = panel(c.get(url).content.decode())
        assert f'id="fleet-run-{mine.pk}"' in tree
        assert "secret piece" not in tree and f"fleet-run-{theirs.pk}" not in tree
        assert f"fleet-run-{below_theirs.pk}" not in tree  # never a branch without its stem
    # and the outsider's child's page does not name a parent they may not see
    html = client_for(outsider).get(f"/runs/{theirs.pk}/").content.decode()
    assert "Part of a fleet whose parent run you may not see." in html
    assert f"/runs/{parent.pk}/" not in html


def test_a_viewer_sees_every_child(owner, viewer, outsider):
    parent = fleet(owner, children=1)
    theirs = child_of(parent, goal="another person's piece", created_by=outsider)
    tree = panel(client_for(viewer).get(f"/runs/{parent.pk}/").content.decode())
    assert f'id="fleet-run-{theirs.pk}"' in tree


# --- queries -----------------------------------------------------------------------------------
def test_a_fleet_of_eight_costs_the_queries_of_a_fleet_of_one(owner):
    small = fleet(owner, children=1)
    big = fleet(owner, children=8)
    for kid in big.children.all():  # grandchildren, approvals and checkpoints don't add any
        child_of(kid, goal="grandchild")
    c = client_for(owner)
    for url in ("/runs/{}/", "/runs/{}/fleet"):
        with CaptureQueriesContext(connection) as one:
            assert c.get(url.format(small.pk)).status_code == 200
        with CaptureQueriesContext(connection) as eight:
            html = c.get(url.format(big.pk)).content.decode()
        assert len(one) > 5  # counted (not past the connection's query log)
        assert html.count('class="fleet-node level-1"') == 8
        assert html.count('class="fleet-node level-2"') == 8
        # one more level of descendants for the rollup to walk, nothing per child
        assert len(eight) <= len(one) + 1, [q["sql"][:120] for q in eight.captured_queries]


def test_the_fleet_fragment_makes_a_handful_of_queries(owner):
    parent = fleet(owner, children=8)
    c = client_for(owner)
    with CaptureQueriesContext(connection) as q:
        c.get(f"/runs/{parent.pk}/fleet")
    assert len(q) <= 12, [x["sql"][:120] for x in q.captured_queries]


# --- escaping ----------------------------------------------------------------------------------
def test_goals_are_escaped_in_the_tree_the_list_and_the_spawn_event(owner):
    parent = make_run(goal="plan", created_by=owner)
    kid = child_of(parent, goal='<script>alert("x")</script>')
    eventlog.append(
        parent.pk,
        "fleet.spawned",
        {"children": [{"run_id": kid.pk, "goal": kid.goal, "from": "<img src=x onerror=y>"}]},
    )
    c = client_for(owner)
    for html in (
        c.get(f"/runs/{parent.pk}/").content.decode(),
        c.get("/?group=fleet").content.decode(),
    ):
        assert '<script>alert("x")' not in html and "&lt;script&gt;alert(" in html
        assert "<img src=x" not in html


# --- fleet events in the stream ----------------------------------------------------------------
def test_fleet_events_render_with_links_to_the_children(owner):
    parent = fleet(owner, children=2)
    a, b = parent.children.order_by("pk")
    eventlog.append(parent.pk, "fleet.child_ended", {"run_id": a.pk, "status": "succeeded"})
    eventlog.append(
        parent.pk,
        "fleet.woke",
        {"reason": "all", "children": [{"run_id": a.pk, "status": "succeeded"},
                                       {"run_id": b.pk, "status": "failed"}]},
    )  # fmt: skip
    eventlog.append(
        parent.pk,
        "fleet.merge",
        {"run_id": a.pk, "result": "applied", "files": ["a.py", "tests/test_a.py"],
         "conflicts": []},
    )  # fmt: skip
    eventlog.append(
        parent.pk,
        "fleet.merge",
        {"run_id": b.pk, "result": "conflict", "files": [], "conflicts": ["shared.py"]},
    )
    eventlog.append(a.pk, "fleet.cascade", {"action": "paused", "cause": f"run {parent.pk} paused"})
    c = client_for(owner)
    html = c.get(f"/runs/{parent.pk}/").content.decode()

    def body(kind):
        return html.split(f'<span class="kind">{kind}</span>')[1].split('class="ev ')[0]

    spawned = body("fleet.spawned")
    assert f'<a href="/runs/{a.pk}/">run {a.pk}</a>: piece 1' in spawned
    assert "budget 1,000 tokens, $0.50" in spawned and "starts from checkpoint 1" in spawned
    assert f'<a href="/runs/{a.pk}/">run {a.pk}</a> ended' in body("fleet.child_ended")
    woke = body("fleet.woke")
    assert "Woke (all)" in woke and 's-failed">failed</span>' in woke
    merges = html.split('<span class="kind">fleet.merge</span>')
    assert "✔ Merged" in merges[1] and "<code>tests/test_a.py</code>" in merges[1]
    assert "✘ Merge conflict with" in merges[2] and "<code>shared.py</code>" in merges[2]
    child = c.get(f"/runs/{a.pk}/").content.decode()
    assert f"<b>Paused</b> with its fleet: run {parent.pk} paused" in child


def test_a_fleet_event_with_a_bad_run_id_still_renders(owner):
    run = make_run(created_by=owner)
    eventlog.append(run.pk, "fleet.child_ended", {"run_id": "nope", "status": "<i>x</i>"})
    eventlog.append(run.pk, "fleet.spawned", {"children": [{"run_id": None, "goal": "g"}]})
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "run nope ended" in html and "&lt;i&gt;x&lt;/i&gt;" in html


def test_a_pushed_fleet_event_brings_a_loader_the_same_for_every_viewer(owner):
    from dashboard import panels, stream

    parent = fleet(owner, children=1)
    rows = stream.newest(parent.pk)
    html = panels.render_push(parent.pk, rows[-1:], panels.access.Rights())
    assert (
        f'<div id="fleet-refresh" hidden hx-swap-oob="true" hx-get="/runs/{parent.pk}/fleet" '
        'hx-trigger="load" hx-target="#fleet" hx-swap="outerHTML"></div>' in html
    )
    assert "piece 1" not in html.split('id="fleet-refresh"')[1]  # no tree in a shared push


# --- the runs list -----------------------------------------------------------------------------
def test_the_runs_list_groups_by_fleet(owner):
    lone = make_run(goal="a lone run", created_by=owner)
    parent = fleet(owner, children=2)
    a, b = parent.children.order_by("pk")
    grand = child_of(a, goal="a grandchild")
    html = client_for(owner).get("/?group=fleet").content.decode()
    table = html.split('id="run-rows"')[1].split("</tbody>")[0]
    order = [table.index(f'id="run-{r.pk}"') for r in (parent, a, grand, b)]
    assert order == sorted(order)  # the root, then its tree below it
    assert table.index(f'id="run-{lone.pk}"') > order[-1]  # an older root after it
    assert 'class="depth-1"' in table and 'class="depth-2"' in table
    assert '<table class="runs grouped">' in html and table.count("<tr ") == 5
    assert 'ws-connect="/ws/live/runs/?page=1&group=fleet"' in html
    flat = client_for(owner).get("/").content.decode()
    assert "runs grouped" not in flat and f"#{parent.pk}</span>" in flat  # the child's mark


def test_grouping_pages_by_roots_with_one_query_for_their_fleets(owner):
    c = client_for(owner)
    fleet(owner, children=1)
    with CaptureQueriesContext(connection) as one:
        c.get("/?group=fleet")
    for _ in range(4):
        fleet(owner, children=8)
    for _ in range(30):
        make_run(created_by=owner)
    with CaptureQueriesContext(connection) as many:
        first = c.get("/?group=fleet").content.decode()
    # The same queries but the count, which a list that fits on one page goes without.
    assert len(many) == len(one) + 1 and len(one) > 3
    assert "25 shown · 35 runs" in first  # roots counted, children not
    older = re.search(r'href="\?after=([^"&]+)[^"]*" rel="next"', first).group(1)
    second = c.get(f"/?group=fleet&after={older}").content.decode()
    # every child shows once, under its root, whichever page that is on
    assert first.count('class="depth-1"') + second.count('class="depth-1"') == 1 + 8 * 4
    assert "group=fleet" in first.split('class="pager"')[1]


def test_fleets_only_filters_to_parents_and_children(owner, outsider):
    lone = make_run(goal="a lone run", created_by=owner)
    parent = fleet(owner, children=1)
    kid = parent.children.get()
    html = client_for(owner).get("/?fleet=only").content.decode()
    assert f'id="run-{parent.pk}"' in html and f'id="run-{kid.pk}"' in html
    assert f'id="run-{lone.pk}"' not in html
    bad = client_for(owner).get("/?fleet=maybe")
    assert bad.status_code == 400 and "fleet must be one of: only" in bad.content.decode()
    assert f'id="run-{parent.pk}"' not in client_for(outsider).get("/?fleet=only").content.decode()


def test_the_grouped_list_leaves_out_children_the_user_may_not_see(owner, outsider):
    parent = fleet(owner, children=1)
    theirs = child_of(parent, goal="not for olivia", created_by=outsider)
    html = client_for(owner).get("/?group=fleet").content.decode()
    assert "not for olivia" not in html and f'id="run-{theirs.pk}"' not in html


# --- the inbox ---------------------------------------------------------------------------------
def _waiting_child(owner, parent_goal="the fleet's plan"):
    parent = make_run(goal=parent_goal, created_by=owner)
    kid = drive_until_idle(services.create_demo_run(created_by=owner))
    Run.objects.filter(pk=kid.pk).update(parent=parent, depth=1)
    return parent, kid


def test_the_inbox_names_a_childs_fleet(owner, supervisor):
    parent, kid = _waiting_child(owner, "the <em>fleet's</em> plan")
    html = client_for(supervisor).get("/approvals/").content.decode()
    card = html.split(f'id="approval-{Approval.objects.get(run=kid).pk}"')[1]
    assert f'Fleet of <a href="/runs/{parent.pk}/">run #{parent.pk}</a>' in card
    assert "the &lt;em&gt;fleet&#x27;s&lt;/em&gt; plan" in card


def test_a_decided_cards_swap_keeps_the_fleet_label(owner, supervisor):
    parent, kid = _waiting_child(owner)
    approval = Approval.objects.get(run=kid)
    html = (
        client_for(supervisor)
        .post(
            f"/approvals/{approval.pk}/decide",
            {"decision": "deny", "comment": "no", "show_run": "1"},
            HTTP_HX_REQUEST="true",
        )
        .content.decode()
    )
    assert f'Fleet of <a href="/runs/{parent.pk}/">run #{parent.pk}</a>' in html


def test_the_inbox_says_only_part_of_a_fleet_when_the_parent_is_hidden(owner, outsider):
    parent = make_run(goal="owner's secret plan", created_by=owner)
    kid = drive_until_idle(services.create_demo_run(created_by=outsider))
    Run.objects.filter(pk=kid.pk).update(parent=parent, depth=1)
    html = client_for(outsider).get("/approvals/").content.decode()
    assert "Part of a fleet" in html and "secret plan" not in html
    assert f"/runs/{parent.pk}/" not in html


def test_the_inbox_makes_no_query_per_fleet_card(owner, supervisor):
    c = client_for(supervisor)
    _waiting_child(owner)
    with CaptureQueriesContext(connection) as one:
        c.get("/approvals/")
    for _ in range(3):
        _waiting_child(owner)
    with CaptureQueriesContext(connection) as many:
        html = c.get("/approvals/").content.decode()
    assert html.count("Fleet of <a") == 4 and len(many) == len(one)


# --- checks, the grouped socket, the admin -----------------------------------------------------
def test_a_childs_checks_at_its_latest_checkpoint_show_as_passing_of_all(owner):
    from agents.models import Checkpoint

    parent = fleet(owner, children=1)
    kid = parent.children.get()
    cp = Checkpoint.objects.create(
        run=kid,
        number=1,
        seq=1,
        kind="manual",
        tree="0" * 64,
        state={"checks": {"pytest -q": {"passed": True}, "ruff check .": {"passed": False}}},
    )
    Run.objects.filter(pk=kid.pk).update(head_checkpoint=cp)
    tree = panel(client_for(owner).get(f"/runs/{parent.pk}/").content.decode())
    assert "checks 1/2</span>" in tree and 'class="bad" title="the checks' in tree


def test_a_grouped_lists_socket_never_prepends_new_rows():
    from dashboard.live.consumers import LiveConsumer

    socket = LiveConsumer()
    socket.query = {"page": "1"}
    assert socket._shows_new_rows()
    socket.query = {"page": "1", "group": "fleet"}
    assert not socket._shows_new_rows()


def test_the_admin_shows_parent_and_depth_and_filters_by_having_a_parent(client, owner):
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", password="pw-root-123")
    client.force_login(root)
    parent = fleet(owner, children=1, goal="the admin's parent")
    kid = parent.children.get()
    listing = client.get("/admin/agents/run/?has_parent=yes").content.decode()
    assert f"/admin/agents/run/{kid.pk}/change/" in listing
    assert f"/admin/agents/run/{parent.pk}/change/" not in listing
    roots = client.get("/admin/agents/run/?has_parent=no").content.decode()
    assert f"/admin/agents/run/{parent.pk}/change/" in roots
    assert f"/admin/agents/run/{kid.pk}/change/" not in roots
    assert 'column-fleet_parent"' in listing and 'column-depth"' in listing
    page = client.get(f"/admin/agents/run/{kid.pk}/change/").content.decode()
    assert "field-parent" in page and "field-depth" in page and "the admin&#x27;s parent" in page
