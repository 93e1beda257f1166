"""A token made for one run (issue 30): made from the run page's "Connect an agent" card, with
`manage.py create_token --run` or `POST /runs/ID/tokens`; it acts for that run and nothing else,
never decides (not even its own run's approvals), and stops at once when revoked."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from agents import services
from agents.models import Approval, ApprovalStatus, Run
from agents.runspec import RunSpec
from api.models import ApiToken
from tests.helpers import client_for, user_with

pytestmark = pytest.mark.django_db


def external(owner, goal: str = "fix the tests") -> Run:
    return services.create_run(
        RunSpec(goal=goal, checks=["true"], provider="external"), created_by=owner
    )


def bearer(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_SHIFTLOG_AGENT="claude-1")


@pytest.fixture
def person(db):
    return user_with("dev", "decide_approval", "view_run", "control_run")


@pytest.fixture
def run(person):
    return external(person)


@pytest.fixture
def agent(person, run):
    _, token = ApiToken.for_run(person, run)
    return bearer(token)


def ask(api: Client, run_id: int, command: str) -> dict:
    r = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": command}, "call_id": f"toolu_{abs(hash(command))}"},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    return r.json()


# --- acts for its run --------------------------------------------------------------------------
def test_a_run_token_drives_its_own_run(agent, run):
    assert agent.get(f"/api/v1/runs/{run.pk}").json()["id"] == run.pk
    assert agent.get(f"/api/v1/runs/{run.pk}/context").status_code == 200
    answer = ask(agent, run.pk, "ls")
    assert answer["decision"] == "allow"
    assert agent.get(f"/api/v1/tool-calls/{answer['id']}").status_code == 200
    r = agent.post(
        f"/api/v1/tool-calls/{answer['id']}/result",
        {"output": "a.txt"},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content


def test_a_run_token_sees_no_other_run(person, agent, run):
    other = external(person, goal="another run of the same person")
    for path in (f"/api/v1/runs/{other.pk}", f"/api/v1/runs/{other.pk}/context"):
        assert agent.get(path).status_code == 404, path
    r = agent.post(f"/api/v1/runs/{other.pk}/pause", {}, content_type="application/json")
    assert r.status_code == 404
    # The other run's tool calls, though the person who made the token may see them.
    _, full = ApiToken.issue(person, ["read", "write"])
    call_id = ask(bearer(full), other.pk, "ls")["id"]
    assert agent.get(f"/api/v1/tool-calls/{call_id}").status_code == 404
    r = agent.post(f"/api/v1/tool-calls/{call_id}/result", {"output": ""}, "application/json")
    assert r.status_code == 404


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/api/v1/runs"),
        ("post", "/api/v1/runs"),
        ("get", "/api/v1/approvals"),
        ("get", "/api/v1/schedules"),
        ("get", "/api/v1/triggers"),
        ("post", "/api/v1/runs/{run}/fork"),
        ("post", "/api/v1/runs/{run}/tokens"),
        # A person's acts on the run: the agent cannot raise its budgets, undo a rewind or
        # speak as its person.
        ("post", "/api/v1/runs/{run}/resume"),
        ("post", "/api/v1/runs/{run}/rewind"),
        ("post", "/api/v1/runs/{run}/note"),
        ("put", "/api/v1/runs/{run}/wake"),
        ("post", "/api/v1/runs/{run}/memory/lesson/promote"),
    ],
)
def test_a_run_token_gets_no_list_and_makes_nothing_beyond_its_run(agent, run, method, path):
    body = {"goal": "x", "checks": ["true"], "checkpoint": 1}
    r = getattr(agent, method)(path.format(run=run.pk), body, content_type="application/json")
    assert r.status_code == 403, (path, r.content)
    assert f"run {run.pk} only" in r.json()["detail"]


def test_a_run_token_can_never_decide_not_even_its_own_runs_approvals(person, agent, run):
    with pytest.raises(ValueError, match="never decide"):
        ApiToken.issue(person, ["read", "write", "decide"], run=run)
    answer = ask(agent, run.pk, "rm -rf build")
    assert answer["decision"] == "ask"
    approval = Approval.objects.get(run=run)
    # Even a row that says decide (written past issue()) cannot.
    ApiToken.objects.filter(run=run).update(scopes=["read", "write", "decide"])
    r = agent.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"decision": "approve"},
        content_type="application/json",
    )
    assert r.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_a_run_token_never_gets_an_answer_kept_for_its_persons_other_tokens(person, agent, run):
    other = external(person, goal="another run of the same person")
    _, full = ApiToken.issue(person, ["read", "write"])
    key = {"HTTP_IDEMPOTENCY_KEY": "the-same-key"}
    path = f"/api/v1/runs/{other.pk}/pause"
    r = bearer(full).post(path, {"reason": "x"}, content_type="application/json", **key)
    assert r.status_code == 200
    r = agent.post(path, {"reason": "x"}, content_type="application/json", **key)
    assert r.status_code == 422 and "another run" not in r.content.decode()
    # Its own retries are answered once, as any token's.
    mine = {"HTTP_IDEMPOTENCY_KEY": "its-own-key"}
    first = agent.post(f"/api/v1/runs/{run.pk}/heartbeat", **mine)
    again = agent.post(f"/api/v1/runs/{run.pk}/heartbeat", **mine)
    assert first.status_code == again.status_code == 200
    assert again.headers.get("Idempotent-Replayed") == "true"


def test_a_revoked_run_token_stops_at_once(agent, run):
    assert agent.get(f"/api/v1/runs/{run.pk}").status_code == 200
    ApiToken.objects.get(run=run).revoke()
    assert agent.get(f"/api/v1/runs/{run.pk}").status_code == 401


# --- made through the API, the CLI and the web --------------------------------------------------
def test_the_api_makes_a_run_token_for_people_who_drive_the_run(person, run, viewer):
    _, full = ApiToken.issue(person, ["read", "write"])
    r = bearer(full).post(f"/api/v1/runs/{run.pk}/tokens")
    assert r.status_code == 201, r.content
    made = r.json()
    assert made["run"] == run.pk and made["scopes"] == ["read", "write"]
    assert made["command"].endswith(
        f"SHIFTLOG_TOKEN={made['token']} shiftlog-claude --run {run.pk}"
    )
    assert bearer(made["token"]).get(f"/api/v1/runs/{run.pk}").status_code == 200
    assert bearer(made["token"]).get("/api/v1/runs").status_code == 403
    # A watcher (read and write scopes, but no right to drive the run) gets none.
    _, watching = ApiToken.issue(viewer, ["read", "write"])
    assert bearer(watching).post(f"/api/v1/runs/{run.pk}/tokens").status_code == 403


def test_the_api_refuses_a_run_token_for_a_run_no_agent_drives(person):
    scripted = services.create_run(RunSpec(goal="g", checks=["true"]), created_by=person)
    _, full = ApiToken.issue(person, ["read", "write"])
    assert bearer(full).post(f"/api/v1/runs/{scripted.pk}/tokens").status_code == 409


def test_create_token_with_run_prints_the_command_and_refuses_decide(person, run):
    out = StringIO()
    call_command("create_token", "--run", str(run.pk), stdout=out)
    lines = out.getvalue().strip().splitlines()
    token = lines[-1]
    assert f"SHIFTLOG_TOKEN={token} shiftlog-claude --run {run.pk}" in lines[-2]
    row = ApiToken.objects.get(run=run)
    assert row.user == person and row.scopes == ["read", "write"]
    assert bearer(token).get("/api/v1/approvals").status_code == 403
    with pytest.raises(CommandError, match="never decide"):
        call_command("create_token", "--run", str(run.pk), "--scopes", "read,decide")
    with pytest.raises(CommandError, match="no run"):
        call_command("create_token", "--run", "999999")
    outsider = user_with("out")
    with pytest.raises(CommandError, match="may not drive"):
        call_command("create_token", "--run", str(run.pk), "--user", outsider.username)


def test_the_run_page_makes_a_run_token_once_for_people_who_drive_it(person, run, viewer):
    page = client_for(person).get(f"/runs/{run.pk}/").content.decode()
    assert 'id="make-run-token"' in page
    r = client_for(person).post(f"/runs/{run.pk}/token", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    html = r.content.decode()
    [command] = re.findall(r'id="connect-command-text">([^<]+)</pre>', html)
    token = re.search(r"SHIFTLOG_TOKEN=(\S+) shiftlog-claude --run (\d+)", command)
    assert token and token.group(2) == str(run.pk)
    assert command.startswith("SHIFTLOG_URL=http://testserver ")
    assert bearer(token.group(1)).get(f"/api/v1/runs/{run.pk}/context").status_code == 200
    # Shown once: the page never shows it again.
    assert token.group(1) not in client_for(person).get(f"/runs/{run.pk}/").content.decode()
    # A watcher sees no button and is refused; a GET makes nothing; an outsider sees no run.
    assert 'id="make-run-token"' not in client_for(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert client_for(viewer).post(f"/runs/{run.pk}/token").status_code == 403
    assert client_for(person).get(f"/runs/{run.pk}/token").status_code == 405
    assert client_for(user_with("out")).post(f"/runs/{run.pk}/token").status_code == 404
    assert Client().post(f"/runs/{run.pk}/token").status_code == 302
    assert ApiToken.objects.filter(run=run).count() == 1
    # Without htmx, a page of its own says the same.
    page = client_for(person).post(f"/runs/{run.pk}/token").content.decode()
    assert "<html" in page and f"shiftlog-claude --run {run.pk}" in page
    assert ApiToken.objects.filter(run=run).count() == 2


def test_the_run_page_makes_no_token_for_a_run_no_agent_drives(person):
    scripted = services.create_run(RunSpec(goal="g", checks=["true"]), created_by=person)
    assert client_for(person).post(f"/runs/{scripted.pk}/token").status_code == 403
    assert not ApiToken.objects.exists()
