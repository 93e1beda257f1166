"""External runs in the pages and the CLI: marked as external, with their agent's last contact,
and shown as stalled once that agent is silent past its heartbeat window — on the run page (and
its timed re-read), the runs list and its filters, the Overview, the inbox, pushes, the new-run
form, `show_run` and `overview`."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from agents import overview, services
from agents.access import Rights
from agents.models import Approval, Run, RunStatus
from agents.runspec import RunSpec
from dashboard import panels
from tests.helpers import client_for, make_run

pytestmark = pytest.mark.django_db


def external(owner, *, silent: float | None = None, heartbeat: int | None = 60, **kw) -> Run:
    """An external run; `silent`: its agent's last call that many seconds ago (None: never)."""
    run = services.create_run(
        RunSpec(
            goal=kw.pop("goal", "an outside agent's run"),
            checks=["test -f done.txt"],
            provider="external",
            heartbeat_seconds=heartbeat,
        ),
        created_by=owner,
    )
    fields = dict(kw)
    if silent is not None:
        fields["last_contact_at"] = timezone.now() - timedelta(seconds=silent)
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
    run.refresh_from_db()
    return run


def badge(html: str, name: str) -> list[str]:
    return re.findall(rf'<span class="badge {name}"[^>]*>[^<]*</span>', html)


# --- marked, with its last contact --------------------------------------------------------------
def test_the_run_page_marks_an_external_run_and_its_last_contact(owner):
    run = external(owner, silent=5, status=RunStatus.RUNNING)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    [mark] = badge(html, "external")
    assert "external agent" in mark and "title=" in mark and "/api/v1/" in mark
    header = html.split('id="run-header"')[1].split("</section>")[0]
    assert "last contact" in header
    stamp = re.search(r'<time datetime="([^"]+)"[^>]*>(\d+) s ago</time>', header)
    assert stamp and stamp.group(1) == run.last_contact_at.isoformat()
    assert not badge(html, "stalled")


def test_a_run_never_called_says_so(owner):
    run = external(owner)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "no contact yet" in html and not badge(html, "stalled")


def test_internal_runs_carry_no_external_marks(owner):
    run = make_run(created_by=owner)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "scripted · offline" in html
    assert not badge(html, "external") and "last contact" not in html
    assert 'hx-trigger="every' not in html  # nothing to re-read: its changes are pushed


# --- stalled ------------------------------------------------------------------------------------
def test_silent_past_its_heartbeat_a_running_external_run_shows_stalled(owner):
    run = external(owner, silent=61, heartbeat=60, status=RunStatus.RUNNING)
    assert run.stalled
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    [stalled] = badge(html, "stalled")
    assert ">stalled<" in stalled and "(60 s)" in stalled
    header = html.split('id="run-header"')[1].split("</section>")[0]
    assert 'class="badge stalled"' in header and "s-running" in header
    assert "1\xa0minute ago" in header  # timesince's words, unbroken


def test_within_its_window_or_waiting_for_a_person_it_is_not_stalled(owner):
    # Well inside its window: a loaded machine may take seconds between here and the page.
    fresh = external(owner, silent=45, heartbeat=60, status=RunStatus.RUNNING)
    paused = external(owner, silent=600, heartbeat=60, status=RunStatus.PAUSED)
    done = external(owner, silent=600, heartbeat=60, status=RunStatus.SUCCEEDED)
    c = client_for(owner)
    for run in (fresh, paused, done):
        assert not run.stalled
        assert not badge(c.get(f"/runs/{run.pk}/").content.decode(), "stalled")


def test_a_queued_run_whose_agent_never_called_stalls_from_its_creation(owner):
    run = external(owner, created_at=timezone.now() - timedelta(seconds=120), heartbeat=60)
    assert run.status == RunStatus.QUEUED and run.last_contact_at is None and run.stalled
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert badge(html, "stalled") and "no contact yet" in html


