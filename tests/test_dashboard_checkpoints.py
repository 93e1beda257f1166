"""The run page's checkpoint timeline, rewind and fork from the dashboard, and the diff view: an
owner, a viewer (may watch every run, not control it) and an outsider; GETs change nothing;
queries counted."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import checkpoints, rewinds, services
from agents.models import Approval, Checkpoint, Event, Run
from tests.helpers import approve_pending, client_for, drive_until_idle, make_run, run_queued

pytestmark = pytest.mark.django_db


def cp(run: Run, kind: str) -> Checkpoint:
    return run.checkpoints.get(kind=kind)


def state(run: Run) -> tuple:
    run.refresh_from_db()
    return (
        run.status,
        run.last_seq,
        Event.objects.filter(run=run).count(),
        Checkpoint.objects.filter(run=run).count(),
        Run.objects.count(),
        run.head_checkpoint_id,
        sorted(p.name for p in run.workspace_path.iterdir()),
        (run.workspace_path / "textstats.py").read_text(),
    )


# --- the timeline ------------------------------------------------------------------------------
def test_the_timeline_shows_each_checkpoint_with_its_usage_and_actions(owner, waiting_run):
    html = client_for(owner).get(f"/runs/{waiting_run.pk}/").content.decode()
    section = html.split('id="checkpoints"')[1].split("</section>")[0]
    start, end, pre = (cp(waiting_run, k) for k in ("run_start", "session_end", "pre_approval"))
    for c in (start, end, pre):
        assert f'id="checkpoint-{c.number}"' in section
        assert f"<b>Checkpoint {c.number}</b>" in section and f"at #{c.seq}" in section
        assert f"/runs/{waiting_run.pk}/checkpoints/{c.number}/rewind" in section
        assert f"/runs/{waiting_run.pk}/checkpoints/{c.number}/fork" in section
        assert f"?a={c.number}&amp;b=live" in section
    assert "run start" in section and "session end" in section and "before approval" in section
    assert f"?a={start.number}&amp;b={end.number}" in section  # diff with previous
    assert f"{end.usage['total_tokens']} tokens" in section and "2 files" in section
    assert "Checkpoint now</button>" in section and 'badge head">head' in section
    # Session 1 ended with its tests failing: the ratchet's reading at that checkpoint.
    end_item = section.split(f'id="checkpoint-{end.number}"')[1].split("</li>")[0]
    assert 'class="bad"' in end_item and "checks 0/1" in end_item
    assert 'id="checkpoint-action"' in html  # where the confirm panels open, outside the push


def test_the_timeline_costs_the_same_queries_with_many_checkpoints(
    owner, django_assert_num_queries
):
    run = make_run(created_by=owner)
    c = client_for(owner)
    checkpoints.create(run.pk, kind="manual")
    with CaptureQueriesContext(connection) as one:
        assert c.get(f"/runs/{run.pk}/").status_code == 200
    for i in range(15):
        (run.workspace_path / f"f{i}.txt").write_text(str(i))
        checkpoints.create(run.pk, kind="manual", label=f"step {i}")
    rewinds.rewind(run.pk, run.checkpoints.order_by("seq")[3].pk, actor="test")
    with django_assert_num_queries(len(one)):
        html = c.get(f"/runs/{run.pk}/").content.decode()
    assert html.count('<li id="checkpoint-') == 16 and "abandoned by rewind" in html


def test_a_viewer_sees_the_timeline_and_diffs_but_no_actions(viewer, waiting_run):
    html = client_for(viewer).get(f"/runs/{waiting_run.pk}/").content.decode()
    section = html.split('id="checkpoints"')[1].split("</section>")[0]
    assert "diff with live" in section and "diff with previous" in section
    assert "Rewind…" not in section and "Fork…" not in section and "Checkpoint now" not in section


# --- access ------------------------------------------------------------------------------------
def test_a_viewer_may_not_rewind_fork_or_checkpoint(viewer, waiting_run):
    c = client_for(viewer)
    end = cp(waiting_run, "session_end")
    before = state(waiting_run)
    base = f"/runs/{waiting_run.pk}"
    assert c.get(f"{base}/checkpoints/{end.number}/rewind").status_code == 403
    assert c.get(f"{base}/checkpoints/{end.number}/fork").status_code == 403
    assert c.post(f"{base}/checkpoints/{end.number}/rewind", {"note": "x"}).status_code == 403
    assert c.post(f"{base}/checkpoints/{end.number}/fork", {"goal": "x"}).status_code == 403
    assert c.post(f"{base}/checkpoint", {"label": "x"}).status_code == 403
    assert state(waiting_run) == before
    assert c.get(f"{base}/diff/?a={end.number}&b=live").status_code == 200


def test_an_outsider_gets_404_everywhere(outsider, waiting_run):
    c = client_for(outsider)
    end = cp(waiting_run, "session_end")
    before = state(waiting_run)
    base = f"/runs/{waiting_run.pk}"
    for url in (f"checkpoints/{end.number}/rewind", f"checkpoints/{end.number}/fork"):
        assert c.get(f"{base}/{url}").status_code == 404
        assert c.post(f"{base}/{url}").status_code == 404
    assert c.post(f"{base}/checkpoint").status_code == 404
    assert c.get(f"{base}/diff/?a={end.number}&b=live").status_code == 404
    assert state(waiting_run) == before


def test_a_checkpoint_number_the_run_does_not_have_is_not_found(owner, waiting_run):
    # Numbers are per run: another run's checkpoint 9 is not this run's.
    other = make_run(created_by=owner)
    for _ in range(waiting_run.checkpoints.count() + 1):
        theirs = checkpoints.create(other.pk, kind="manual")
    assert not waiting_run.checkpoints.filter(number=theirs.number).exists()
    c = client_for(owner)
    base = f"/runs/{waiting_run.pk}"
    assert c.get(f"{base}/checkpoints/{theirs.number}/rewind").status_code == 404
    assert c.get(f"{base}/diff/?a={theirs.number}&b=live").status_code == 404
    assert (
        c.get(f"{base}/diff/?a={cp(waiting_run, 'run_start').number}&b={theirs.number}").status_code
        == 404
    )
    assert c.get(f"{base}/diff/").status_code == 404
    assert c.get(f"{base}/checkpoints/999999/fork").status_code == 404


def test_the_actions_are_posts_with_csrf(owner, waiting_run):
    end = cp(waiting_run, "session_end")
    before = state(waiting_run)
    c = Client(enforce_csrf_checks=True)
    c.force_login(owner)
    base = f"/runs/{waiting_run.pk}"
    assert c.post(f"{base}/checkpoints/{end.number}/rewind").status_code == 403
    assert c.post(f"{base}/checkpoints/{end.number}/fork").status_code == 403
    assert c.post(f"{base}/checkpoint").status_code == 403
    assert c.get(f"{base}/checkpoint").status_code == 405
    assert client_for(owner).put(f"{base}/checkpoints/{end.number}/rewind").status_code == 405
    assert state(waiting_run) == before


# --- rewind ------------------------------------------------------------------------------------
def test_the_rewind_panel_shows_what_would_be_discarded_and_changes_nothing(owner, waiting_run):
    end = cp(waiting_run, "session_end")
    c = client_for(owner)
    before = state(waiting_run)
    response = c.get(
        f"/runs/{waiting_run.pk}/checkpoints/{end.number}/rewind", HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    plan = rewinds.plan_rewind(waiting_run, end)
    assert f"<b>{plan.events}</b> events after #{end.seq}" in html
    assert "Sessions started after it: 2" in html and "textstats.py" in html
    assert "The waiting approval is discarded" in html and "tool.call" in html
    assert f"Rewind to checkpoint {end.number}</button>" in html and 'name="note"' in html
    # Without htmx the same panel is a page of its own.
    page = c.get(f"/runs/{waiting_run.pk}/checkpoints/{end.number}/rewind").content.decode()
    assert "<html" in page and 'id="confirm-panel"' in page
    assert state(waiting_run) == before
    assert Approval.objects.get().status == "pending"


def test_rewinding_from_the_dashboard_and_the_run_continues(
    owner, waiting_run, decider, django_capture_on_commit_callbacks
):
    end = cp(waiting_run, "session_end")
    c = client_for(owner)
    with django_capture_on_commit_callbacks(execute=True):
        response = c.post(
            f"/runs/{waiting_run.pk}/checkpoints/{end.number}/rewind",
            {"note": "be careful with rm"},
            HTTP_HX_REQUEST="true",
        )
    html = response.content.decode()
    assert response.status_code == 200 and f"Rewinding to checkpoint {end.number}" in html
    # The request only asked: the run is as it was until a worker takes the rewind.
    waiting_run.refresh_from_db()
    assert waiting_run.status == "awaiting_approval"
    asked = Event.objects.get(run=waiting_run, kind="run.rewind_requested")
    assert asked.actor == "user:olivia" and asked.payload["checkpoint_id"] == end.pk
    with django_capture_on_commit_callbacks(execute=True):
        assert [t.name for t in run_queued("rewind_run")] == ["rewind_run"]
    waiting_run.refresh_from_db()
    assert waiting_run.status == "queued" and waiting_run.head_checkpoint_id == end.pk
    # On its way the run paused, and said so in the log, without a webhook nobody asked for.
    paused = Event.objects.get(run=waiting_run, kind="run.status", payload__to="paused")
    assert f"to rewind to checkpoint {end.number}" in paused.payload["reason"]
    rewound = Event.objects.get(run=waiting_run, kind="run.rewound")
    assert rewound.actor == "user:olivia" and rewound.payload["note"] == "be careful with rm"
    # The demo replays session 2 and waits at its risky step again.
    run = drive_until_idle(waiting_run)
    assert run.status == "awaiting_approval"
    page = c.get(f"/runs/{run.pk}/").content.decode()
    # What the rewind left behind is shown muted and badged, the new branch is not.
    after, upto = rewound.payload["to_seq"], rewound.payload["from_seq"]
    assert f'data-abandons="{after}-{upto}"' in page
    for row in page.split('<div class="ev ')[1:]:
        seq = int(row.split('data-seq="')[1].split('"')[0])
        meta = row.split("</div>")[0]  # the row's tag and its meta line, where the badge goes
        assert ("abandoned" in row.split(">")[0]) == (after < seq <= upto), seq
        assert ("abandoned by rewind" in meta) == (after < seq <= upto), seq
    old_pre = run.checkpoints.filter(kind="pre_approval").order_by("seq").first()
    timeline = page.split('id="checkpoints"')[1].split("</section>")[0]
    assert f'id="checkpoint-{old_pre.number}" class="cp abandoned"' in timeline
    approve_pending(run, decider)
    assert drive_until_idle(run).status == "succeeded"


def test_older_pages_mark_abandoned_events_too(owner, waiting_run):
    end = cp(waiting_run, "session_end")
    rewinds.rewind(waiting_run.pk, end.pk, actor="test")
    upto = waiting_run.last_seq
    html = (
        client_for(owner)
        .get(f"/runs/{waiting_run.pk}/events/?before={upto + 1}", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert f'data-seq="{upto}"' in html and "abandoned by rewind" in html


def test_a_finished_run_cannot_be_rewound_only_forked(owner, decider):
    run = drive_until_idle(services.create_demo_run(created_by=owner))
    approve_pending(run, decider)
    run = drive_until_idle(run)
    assert run.status == "succeeded"
    end = cp(run, "run_start")
    c = client_for(owner)
    panel = c.get(f"/runs/{run.pk}/checkpoints/{end.number}/rewind", HTTP_HX_REQUEST="true")
    assert "can no longer be rewound" in panel.content.decode()
    before = state(run)
    refused = c.post(f"/runs/{run.pk}/checkpoints/{end.number}/rewind", HTTP_HX_REQUEST="true")
    assert "fork it from the checkpoint instead" in refused.content.decode()
    assert state(run) == before
    timeline = c.get(f"/runs/{run.pk}/").content.decode().split('id="checkpoints"')[1]
    assert "Rewind…" not in timeline.split("</section>")[0] and "Fork…" in timeline


# --- fork --------------------------------------------------------------------------------------
def test_a_fork_from_before_an_approval_says_the_waiting_call_is_not_made(owner, waiting_run):
    pre = cp(waiting_run, "pre_approval")
    waiting = waiting_run.approvals.get()
    c = client_for(owner)
    panel = c.get(f"/runs/{waiting_run.pk}/checkpoints/{pre.number}/fork").content.decode()
    assert "is not made by the fork" in panel and waiting.tool_name in panel
    # A checkpoint taken with nothing waiting says nothing of the kind.
    end = cp(waiting_run, "session_end")
    quiet = c.get(f"/runs/{waiting_run.pk}/checkpoints/{end.number}/fork").content.decode()
    assert "is not made by the fork" not in quiet
    c.post(f"/runs/{waiting_run.pk}/checkpoints/{pre.number}/fork")
    new = Run.objects.exclude(pk=waiting_run.pk).get()
    created = new.events.get(kind="run.created").payload["forked_from"]
    assert created["number"] == pre.number and created["run_id"] == waiting_run.pk
    assert created["skipped_call"]["approval_id"] == waiting.pk
    page = c.get(f"/runs/{new.pk}/").content.decode()
    assert "this run does not make that call" in page
    assert f"checkpoint {pre.number}." in page


def test_forking_from_the_dashboard_opens_the_new_run(owner, waiting_run):
    end = cp(waiting_run, "session_end")
    c = client_for(owner)
    panel = c.get(f"/runs/{waiting_run.pk}/checkpoints/{end.number}/fork", HTTP_HX_REQUEST="true")
    assert (
        "Not carried into the fork" in panel.content.decode()
        and 'name="goal"' in panel.content.decode()
    )
    response = c.post(
        f"/runs/{waiting_run.pk}/checkpoints/{end.number}/fork",
        {"goal": "the same, but tidier", "note": "start from the handoff"},
        HTTP_HX_REQUEST="true",
    )
    new = Run.objects.exclude(pk=waiting_run.pk).get()
    assert response.status_code == 204 and response["HX-Redirect"] == f"/runs/{new.pk}/"
    assert new.goal == "the same, but tidier" and new.created_by == owner
    assert new.forked_from_id == end.pk
    waiting_run.refresh_from_db()
    assert waiting_run.status == "awaiting_approval"  # the original is untouched
    plain = c.post(f"/runs/{waiting_run.pk}/checkpoints/{end.number}/fork")
    newer = Run.objects.order_by("-pk").first()
    assert plain.status_code == 302 and plain["Location"] == f"/runs/{newer.pk}/"
    assert newer.goal == waiting_run.goal


# --- checkpoint now ----------------------------------------------------------------------------
def test_checkpoint_now(owner, waiting_run):
    c = client_for(owner)
    response = c.post(
        f"/runs/{waiting_run.pk}/checkpoint", {"label": "before lunch"}, HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    made = waiting_run.checkpoints.get(kind="manual")
    assert made.label == "before lunch" and made.files == 2
    assert html.lstrip().startswith('<section id="checkpoints"') and "before lunch" in html
    assert f"checkpoint {made.number} saved" in html
    assert Event.objects.get(run=waiting_run, kind="checkpoint.created", seq=made.seq).actor == (
        "user:olivia"
    )
    assert c.post(f"/runs/{waiting_run.pk}/checkpoint").status_code == 302


# --- diff --------------------------------------------------------------------------------------
def test_the_diff_between_two_checkpoints(owner, waiting_run):
    start, end = cp(waiting_run, "run_start"), cp(waiting_run, "session_end")
    html = (
        client_for(owner)
        .get(f"/runs/{waiting_run.pk}/diff/?a={start.number}&b={end.number}")
        .content.decode()
    )
    assert f"Checkpoint {start.number} → checkpoint {end.number}" in html
    assert "2</b> files changed" in html and "2 added" in html
    assert '<code class="path">textstats.py</code> <span class="chg chg-added">added' in html
    assert '<span class="add">+def word_count' in html or '<span class="add">+' in html
    assert '<span class="file">+++ ' in html


def test_the_diff_with_the_live_workspace_escapes_and_shows_binaries(owner, waiting_run):
    end = cp(waiting_run, "session_end")
    ws = waiting_run.workspace_path
    (ws / "textstats.py").write_text("<script>alert(1)</script>\n")
    (ws / "data.bin").write_bytes(b"\x00\x01\x02binary\xff" * 10)
    (ws / "test_textstats.py").unlink()
    html = (
        client_for(owner)
        .get(f"/runs/{waiting_run.pk}/diff/?a={end.number}&b=live")
        .content.decode()
    )
    assert "→ live workspace" in html and "1 added" in html and "1 removed" in html
    assert "<script>alert(1)" not in html and '<span class="add">+&lt;script&gt;alert(1)' in html
    binary = html.split('<code class="path">data.bin</code>')[1].split("</section>")[0]
    assert "Binary file" in binary and "→ 100 bytes" in binary and "(100\xa0bytes)" in binary
    assert "<code>" in binary  # the new content's hash, shortened
    assert '<span class="del">-def word_count' in html or '<span class="del">-' in html


def test_the_diff_view_costs_the_same_queries_whatever_it_shows(owner, django_assert_num_queries):
    run = make_run(created_by=owner)
    a = checkpoints.create(run.pk, kind="manual")
    c = client_for(owner)
    with CaptureQueriesContext(connection) as few:
        assert c.get(f"/runs/{run.pk}/diff/?a={a.number}&b=live").status_code == 200
    for i in range(40):
        (run.workspace_path / f"f{i}.txt").write_text(f"line {i}\n")
    b = checkpoints.create(run.pk, kind="manual")
    with django_assert_num_queries(len(few)):
        html = c.get(f"/runs/{run.pk}/diff/?a={a.number}&b={b.number}").content.decode()
    assert html.count('class="card file-diff') == 40
    with django_assert_num_queries(len(few)):
        c.get(f"/runs/{run.pk}/diff/?a={a.number}&b=live")
    assert len(few) <= 7, [q["sql"][:120] for q in few.captured_queries]
