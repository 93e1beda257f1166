"""Dashboard pages: an owner, a viewer (may watch every run, not decide), a supervisor (may
watch, control and decide) and an outsider; queries counted on every list and stream view."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import eventlog, services
from agents.blobstore import BlobStore
from agents.models import Approval, Artifact, Run
from tests.helpers import client_for, drive_until_idle, make_run

pytestmark = pytest.mark.django_db


# --- logging in --------------------------------------------------------------------------------
PAGES = ["/", "/runs/new/", "/runs/1/", "/runs/1/events/?before=5", "/approvals/"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_requires_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_the_login_page_logs_in_with_a_password(client, owner):
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post("/accounts/login/", {"username": "olivia", "password": "pw-olivia-1"})
    assert response.status_code == 302 and response["Location"] == "/overview/"
    assert client.get("/").status_code == 200


def test_a_wrong_password_is_refused_on_the_page(client, owner):
    response = client.post("/accounts/login/", {"username": "olivia", "password": "nope"})
    assert response.status_code == 200 and b'class="error"' in response.content


# --- runs list ---------------------------------------------------------------------------------
def test_the_runs_list_shows_own_runs_labelled_offline(owner):
    run = make_run(goal="count the words", created_by=owner)
    page = client_for(owner).get("/")
    html = page.content.decode()
    assert f'id="run-{run.pk}"' in html and "count the words" in html
    assert "scripted · offline" in html
    assert 'ws-connect="/ws/live/runs/?page=1"' in html


def test_the_runs_list_hides_other_peoples_runs_from_an_outsider(owner, outsider, viewer):
    run = make_run(goal="secret goal", created_by=owner)
    assert "secret goal" not in client_for(outsider).get("/").content.decode()
    assert f'id="run-{run.pk}"' in client_for(viewer).get("/").content.decode()


def test_the_runs_list_filters_by_status_and_searches_goals(owner):
    a = make_run(goal="alpha task", created_by=owner)
    b = make_run(goal="beta task", created_by=owner)
    services.pause_run(b.pk, actor="test")
    c = client_for(owner)
    paused = c.get("/?status=paused").content.decode()
    assert f'id="run-{b.pk}"' in paused and f'id="run-{a.pk}"' not in paused
    found = c.get("/?q=ALPHA").content.decode()
    assert f'id="run-{a.pk}"' in found and f'id="run-{b.pk}"' not in found


def test_an_htmx_filter_gets_only_the_table(owner):
    make_run(created_by=owner)
    response = client_for(owner).get("/?q=test", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="run-table"') and "<html" not in html
    # A live list re-reads itself (a dropped push is made good); the same page, the same query.
    assert 'hx-get="/?q=test" hx-trigger="every 10s"' in html.replace("&amp;", "&")
    stuck = client_for(owner).get("/?stuck=1", HTTP_HX_REQUEST="true").content.decode()
    assert 'hx-trigger="every' not in stuck.split(">", 1)[0]  # a filtered list is as loaded


def test_the_runs_list_is_paginated(owner):
    for i in range(30):
        make_run(goal=f"run number {i}", created_by=owner)
    c = client_for(owner)
    first = c.get("/").content.decode()
    assert first.count('<tr id="run-') == 25 and "25 shown · 30 runs" in first
    older = re.search(r'href="\?after=([0-9-]+)" rel="next"', first)[1]
    second = c.get(f"/?after={older}").content.decode()
    assert second.count('<tr id="run-') == 5 and 'rel="next"' not in second


def test_the_runs_list_makes_no_query_per_row(owner, supervisor):
    c = client_for(supervisor)
    make_run(created_by=owner)
    with CaptureQueriesContext(connection) as one:
        assert c.get("/").status_code == 200
    for _ in range(12):
        run = make_run(created_by=owner)
        drive_until_idle(run)
    with CaptureQueriesContext(connection) as many:
        assert c.get("/").status_code == 200
    assert len(many) == len(one), [q["sql"] for q in many]


def test_the_runs_list_shows_session_cost_and_waiting_approvals(owner, waiting_run):
    html = client_for(owner).get("/").content.decode()
    row = html.split(f'id="run-{waiting_run.pk}"')[1].split("</tr>")[0]
    assert "Awaiting approval" in row and "1 waiting" in row
    assert '<td data-label="Session">2</td>' in row


# --- new run -----------------------------------------------------------------------------------
def test_without_a_key_the_anthropic_provider_is_listed_disabled_with_the_reason(owner):
    html = client_for(owner).get("/runs/new/").content.decode()
    assert 'value="scripted"' in html
    assert '<option value="anthropic" disabled>' in html and "set ANTHROPIC_API_KEY" in html
    # Posting it anyway is refused, next to the field.
    response = client_for(owner).post(
        "/runs/new/", {"goal": "g", "checks": "true", "provider": "anthropic"}
    )
    assert response.status_code == 400 and not Run.objects.exists()
    assert "Anthropic is unavailable here" in response.content.decode()


def test_with_a_key_the_anthropic_provider_can_be_chosen(owner, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ANTHROPIC_API_KEY": "sk-test"}
    html = client_for(owner).get("/runs/new/").content.decode()
    assert '<option value="anthropic">Anthropic</option>' in html


def test_the_demo_prefills_the_form(owner):
    html = client_for(owner).get("/runs/new/?demo=1").content.decode()
    assert "textstats.py" in html and "python3 -m unittest -q" in html


def test_starting_the_demo_from_the_form_creates_a_queued_run(owner):
    response = client_for(owner).post(
        "/runs/new/",
        {
            "goal": services.DEMO_GOAL,
            "checks": "python3 -m unittest -q",
            "provider": "scripted",
            "max_sessions": "5",
            "max_turns_per_session": "4",
        },
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.created_by == owner and run.status == "queued" and run.max_sessions == 5
    assert run.script_name == "demo (built in)" and run.max_turns_per_session == 4
    assert drive_until_idle(run).status == "awaiting_approval"


def test_an_uploaded_script_is_played(owner):
    script = {
        "name": "mine",
        "turns": [{"text": "hi", "tool_calls": [{"name": "finish", "input": {"summary": "ok"}}]}],
    }
    upload = io.BytesIO(json.dumps(script).encode())
    upload.name = "mine.json"
    client_for(owner).post(
        "/runs/new/", {"goal": "g", "checks": "true", "provider": "scripted", "script": upload}
    )
    run = Run.objects.get()
    assert run.script_name == "mine.json" and drive_until_idle(run).status == "succeeded"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"goal": "", "checks": "true"}, "goal", "required"),
        ({"goal": "g", "checks": "  \n "}, "checks", "required"),
        ({"goal": "g", "checks": "true", "tool_policy": "[{"}, "tool_policy", "not valid JSON"),
        (
            {"goal": "g", "checks": "true", "tool_policy": '[{"tool": "bash", "action": "maybe"}]'},
            "tool_policy",
            "action",
        ),
        (
            {"goal": "g", "checks": "true", "max_sessions": "0"},
            "max_sessions",
            "greater than or equal to 1",
        ),
    ],
)
def test_form_errors_are_shown_next_to_their_field(owner, data, field, message):
    response = client_for(owner).post("/runs/new/", {"provider": "scripted", **data})
    assert response.status_code == 400 and not Run.objects.exists()
    html = response.content.decode()
    block = html.split(f'id="field-{field}"')[1].split('<div class="field')[0]
    assert "has-error" in html.split(f'id="field-{field}"')[0][-40:]
    assert message in block, block


def test_a_bad_script_upload_is_an_inline_error(owner):
    upload = io.BytesIO(b'{"turns": "no"}')
    upload.name = "bad.json"
    response = client_for(owner).post(
        "/runs/new/", {"goal": "g", "checks": "true", "provider": "scripted", "script": upload}
    )
    block = response.content.decode().split('id="field-script"')[1].split('<div class="field')[0]
    assert response.status_code == 400 and "turns" in block


# --- run detail --------------------------------------------------------------------------------
def test_the_owner_sees_the_run_with_controls_and_its_stream(owner, waiting_run):
    html = client_for(owner).get(f"/runs/{waiting_run.pk}/").content.decode()
    assert "scripted · offline" in html and "Awaiting approval" in html
    assert "Pause</button>" in html and "Add note" in html and "Save policy" in html
    assert (
        'data-seq="1"' in html
        and "python3 -m unittest -v 2&gt;&amp;1 &amp;&amp; rm -rf build" in html
    )
    assert "Session 1" in html and "Handoff notes" in html and "handoff-session-1.md" in html
    assert f'ws-connect="/ws/live/runs/{waiting_run.pk}/?after={waiting_run.last_seq}"' in html
    # The owner may control, but deciding takes the permission.
    assert 'value="approve"' not in html and "Waiting for someone who may decide" in html


def test_a_viewer_sees_the_run_without_controls(viewer, waiting_run):
    html = client_for(viewer).get(f"/runs/{waiting_run.pk}/").content.decode()
    assert "Awaiting approval" in html
    assert "Pause</button>" not in html and "Add note" not in html and 'value="approve"' not in html


def test_a_supervisor_can_decide_inline(supervisor, waiting_run):
    html = client_for(supervisor).get(f"/runs/{waiting_run.pk}/").content.decode()
    assert 'value="approve"' in html and 'value="deny"' in html and 'value="edit"' in html


def test_an_outsider_gets_404_for_a_run(outsider, waiting_run):
    c = client_for(outsider)
    assert c.get(f"/runs/{waiting_run.pk}/").status_code == 404
    assert c.get(f"/runs/{waiting_run.pk}/events/?before=10").status_code == 404
    assert c.post(f"/runs/{waiting_run.pk}/pause").status_code == 404


def test_model_and_tool_output_is_escaped(owner):
    run = make_run(
        turns=[
            {
                "text": "<script>alert(1)</script>",
                "tool_calls": [
                    {"name": "bash", "input": {"command": "echo '<img src=x onerror=alert(2)>'"}}
                ],
            }
        ],
        created_by=owner,
    )
    drive_until_idle(run)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "<img src=x" not in html


def long_run(owner, events: int) -> Run:
    run = make_run(created_by=owner)
    batch = [
        eventlog.NewEvent(
            kind="tool.result", payload={"tool_use_id": "t", "name": "bash", "output": "x" * 50}
        )
        for _ in range(500)
    ]
    for _ in range(events // 500):
        eventlog.append_many(run.pk, batch)
    run.refresh_from_db()
    return run


def test_a_long_run_opens_with_the_newest_events_and_the_same_queries(owner):
    small = make_run(created_by=owner)
    c = client_for(owner)
    with CaptureQueriesContext(connection) as few:
        c.get(f"/runs/{small.pk}/")
    big = long_run(owner, 5000)
    with CaptureQueriesContext(connection) as many:
        html = c.get(f"/runs/{big.pk}/").content.decode()
    assert len(many) == len(few)
    assert html.count('class="ev ') == 50 and f'data-seq="{big.last_seq}"' in html
    assert f"?before={big.last_seq - 49}" in html  # the "older" marker


def test_older_events_load_page_by_page(owner):
    big = long_run(owner, 1000)
    c = client_for(owner)
    with CaptureQueriesContext(connection) as q:
        html = c.get(f"/runs/{big.pk}/events/?before=101", HTTP_HX_REQUEST="true").content.decode()
    assert html.count('class="ev ') == 50 and 'data-seq="51"' in html and 'data-seq="100"' in html
    assert "?before=51" in html and "<html" not in html
    first = c.get(f"/runs/{big.pk}/events/?before=51").content.decode()
    assert 'data-seq="1"' in first and 'id="older"' not in first
    assert len(q) <= 5


# --- controls ----------------------------------------------------------------------------------
def test_the_owner_pauses_resumes_and_cancels(owner):
    run = make_run(created_by=owner)
    c = client_for(owner)
    response = c.post(f"/runs/{run.pk}/pause", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'id="run-header"' in response.content.decode()
    run.refresh_from_db()
    assert run.status == "paused"
    c.post(f"/runs/{run.pk}/resume")
    run.refresh_from_db()
    assert run.status == "queued"
    c.post(f"/runs/{run.pk}/cancel")
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_an_illegal_action_shows_why(owner):
    run = make_run(created_by=owner)
    html = client_for(owner).post(f"/runs/{run.pk}/resume", HTTP_HX_REQUEST="true").content.decode()
    assert "only a paused run can be resumed" in html


def test_a_note_reaches_the_log(owner):
    run = make_run(created_by=owner)
    client_for(owner).post(f"/runs/{run.pk}/note", {"text": "try harder"})
    assert run.events.filter(kind="human.note", payload__text="try harder").exists()


def test_a_viewer_cannot_control(viewer, owner):
    run = make_run(created_by=owner)
    c = client_for(viewer)
    for url in ("pause", "cancel", "note", "policy"):
        assert c.post(f"/runs/{run.pk}/{url}", {"text": "x", "rules": "[]"}).status_code == 403
    run.refresh_from_db()
    assert run.status == "queued"


def test_nothing_changes_on_get(owner):
    run = make_run(created_by=owner)
    c = client_for(owner)
    for url in ("pause", "resume", "cancel", "note", "policy"):
        assert c.get(f"/runs/{run.pk}/{url}").status_code == 405
    assert c.get("/approvals/1/decide").status_code == 405


def test_posts_need_a_csrf_token(owner):
    run = make_run(created_by=owner)
    c = Client(enforce_csrf_checks=True)
    c.force_login(owner)
    assert c.post(f"/runs/{run.pk}/pause").status_code == 403
    page = c.get(f"/runs/{run.pk}/")
    token = page.cookies["csrftoken"].value
    assert c.post(f"/runs/{run.pk}/pause", HTTP_X_CSRFTOKEN=token).status_code == 302
    assert "X-CSRFToken" in page.content.decode()  # htmx sends it from <body hx-headers>


def test_the_tool_policy_is_set_and_validated(owner):
    run = make_run(created_by=owner)
    c = client_for(owner)
    bad = c.post(f"/runs/{run.pk}/policy", {"rules": '[{"tool": "bash"}]'}, HTTP_HX_REQUEST="true")
    assert 'class="error"' in bad.content.decode()
    rules = [{"tool": "bash", "pattern": "^ls", "action": "deny"}]
    c.post(f"/runs/{run.pk}/policy", {"rules": json.dumps(rules)}, HTTP_HX_REQUEST="true")
    run.refresh_from_db()
    assert run.tool_policy[0]["action"] == "deny"


# --- approvals ---------------------------------------------------------------------------------
def test_the_inbox_lists_waiting_calls_as_a_diff(supervisor, waiting_run):
    c = client_for(supervisor)
    with CaptureQueriesContext(connection) as q:
        html = c.get("/approvals/").content.decode()
    approval = Approval.objects.get()
    assert f'id="approval-{approval.pk}"' in html and "rm -rf build" in html
    assert '<span class="add">+ $ python3' in html and "scripted · offline" in html
    assert 'id="approval-count"' in html and ">1</span>" in html
    assert len(q) <= 6, "\n".join(x["sql"][:150] for x in q.captured_queries)


def test_the_inbox_makes_no_query_per_approval(supervisor, owner):
    c = client_for(supervisor)
    drive_until_idle(services.create_demo_run(created_by=owner))
    with CaptureQueriesContext(connection) as one:
        c.get("/approvals/")
    for _ in range(3):
        drive_until_idle(services.create_demo_run(created_by=owner))
    with CaptureQueriesContext(connection) as many:
        html = c.get("/approvals/").content.decode()
    assert html.count('class="approval a-pending"') == 4 and len(many) == len(one)


def test_a_supervisor_approves_in_place(supervisor, waiting_run):
    approval = Approval.objects.get()
    response = client_for(supervisor).post(
        f"/approvals/{approval.pk}/decide", {"decision": "approve"}, HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert response.status_code == 200 and "Approved by sam" in html
    waiting_run.refresh_from_db()
    assert waiting_run.status == "queued"


def test_a_supervisor_edits_then_approves(supervisor, waiting_run):
    approval = Approval.objects.get()
    c = client_for(supervisor)
    box = c.get("/approvals/").content.decode()
    # The edit box holds the call's input as JSON: the one format an edit takes everywhere.
    assert (
        ">{\n  &quot;command&quot;: &quot;python3 -m unittest -v 2&gt;&amp;1 &amp;&amp; rm -rf"
        in box
    )
    c.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "edit", "edited": '{"command": "python3 -m unittest -v 2>&1"}'},
        HTTP_HX_REQUEST="true",
    )
    approval.refresh_from_db()
    assert (
        approval.status == "approved"
        and approval.edited_input["command"] == "python3 -m unittest -v 2>&1"
    )


def test_an_edit_that_is_not_the_tools_json_input_is_refused_and_nothing_runs(
    supervisor, waiting_run
):
    approval = Approval.objects.get()
    before = waiting_run.last_seq
    c = client_for(supervisor)
    for edited, message in [
        ("python3 -m unittest -v", "not valid JSON"),  # a bare command is not the format
        ('["ls"]', "must be a JSON object"),
        ('{"cmd": "ls"}', "missing required field &#x27;command&#x27;"),
        ("[" * 5000 + "]" * 5000, "nested more than"),
        ('{"command": NaN}', "NaN is not a number JSON allows"),
    ]:
        html = c.post(
            f"/approvals/{approval.pk}/decide",
            {"decision": "edit", "edited": edited},
            HTTP_HX_REQUEST="true",
        ).content.decode()
        assert message in html, (edited[:40], html)
    approval.refresh_from_db()
    waiting_run.refresh_from_db()
    assert approval.status == "pending" and waiting_run.last_seq == before


def test_a_denial_needs_a_reason(supervisor, waiting_run):
    approval = Approval.objects.get()
    c = client_for(supervisor)
    html = c.post(
        f"/approvals/{approval.pk}/decide", {"decision": "deny"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "needs a reason" in html
    c.post(f"/approvals/{approval.pk}/decide", {"decision": "deny", "comment": "not now"})
    approval.refresh_from_db()
    assert approval.status == "denied" and approval.comment == "not now"


def test_a_second_decision_says_who_was_first(supervisor, waiting_run):
    approval = Approval.objects.get()
    c = client_for(supervisor)
    c.post(f"/approvals/{approval.pk}/decide", {"decision": "approve"})
    html = c.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "deny", "comment": "x"},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    assert "already approved by sam" in html


def test_a_viewer_sees_the_inbox_but_cannot_decide(viewer, waiting_run):
    c = client_for(viewer)
    html = c.get("/approvals/").content.decode()
    assert "rm -rf build" in html and 'value="approve"' not in html
    approval = Approval.objects.get()
    assert (
        c.post(
            f"/approvals/{approval.pk}/decide", {"decision": "approve"}, HTTP_HX_REQUEST="true"
        ).status_code
        == 403
    )
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_outsider_sees_no_approvals_and_cannot_decide(outsider, waiting_run):
    c = client_for(outsider)
    assert "rm -rf build" not in c.get("/approvals/").content.decode()
    approval = Approval.objects.get()
    assert c.post(f"/approvals/{approval.pk}/decide", {"decision": "approve"}).status_code == 404


# --- artifacts ---------------------------------------------------------------------------------
def artifact(run, name, data: bytes, mime: str) -> Artifact:
    digest = BlobStore().put(data)
    return Artifact.objects.create(
        run=run, name=name, kind="file", blob_hash=digest, size=len(data), mime_type=mime
    )


def test_a_text_artifact_is_highlighted(owner):
    run = make_run(created_by=owner)
    a = artifact(run, "m.py", b"def f():\n    return '<b>'\n", "text/x-python")
    html = client_for(owner).get(f"/runs/{run.pk}/artifacts/{a.pk}/").content.decode()
    assert 'class="hl' in html and "&lt;b&gt;" in html and "<b>'" not in html


def test_a_markdown_artifact_is_rendered_and_sanitised(owner):
    run = make_run(created_by=owner)
    a = artifact(
        run,
        "notes.md",
        b"# Title\n\n<script>alert(1)</script>\n\n[x](javascript:alert(2)) *ok*",
        "text/markdown",
    )
    html = client_for(owner).get(f"/runs/{run.pk}/artifacts/{a.pk}/").content.decode()
    assert "<h1>Title</h1>" in html and "<em>ok</em>" in html
    assert "<script>alert" not in html and "javascript:" not in html


def test_an_image_is_shown_inline_and_anything_downloads(owner, outsider):
    run = make_run(created_by=owner)
    png = artifact(run, "plot.png", b"\x89PNG\r\n\x1a\nfake", "image/png")
    svg = artifact(run, "x.svg", b"<svg onload=alert(1)>", "image/svg+xml")
    c = client_for(owner)
    assert "?inline=1" in c.get(f"/runs/{run.pk}/artifacts/{png.pk}/").content.decode()
    inline = c.get(f"/runs/{run.pk}/artifacts/{png.pk}/download?inline=1")
    assert (
        inline["Content-Type"] == "image/png" and "attachment" not in inline["Content-Disposition"]
    )
    forced = c.get(f"/runs/{run.pk}/artifacts/{svg.pk}/download?inline=1")
    assert (
        "attachment" in forced["Content-Disposition"]
        and forced["Content-Type"] == "application/octet-stream"
    )
    assert (
        client_for(outsider).get(f"/runs/{run.pk}/artifacts/{png.pk}/download").status_code == 404
    )


@pytest.mark.parametrize(
    ("name", "mime", "body"),
    [
        ("page.html", "text/html", b"<script>alert(1)</script><img src=x onerror=alert(2)>"),
        ("x.svg", "image/svg+xml", b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>"),
        (
            "feed.xml",
            "application/xml",
            b"<?xml version='1.0'?><x:script xmlns:x='http://www.w3.org/1999/xhtml'>alert(1)</x:script>",
        ),
    ],
)
def test_active_artifacts_are_shown_as_text_and_downloaded_never_rendered(owner, name, mime, body):
    run = make_run(created_by=owner)
    a = artifact(run, name, body, mime)
    c = client_for(owner)
    page = c.get(f"/runs/{run.pk}/artifacts/{a.pk}/").content.decode()
    assert (
        "<script>alert" not in page and "onload='alert" not in page and "onerror=alert" not in page
    )
    assert "&lt;" in page  # shown as text, escaped
    for url in (f"{a.pk}/download", f"{a.pk}/download?inline=1"):
        got = c.get(f"/runs/{run.pk}/artifacts/{url}")
        assert "attachment" in got["Content-Disposition"], url
        assert got["Content-Type"] == "application/octet-stream", url
        assert got["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in got["Content-Security-Policy"]


def test_the_header_counts_waiting_approvals_on_every_page(supervisor, waiting_run):
    for url in ("/", "/runs/new/", f"/runs/{waiting_run.pk}/", "/approvals/"):
        html = client_for(supervisor).get(url).content.decode()
        assert '<span id="approval-count" class="count hot"' in html, url


def test_the_one_time_login_link_still_lands_on_the_runs_list(client, owner):
    from django.contrib.auth.tokens import default_token_generator
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    uid = urlsafe_base64_encode(force_bytes(owner.pk))
    token = default_token_generator.make_token(owner)
    response = client.post(f"/login/{uid}/{token}/")
    assert response.status_code == 302 and client.get(response["Location"]).status_code == 200


def verification_events(run: Run) -> None:
    """One event of each verification kind, with markup in the text the agent or judge wrote."""
    eventlog.append_many(
        run.pk,
        [
            eventlog.NewEvent(
                "check.regressed", {"command": "pytest -q", "passed_at_seq": 3, "at": "finish"}
            ),
            eventlog.NewEvent(
                "check.tampered",
                {
                    "files": [{"path": "tests/<conftest>.py", "change": "added"}],
                    "at": "session_end",
                },
            ),
            eventlog.NewEvent(
                "drift.warning",
                {
                    "coverage": 0.05,
                    "threshold": 0.2,
                    "goal_words_missing": ["invoices", "<csv>"],
                    "summary": "tidied <b>logging</b>",
                    "forced": True,
                },
            ),
            eventlog.NewEvent(
                "judge.verdict",
                {
                    "passed": False,
                    "model": "claude-haiku-4-5",
                    "error": "",
                    "criteria": [
                        {"criterion": "README explains add", "passed": True, "reason": "it does"},
                        {
                            "criterion": "docs <i>cover</i> errors",
                            "passed": False,
                            "reason": "<script>alert(3)</script> nothing on errors",
                        },
                    ],
                },
                actor="judge",
            ),
        ],
    )


def test_the_run_page_shows_regressions_and_tampering_prominently_and_verdicts_per_criterion(
    owner,
):
    run = make_run(created_by=owner)
    verification_events(run)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert html.count('class="warning-banner" role="alert"') == 2
    assert "<b>⚠ Regression:</b> <code>pytest -q</code> passed at #3 and fails now" in html
    assert "<b>⚠ Protected files tampered with</b>" in html
    assert '<code>tests/&lt;conftest&gt;.py</code> <span class="bad">added</span>' in html
    assert "the forced handoff (the agent's last words) speaks of 5% of the goal" in html
    assert "Missing: invoices, &lt;csv&gt;" in html
    assert '<span class="good">✔ pass</span> <b>README explains add</b> — it does' in html
    assert (
        '<span class="bad">✘ fail</span> <b>docs &lt;i&gt;cover&lt;/i&gt; errors</b> — '
        "&lt;script&gt;alert(3)&lt;/script&gt; nothing on errors"
    ) in html
    assert "<script>alert(3)" not in html and "<b>logging</b>" not in html
    assert "{&#x27;" not in html  # no payload shown as a raw dict


def test_a_run_with_many_sessions_and_checkpoints_shows_the_newest_and_older_in_pages(owner):
    from agents import checkpoints as cps
    from agents.models import Checkpoint, Session
    from dashboard.panels import PANEL_ITEMS

    run = make_run(created_by=owner)
    Session.objects.bulk_create(Session(run=run, index=i) for i in range(1, PANEL_ITEMS + 6))
    for i in range(PANEL_ITEMS + 3):
        cps.create(run.pk, kind="manual", label=f"cp-{i}")
    total_checkpoints = Checkpoint.objects.filter(run=run).count()
    c = client_for(owner)
    with CaptureQueriesContext(connection) as queries:
        html = c.get(f"/runs/{run.pk}/").content.decode()
    sessions = html.split('id="sessions"')[1].split("</section>")[0]
    assert sessions.count("<b>Session ") == PANEL_ITEMS
    assert f"<b>Session {PANEL_ITEMS + 5}</b>" in sessions and "<b>Session 1</b>" not in sessions
    assert "Earlier sessions… (5 more)" in sessions and "/sessions/?before=6" in sessions
    timeline = html.split('id="checkpoints"')[1].split("</section>")[0]
    assert timeline.count('<li id="checkpoint-') == PANEL_ITEMS
    assert f"Older checkpoints… ({total_checkpoints - PANEL_ITEMS} more)" in timeline
    assert f"cp-{PANEL_ITEMS + 2}" in timeline  # the newest
    assert len(queries) < 25  # bounded, not one per item
    # "show all" from an older page's link is the newest page now: nothing loads everything.
    everything = c.get(f"/runs/{run.pk}/?all=1").content.decode()
    assert everything.count("<b>Session ") == PANEL_ITEMS
    earlier = c.get(f"/runs/{run.pk}/sessions/?before=6", HTTP_HX_REQUEST="true").content.decode()
    assert earlier.count("<b>Session ") == 5 and "Earlier sessions" not in earlier


def test_the_new_run_form_sets_allowed_hosts_and_sandbox_limits(owner):
    from agents.models import Run

    c = client_for(owner)
    response = c.post(
        "/runs/new/",
        {
            "goal": "fetch the index",
            "checks": "true",
            "provider": "scripted",
            "allowed_hosts": "pypi.org:443\nfiles.example",
            "max_memory_mb": "256",
            "max_processes": "64",
        },
    )
    assert response.status_code == 302
    run = Run.objects.get(goal="fetch the index")
    assert [r["pattern"] for r in run.tool_policy] == [r"^pypi\.org:443$", r"^files\.example:\d+$"]
    assert (run.limits["memory_mb"], run.limits["processes"]) == (256, 64)
    bad = c.post(
        "/runs/new/",
        {"goal": "g", "checks": "true", "provider": "scripted", "allowed_hosts": "not a host"},
    )
    assert bad.status_code == 400 and b"not a host name" in bad.content


def test_an_edited_approval_shows_what_was_asked_against_what_ran_in_web_and_cli(
    supervisor, waiting_run
):
    from io import StringIO

    from django.core.management import call_command
    from django.utils.html import escape

    approval = Approval.objects.get()
    asked = approval.tool_input["command"]
    card = (
        client_for(supervisor)
        .post(
            f"/approvals/{approval.pk}/decide",
            {"decision": "edit", "edited": '{"command": "rm -rf build"}'},
            HTTP_HX_REQUEST="true",
        )
        .content.decode()
    )
    assert '<span class="del">-' in card and '<span class="add">+rm -rf build' in card
    assert escape(asked) in card  # the original is still there, struck out
    out = StringIO()
    call_command("approvals", "--all", stdout=out)
    assert "bash rm -rf build  (edited; asked: " in out.getvalue()
    rows = StringIO()
    call_command("approvals", "--all", "--json", stdout=rows)
    import json

    row = json.loads(rows.getvalue())[0]
    assert row["ran"] == {"command": "rm -rf build"} and row["edited"] is True