def test_the_run_page_re_reads_a_live_external_runs_state_on_a_timer(owner):
    run = external(owner, silent=1, heartbeat=60, status=RunStatus.RUNNING)
    c = client_for(owner)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    state = re.search(r'<span id="run-state"[^>]*>', html).group(0)
    assert f'hx-get="/runs/{run.pk}/state"' in state and 'hx-trigger="every 30s"' in state
    assert "hx-swap-oob" not in state  # inside the header, never swapped on its own
    # Its agent goes silent: nothing is pushed, the timed re-read shows it.
    Run.objects.filter(pk=run.pk).update(last_contact_at=timezone.now() - timedelta(minutes=5))
    fragment = c.get(f"/runs/{run.pk}/state", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<span id="run-state"') and "<html" not in fragment
    assert badge(fragment, "stalled") and "5\xa0minutes ago" in fragment
    # A short heartbeat is re-read sooner, never more than every 5 s; an ended run not at all.
    Run.objects.filter(pk=run.pk).update(heartbeat_seconds=2)
    assert 'hx-trigger="every 5s"' in c.get(f"/runs/{run.pk}/state").content.decode()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    ended = c.get(f"/runs/{run.pk}/state").content.decode()
    assert "hx-trigger" not in ended and not badge(ended, "stalled")


def test_the_state_is_for_those_who_may_see_the_run(owner, outsider):
    run = external(owner)
    assert client_for(outsider).get(f"/runs/{run.pk}/state").status_code == 404
    assert client_for(owner).post(f"/runs/{run.pk}/state").status_code == 405


# --- the same template pushed and in every page ------------------------------------------------
def test_pushes_render_the_same_marks(owner):
    """The run list's row and the header's panels, as the socket sends them."""
    from dashboard.live.consumers import render_row

    run = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    row = render_row(Run.objects.filter(pk=run.pk).for_list().first())
    assert badge(row, "external") and badge(row, "stalled") and "last contact" in row
    rights = Rights.of(owner, run)
    header = panels.render(run, rights, ("run-header",))
    assert badge(header, "external") and badge(header, "stalled")
    # An external agent's turn is a contact: the push carries its state (alone: not the header).
    assert panels.panels_for([type("R", (), {"kind": "model.turn"})()]) == (
        "meters",
        "sessions",
        panels.STATE,
    )
    Run.objects.filter(pk=run.pk).update(last_contact_at=timezone.now())
    pushed = panels.render_push(run.pk, [], rights, ("meters", panels.STATE))
    state = re.search(r'<span id="run-state"[^>]*>', pushed).group(0)
    assert 'hx-swap-oob="true"' in state and not badge(pushed, "stalled")
    assert re.search(r"<time datetime=[^>]*>\d+ s ago</time>", pushed)
    # An internal run's turn changes nothing there: not sent.
    internal = make_run(created_by=owner)
    assert "run-state" not in panels.render_push(internal.pk, [], rights, ("meters", panels.STATE))


def test_the_list_overview_compare_and_inbox_mark_it(owner):
    run = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING, goal="outside")
    other = make_run(created_by=owner)
    c = client_for(owner)
    listing = c.get("/").content.decode()
    row = listing.split(f'id="run-{run.pk}"')[1].split("</tr>")[0]
    assert badge(row, "external") and badge(row, "stalled") and "last contact" in row
    assert badge(c.get(f"/runs/compare/?a={run.pk}&b={other.pk}").content.decode(), "external")
    Approval.objects.create(run=run, tool_use_id="ext_1", tool_name="bash", tool_input={})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.AWAITING_APPROVAL)
    inbox = c.get("/approvals/").content.decode()
    assert badge(inbox, "external") and "last contact" in inbox


# --- the runs list's filters and the Overview ----------------------------------------------------
def test_the_runs_list_filters_to_external_and_to_stalled_runs(owner):
    stalled = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    alive = external(owner, silent=1, heartbeat=60, status=RunStatus.RUNNING)
    internal = make_run(created_by=owner)
    c = client_for(owner)

    def shown(url: str) -> set[int]:
        response = c.get(url)
        assert response.status_code == 200, response.content
        html = response.content.decode()
        return {r.pk for r in (stalled, alive, internal) if f'id="run-{r.pk}"' in html}

    assert shown("/?provider=external") == {stalled.pk, alive.pk}
    assert shown("/?provider=scripted") == {internal.pk}
    assert shown("/?stalled=1") == {stalled.pk}
    assert shown("/?stalled=1&status=queued") == set()
    assert shown("/") == {stalled.pk, alive.pk, internal.pk}
    html = c.get("/?stalled=1").content.decode()
    assert '<option value="1" selected>' in html and 'name="provider"' in html
    assert 'ws-connect="/ws/live/"' in html  # a filtered list is as loaded, as stuck's is
    bad = c.get("/?provider=martian")
    assert bad.status_code == 400 and "provider must be one of" in bad.content.decode()


