"""The API's surface: tokens and scopes, who sees what, errors as problem+json that change
nothing, the rate limit, paging, and each resource against what the services hold."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from django.core.management import call_command
from django.test import Client

from agents import services
from agents.models import Approval, Event, Run
from agents.runspec import RunSpec
from api.models import ApiToken
from tests.helpers import drive_until_idle

pytestmark = pytest.mark.django_db


def bearer(user, *scopes: str) -> Client:
    _, token = ApiToken.issue(user, list(scopes))
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client, url, body=None, **kw):
    return client.post(url, json.dumps(body or {}), content_type="application/json", **kw)


def is_problem(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.content[:500])
    assert r["Content-Type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["detail"]
    return body


# --- tokens -----------------------------------------------------------------------------------
def test_no_bad_revoked_or_expired_token_is_401(owner):
    assert is_problem(Client().get("/api/v1/runs"), 401)
    assert is_problem(Client(HTTP_AUTHORIZATION="Bearer nope").get("/api/v1/runs"), 401)
    row, token = ApiToken.issue(owner, ["read"])
    c = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert c.get("/api/v1/runs").status_code == 200
    row.revoke()
    is_problem(c.get("/api/v1/runs"), 401)
    from datetime import timedelta

    from django.utils import timezone

    _, token = ApiToken.issue(owner, ["read"], expires_at=timezone.now() - timedelta(seconds=1))
    is_problem(Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/runs"), 401)
    owner.is_active = False
    owner.save()
    _, token = ApiToken.issue(owner, ["read"])
    is_problem(Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/runs"), 401)


def test_only_a_hash_is_kept(owner):
    row, token = ApiToken.issue(owner, ["read"])
    assert token not in json.dumps(list(ApiToken.objects.values()), default=str)
    assert token.startswith(row.prefix)


def test_scopes_give_403(owner):
    reader = bearer(owner, "read")
    is_problem(post(reader, "/api/v1/runs", {"goal": "g", "checks": ["true"]}), 403)
    assert Run.objects.count() == 0
    writer = bearer(owner, "write")
    is_problem(writer.get("/api/v1/runs"), 403)
    assert post(writer, "/api/v1/runs", {"goal": "g", "checks": ["true"]}).status_code == 201


def test_create_token_command_prints_the_token_last_and_revoke_works(owner, capsys):
    call_command(
        "create_token", "--user", owner.username, "--scopes", "read,write", "--expires", "3"
    )
    lines = capsys.readouterr().out.strip().splitlines()
    token = lines[-1]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/runs").status_code == 200
    row = ApiToken.objects.get()
    assert row.scopes == ["read", "write"] and row.expires_at is not None
    call_command("revoke_token", str(row.pk))
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/runs").status_code == 401
    call_command("list_tokens")
    assert "revoked" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--user", "nobody", "--scopes", "read"], "no user named"),
        (["--user", "olivia", "--scopes", "read,admin"], "admin"),
        (["--user", "olivia", "--scopes", ""], "none given"),
        (["--user", "olivia", "--scopes", "read", "--expires", "0"], "DAYS"),
    ],
)
def test_create_token_bad_arguments(owner, args, message):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=message) as e:
        call_command("create_token", *args)
    assert e.value.returncode == 2
    assert ApiToken.objects.count() == 0


def test_revoke_token_bad_arguments(owner):
    from django.core.management.base import CommandError

    for arg in ("999", "abc", "shl_zzzzzz"):
        with pytest.raises(CommandError):
            call_command("revoke_token", arg)


def test_admin_lists_and_revokes_tokens(owner):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", password="pw-root-123")
    row, _ = ApiToken.issue(owner, ["read"], name="ci")
    c = Client()
    c.force_login(admin)
    page = c.get("/admin/api/apitoken/")
    assert page.status_code == 200 and row.prefix in page.content.decode()
    c.post(
        "/admin/api/apitoken/",
        {"action": "revoke", "_selected_action": [row.pk]},
    )
    row.refresh_from_db()
    assert row.revoked_at is not None


# --- who sees what ------------------------------------------------------------------------
def test_a_user_sees_through_the_api_what_the_web_shows(owner, outsider, viewer):
    mine = services.create_run(RunSpec(goal="mine", checks=["true"]), created_by=owner)
    other = services.create_run(RunSpec(goal="theirs", checks=["true"]), created_by=outsider)
    as_owner = bearer(owner, "read", "write")
    ids = [r["id"] for r in as_owner.get("/api/v1/runs").json()["items"]]
    assert ids == [mine.pk]
    is_problem(as_owner.get(f"/api/v1/runs/{other.pk}"), 404)
    is_problem(as_owner.get(f"/api/v1/runs/{other.pk}/events"), 404)
    is_problem(post(as_owner, f"/api/v1/runs/{other.pk}/pause"), 404)
    as_viewer = bearer(viewer, "read", "write")
    assert {r["id"] for r in as_viewer.get("/api/v1/runs").json()["items"]} == {mine.pk, other.pk}
    # A viewer may watch but not control, nor fork, as on the web.
    is_problem(post(as_viewer, f"/api/v1/runs/{mine.pk}/pause"), 403)
    is_problem(post(as_viewer, f"/api/v1/runs/{mine.pk}/fork", {"checkpoint": 1}), 403)
    assert Run.objects.get(pk=mine.pk).status == "queued"


def test_decide_needs_the_permission_as_well_as_the_scope(owner, waiting_run):
    approval = Approval.objects.get(run=waiting_run, status="pending")
    is_problem(
        post(
            bearer(owner, "read", "decide"),
            f"/api/v1/approvals/{approval.pk}/decision",
            {"decision": "approve"},
        ),
        403,
    )
    approval.refresh_from_db()
    assert approval.status == "pending"


# --- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"goal": "g", "checks": ["true"], "colour": "blue"}',
        b'{"goal": 5, "checks": "true"}',
        b'{"goal": "g", "checks": ["true"], "max_tokens": -1}',
        b'{"goal": "g", "checks": ["true"], "max_tokens": 99999999999999999999999999}',
        b'{"goal": "g", "checks": ["true"], "provider": "gpt"}',
        b'{"goal": ""}',
        b'{"goal": "\\ud800"}',
    ],
)
def test_bad_bodies_are_4xx_problems_and_change_nothing(owner, body):
    c = bearer(owner, "read", "write")
    r = c.post("/api/v1/runs", body, content_type="application/json")
    assert 400 <= r.status_code < 500, (r.status_code, r.content)
    assert r["Content-Type"] == "application/problem+json"
    assert Run.objects.count() == 0


def test_a_service_refusal_names_the_field(owner):
    c = bearer(owner, "read", "write")
    body = is_problem(
        post(c, "/api/v1/runs", {"goal": "g", "checks": ["true"], "webhook_urls": ["ftp://x"]}), 422
    )
    assert "webhook" in body["detail"]


def test_oversize_bodies_are_413(owner, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    c = bearer(owner, "read", "write")
    r = post(c, "/api/v1/runs", {"goal": "x" * 5000, "checks": ["true"]})
    is_problem(r, 413)
    assert Run.objects.count() == 0


def test_state_conflicts_are_409(owner):
    c = bearer(owner, "read", "write")
    run = services.create_run(RunSpec(goal="g", checks=["true"]), created_by=owner)
    is_problem(post(c, f"/api/v1/runs/{run.pk}/resume"), 409)
    assert (
        post(c, f"/api/v1/runs/{run.pk}/cancel", {"reason": "enough"}).json()["status"]
        == "cancelled"
    )
    is_problem(post(c, f"/api/v1/runs/{run.pk}/pause"), 409)
    is_problem(post(c, f"/api/v1/runs/{run.pk}/note", {"text": "hello"}), 409)


def test_ids_out_of_range_are_4xx_never_500(owner):
    c = bearer(owner, "read", "write")
    for url in (
        "/api/v1/runs/0",
        "/api/v1/runs/99999999999999999999999",
        "/api/v1/runs/abc",
        "/api/v1/approvals/-1",
        "/api/v1/artifacts/1e9",
        "/api/v1/tool-calls/" + "x" * 300,
    ):
        r = c.get(url)
        assert r.status_code in (404, 422), (url, r.status_code)


def test_rate_limit_is_429_with_retry_after(owner, settings):
    from api import main

    throttle = main.api.throttle[0] if isinstance(main.api.throttle, list) else main.api.throttle
    throttle.num_requests, throttle.duration = 3, 60
    try:
        c = bearer(owner, "read")
        codes = [c.get("/api/v1/runs").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/api/v1/runs")
        is_problem(r, 429)
        assert 1 <= int(r["Retry-After"]) <= 60
        # Per token: another token of the same user is not limited.
        assert bearer(owner, "read").get("/api/v1/runs").status_code == 200
    finally:
        throttle.num_requests, throttle.duration = throttle.parse_rate(throttle.rate)


# --- runs ---------------------------------------------------------------------------------
def test_create_run_with_cli_options_and_show_it(owner):
    c = bearer(owner, "read", "write")
    body = {
        "goal": "make tests pass",
        "checks": ["pytest -q"],
        "max_sessions": 3,
        "max_tokens": 5000,
        "max_cost_usd": "1.50",
        "max_turns_per_session": 7,
        "tool_policy": [{"tool": "bash", "action": "ask", "pattern": "pip"}],
        "acceptance": [{"name": "tests", "check": "pytest -q"}],
        "limits": {"memory_mb": 512},
        "allowed_hosts": ["pypi.org"],
        "approval_timeout_seconds": 600,
    }
    r = post(c, "/api/v1/runs", body)
    assert r.status_code == 201, r.content
    made = r.json()
    run = Run.objects.get(pk=made["id"])
    assert run.created_by == owner and run.max_sessions == 3 and run.max_turns_per_session == 7
    assert str(run.max_cost_usd) == "1.500000" and run.limits["memory_mb"] == 512
    assert made["budgets"]["max_tokens"] == 5000 and made["url"] == f"/runs/{run.pk}/"
    created = Event.objects.get(run=run, kind="run.created")
    assert created.actor == f"user:{owner.username}"
    assert c.get(f"/api/v1/runs/{run.pk}").json() == made


def test_list_filters_and_cursor_pages(owner):
    c = bearer(owner, "read", "write")
    ids = [
        services.create_run(RunSpec(goal=f"task {i}", checks=["true"]), created_by=owner).pk
        for i in range(5)
    ]
    services.cancel_run(ids[0], actor="t")
    seen, cursor = [], None
    while True:
        page = c.get("/api/v1/runs", {"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids, reverse=True)
    assert [r["id"] for r in c.get("/api/v1/runs?status=cancelled").json()["items"]] == [ids[0]]
    assert [r["id"] for r in c.get("/api/v1/runs?q=task+3").json()["items"]] == [ids[3]]
    is_problem(c.get("/api/v1/runs?cursor=zz"), 422)
    is_problem(c.get("/api/v1/runs?status=nope"), 422)


def test_pause_resume_note_cancel_log_the_user(owner):
    c = bearer(owner, "read", "write")
    run = services.create_run(RunSpec(goal="g", checks=["true"]), created_by=owner)
    assert post(c, f"/api/v1/runs/{run.pk}/pause", {"reason": "lunch"}).json()["status"] == "paused"
    assert (
        post(c, f"/api/v1/runs/{run.pk}/resume", {"max_tokens": 9000}).json()["budgets"][
            "max_tokens"
        ]
        == 9000
    )
    r = post(c, f"/api/v1/runs/{run.pk}/note", {"text": "use a Counter"})
    assert r.status_code == 201
    note = Event.objects.get(run=run, kind="human.note")
    assert note.seq == r.json()["seq"] and note.actor == f"user:{owner.username}"
    statuses = Event.objects.filter(run=run, kind="run.status").values_list("actor", flat=True)
    assert set(statuses) == {f"user:{owner.username}"}


# --- events, checkpoints, artifacts, approvals ------------------------------------------------
@pytest.fixture
def finished(owner, decider):
    from tests.helpers import demo_to_success

    run = demo_to_success(decider)
    Run.objects.filter(pk=run.pk).update(created_by=owner)
    return run


def test_events_page_in_seq_order(owner, finished):
    c = bearer(owner, "read")
    seqs, after = [], 0
    while True:
        page = c.get(f"/api/v1/runs/{finished.pk}/events", {"after": after, "limit": 7}).json()
        if not page["items"]:
            break
        seqs += [e["seq"] for e in page["items"]]
        after = page["items"][-1]["seq"]
    assert seqs == list(range(1, finished.last_seq + 1))
    first = c.get(f"/api/v1/runs/{finished.pk}/events?limit=1").json()["items"][0]
    assert first["kind"] == "run.created" and first["summary"]


def test_checkpoints_diff_export_and_artifacts(owner, finished):
    c = bearer(owner, "read", "write")
    cps = c.get(f"/api/v1/runs/{finished.pk}/checkpoints").json()["items"]
    assert [cp["number"] for cp in cps] == list(range(1, len(cps) + 1))
    diff = c.get(f"/api/v1/runs/{finished.pk}/diff", {"a": 1, "b": cps[-1]["number"]}).json()
    assert any(ch["path"] == "textstats.py" for ch in diff["changes"])
    assert c.get(f"/api/v1/runs/{finished.pk}/diff", {"a": 1}).json()["b"] == "live"
    is_problem(c.get(f"/api/v1/runs/{finished.pk}/diff", {"a": 99}), 404)
    patch = c.get(f"/api/v1/runs/{finished.pk}/diff.patch", {"a": 1, "b": cps[-1]["number"]})
    assert patch.status_code == 200 and b"textstats.py" in b"".join(patch.streaming_content)
    tar = c.get(f"/api/v1/runs/{finished.pk}/checkpoints/{cps[-1]['number']}/export.tar.gz")
    data = b"".join(tar.streaming_content)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        assert any(n.endswith("textstats.py") for n in t.getnames())
    is_problem(c.get(f"/api/v1/runs/{finished.pk}/checkpoints/999/export.tar.gz"), 404)
    made = post(c, f"/api/v1/runs/{finished.pk}/checkpoints", {"label": "by the API"})
    assert made.status_code == 201 and made.json()["number"] == len(cps) + 1
    arts = c.get(f"/api/v1/runs/{finished.pk}/artifacts").json()["items"]
    assert arts
    one = c.get(f"/api/v1/artifacts/{arts[0]['id']}").json()
    assert one == arts[0]
    content = c.get(f"/api/v1/artifacts/{arts[0]['id']}/content")
    assert len(b"".join(content.streaming_content)) == arts[0]["size"]


def test_artifacts_of_unseen_runs_are_404(owner, outsider, finished):
    from agents.models import Artifact

    art = Artifact.objects.filter(run=finished).first()
    c = bearer(outsider, "read")
    is_problem(c.get(f"/api/v1/artifacts/{art.pk}"), 404)
    is_problem(c.get(f"/api/v1/artifacts/{art.pk}/content"), 404)


def test_rewind_and_fork_with_dry_run(owner, finished):
    c = bearer(owner, "read", "write")
    dry = post(c, f"/api/v1/runs/{finished.pk}/fork", {"checkpoint": 1, "dry_run": True})
    assert dry.status_code == 200 and dry.json()["dry_run"] is True
    assert Run.objects.count() == 1
    forked = post(c, f"/api/v1/runs/{finished.pk}/fork", {"checkpoint": 1, "note": "try again"})
    assert forked.status_code == 201
    assert forked.json()["forked_from"] == {"run": finished.pk, "checkpoint": 1}
    dry = post(c, f"/api/v1/runs/{finished.pk}/rewind", {"checkpoint": 1, "dry_run": True})
    assert dry.status_code == 200 and dry.json()["discarded"]["events"] > 0
    assert not Event.objects.filter(run=finished, kind="run.rewind_requested").exists()


def test_approvals_list_and_decide_as_the_web_does(supervisor, waiting_run):
    Run.objects.filter(pk=waiting_run.pk).update(created_by=supervisor)
    c = bearer(supervisor, "read", "decide")
    items = c.get("/api/v1/approvals?status=pending").json()["items"]
    assert len(items) == 1 and items[0]["reason"]
    approval_id = items[0]["id"]
    is_problem(post(c, f"/api/v1/approvals/{approval_id}/decision", {"decision": "edit"}), 422)
    is_problem(
        post(c, f"/api/v1/approvals/{approval_id}/decision", {"decision": "edit", "input": "{bad"}),
        422,
    )
    is_problem(
        post(c, f"/api/v1/approvals/{approval_id}/decision", {"decision": "approve", "input": {}}),
        422,
    )
    r = post(
        c, f"/api/v1/approvals/{approval_id}/decision", {"decision": "approve", "reason": "ok"}
    )
    assert r.status_code == 200 and r.json()["status"] == "approved"
    assert r.json()["decided_by"] == supervisor.username
    is_problem(
        post(
            c, f"/api/v1/approvals/{approval_id}/decision", {"decision": "deny", "reason": "late"}
        ),
        409,
    )
    decided = Event.objects.get(run=waiting_run, kind="approval.decided")
    assert decided.actor == f"user:{supervisor.username}"
    assert drive_until_idle(waiting_run).status == "succeeded"


def test_schema_and_docs_need_login_or_token(owner):
    assert Client().get("/api/v1/openapi.json").status_code == 401
    assert Client().get("/api/v1/docs").status_code == 302
    schema = bearer(owner, "read").get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    c = Client()
    c.force_login(owner)
    page = c.get("/api/v1/docs")
    assert page.status_code == 200 and b"swagger-ui" in page.content