def test_the_overview_counts_stalled_runs_and_links_them(owner, outsider):
    mine = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    external(owner, silent=1, heartbeat=60, status=RunStatus.RUNNING)
    external(outsider, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    o = overview.compute(Run.objects.all(), Approval.objects.pending())
    assert o.stalled_count == 2
    html = client_for(owner).get("/overview/", HTTP_HX_REQUEST="true").content.decode()
    figure = html.split('id="stalled-count"')[1].split("</a>")[0]
    assert "<b>1</b>" in figure and "external run stalled" in figure
    assert 'href="/?stalled=1" id="stalled-count"' in html
    assert f'id="stalled-{mine.pk}"' in html and "silent for ~5 min" not in html
    item = html.split(f'id="stalled-{mine.pk}"')[1].split("</li>")[0]
    assert "silent for 5 min" in item and "heartbeat 60 s" in item
    assert 'href="/?provider=external"' in html
    data = overview.compute(Run.objects.filter(created_by=owner), Approval.objects.none())
    [listed] = data.as_json()["stalled_runs"]
    assert listed["run"] == mine.pk and listed["heartbeat_seconds"] == 60
    assert listed["silent_seconds"] >= 300


# --- the new-run form ----------------------------------------------------------------------------
def test_the_form_offers_an_external_agent_with_its_heartbeat(owner):
    html = client_for(owner).get("/runs/new/").content.decode()
    assert '<option value="external">external agent' in html
    assert 'href="/api/v1/docs"' in html and "waits for its agent" in html
    assert 'id="field-heartbeat_seconds"' in html and 'name="heartbeat_seconds"' in html


def test_creating_an_external_run_from_the_web(owner):
    c = client_for(owner)
    response = c.post(
        "/runs/new/",
        {"goal": "g", "checks": "test -f done.txt", "provider": "external",
         "heartbeat_seconds": "45"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = Run.objects.get()
    assert run.is_external and run.heartbeat_seconds == 45 and run.status == RunStatus.QUEUED
    assert response["Location"] == f"/runs/{run.pk}/"
    again = c.get(f"/runs/new/?from={run.pk}").content.decode()
    assert 'name="heartbeat_seconds" value="45"' in again
    assert '<option value="external" selected>' in again


def test_a_heartbeat_left_in_the_hidden_field_means_nothing_for_other_providers(owner):
    response = client_for(owner).post(
        "/runs/new/",
        {"goal": "g", "checks": "true", "provider": "scripted", "heartbeat_seconds": "9"},
    )
    assert response.status_code == 302
    assert Run.objects.get().heartbeat_seconds is None


def test_a_bad_heartbeat_is_said_plainly(owner):
    response = client_for(owner).post(
        "/runs/new/",
        {"goal": "g", "checks": "true", "provider": "external", "heartbeat_seconds": "0"},
    )
    assert response.status_code == 400 and not Run.objects.exists()
    assert "greater than or equal to 1" in response.content.decode()


# --- the CLI ---------------------------------------------------------------------------------------
def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_show_run_says_external_last_contact_and_stalled(owner):
    run = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    data = json.loads(cli("show_run", str(run.pk), "--json"))
    assert data["provider"] == "external" and data["external"] is True
    assert data["stalled"] is True and data["heartbeat_seconds"] == 60
    assert data["last_contact_at"] == run.last_contact_at.isoformat()
    text = cli("show_run", str(run.pk))
    assert "provider:  external (an agent driving it through the API)" in text
    assert "last contact" in text and "(5 min ago)" in text and "heartbeat 60 s" in text
    assert "STALLED" in text
    fresh = external(owner)
    text = cli("show_run", str(fresh.pk))
    assert "no contact yet" in text and "STALLED" not in text
    internal = json.loads(cli("show_run", str(make_run().pk), "--json"))
    assert internal["external"] is False and internal["stalled"] is False
    assert internal["heartbeat_seconds"] is None


def test_the_overview_command_counts_stalled_runs(owner):
    run = external(owner, silent=300, heartbeat=60, status=RunStatus.RUNNING)
    external(owner, silent=1, heartbeat=60, status=RunStatus.RUNNING)
    text = cli("overview")
    assert "stalled (external, silent past their heartbeat): 1" in text
    assert f"run {run.pk} (running): silent for 5 min, heartbeat 60 s" in text
    data = json.loads(cli("overview", "--json"))
    assert data["stalled"] == 1 and data["stalled_runs"][0]["run"] == run.pk
