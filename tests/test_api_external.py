"""External agents through the API (in-process Client): the harness decides, asks people,
records turns and results, takes the workspace, and runs the checks itself."""

from __future__ import annotations

import io
import tarfile

import pytest
from django.test import Client

from agents.models import Approval, Event, ExternalCall, Run
from api.models import ApiToken
from tests.helpers import run_queued, user_with

pytestmark = pytest.mark.django_db


def bearer(user, *scopes: str) -> Client:
    _, token = ApiToken.issue(user, list(scopes))
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def agent_user(db):
    return user_with("agent", "decide_approval")


@pytest.fixture
def api(agent_user):
    return bearer(agent_user, "read", "write")


def make_external(api, **extra) -> int:
    r = api.post(
        "/api/v1/runs",
        {"goal": "write done.txt", "checks": ["test -f done.txt"], "provider": "external", **extra},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    return r.json()["id"]


def finish(api, run_id: int, summary: str = "done") -> dict:
    """POST finish (202: the checks run in a worker), run the worker's task, read the verdict."""
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        r = api.post(
            f"/api/v1/runs/{run_id}/finish", {"summary": summary}, content_type="application/json"
        )
    assert r.status_code == 202, r.content
    queued = r.json()
    assert queued["state"] == "checking"
    pending = api.get(f"/api/v1/runs/{run_id}/finish/{queued['id']}").json()
    assert pending["state"] == "checking", pending
    assert run_queued("external_finish")
    verdict = api.get(f"/api/v1/runs/{run_id}/finish/{queued['id']}?wait=1").json()
    assert verdict["state"] == "done", verdict
    return verdict


def test_external_run_end_to_end(api, agent_user):
    run_id = make_external(api)
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued" and run.is_external

    ctx = api.get(f"/api/v1/runs/{run_id}/context").json()
    assert ctx["session"] == 1 and "write done.txt" in ctx["first_message"]
    assert ctx["run_status"] == "running"

    r = api.post(
        f"/api/v1/runs/{run_id}/turns",
        {
            "text": "I will look around",
            "model": "claude-opus-4-1",
            "input_tokens": 100,
            "output_tokens": 20,
        },
        content_type="application/json",
    )
    assert r.status_code == 201, r.content

    allowed = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "ls"}},
        content_type="application/json",
    ).json()
    assert allowed["decision"] == "allow", allowed
    r = api.post(
        f"/api/v1/tool-calls/{allowed['id']}/result",
        {"output": "README.md"},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    again = api.post(
        f"/api/v1/tool-calls/{allowed['id']}/result",
        {"output": "x"},
        content_type="application/json",
    )
    assert again.status_code == 409

    risky = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "rm -rf build"}},
        content_type="application/json",
    ).json()
    assert risky["decision"] == "ask", risky
    assert Run.objects.get(pk=run_id).status == "awaiting_approval"
    pending = api.get(f"/api/v1/tool-calls/{risky['id']}").json()
    assert pending["decision"] == "pending"
    # A read+write token may not decide.
    approval_id = risky["approval"]
    refused = api.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"decision": "approve"},
        content_type="application/json",
    )
    assert refused.status_code == 403
    decider = bearer(agent_user, "read", "decide")
    decided = decider.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"decision": "edit", "input": {"command": "rm -rf build/tmp"}},
        content_type="application/json",
    )
    assert decided.status_code == 200, decided.content
    answer = api.get(f"/api/v1/tool-calls/{risky['id']}?wait=2").json()
    assert answer["decision"] == "approved" and answer["input"] == {"command": "rm -rf build/tmp"}
    assert "edited this call" in answer["note"] and "rm -rf build/tmp" in answer["note"]
    assert answer["run_status"] == "running"
    api.post(
        f"/api/v1/tool-calls/{risky['id']}/result", {"output": ""}, content_type="application/json"
    )

    r = api.put(
        f"/api/v1/runs/{run_id}/workspace",
        tarball({"notes.txt": "hi"}),
        content_type="application/gzip",
    )
    assert r.status_code == 201, r.content
    refused = finish(api, run_id)
    assert refused["passed"] is False and refused["run_status"] == "running"
    assert (
        refused["checks"][0]["command"] == "test -f done.txt" and not refused["checks"][0]["passed"]
    )

    r = api.put(
        f"/api/v1/runs/{run_id}/workspace",
        tarball({"notes.txt": "hi", "done.txt": "yes"}),
        content_type="application/gzip",
    )
    assert r.status_code == 201 and r.json()["files"] == 2
    done = finish(api, run_id)
    assert done["passed"] is True and done["run_status"] == "succeeded", done
    kinds = list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))
    for kind in (
        "approval.requested",
        "approval.decided",
        "check.result",
        "tool.call",
        "tool.result",
        "model.turn",
    ):
        assert kind in kinds
    run = Run.objects.get(pk=run_id)
    assert run.input_tokens == 100 and run.output_tokens == 20 and run.turns == 1
    assert run.model == "claude-opus-4-1"  # what the agent said it used
    assert run.last_contact_at is not None


def test_denied_call_and_policy_deny(api, agent_user):
    run_id = make_external(api, tool_policy=[{"tool": "Bash", "action": "deny", "pattern": "curl"}])
    denied = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "curl example.com"}},
        content_type="application/json",
    ).json()
    assert denied["decision"] == "deny"
    risky = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "bash", "input": {"command": "rm -rf /tmp/x"}},
        content_type="application/json",
    ).json()
    assert risky["decision"] == "ask"
    decider = bearer(agent_user, "decide")
    r = decider.post(
        f"/api/v1/approvals/{risky['approval']}/decision",
        {"decision": "deny"},
        content_type="application/json",
    )
    assert r.status_code == 422 and r["Content-Type"] == "application/problem+json"
    r = decider.post(
        f"/api/v1/approvals/{risky['approval']}/decision",
        {"decision": "deny", "reason": "not outside the workspace"},
        content_type="application/json",
    )
    assert r.status_code == 200
    answer = api.get(f"/api/v1/tool-calls/{risky['id']}").json()
    assert answer["decision"] == "denied" and answer["reason"] == "not outside the workspace"
    r = api.post(
        f"/api/v1/tool-calls/{risky['id']}/result",
        {"output": "ran anyway"},
        content_type="application/json",
    )
    assert r.status_code == 409
    outputs = [
        e.payload["output"]
        for e in Event.objects.filter(run_id=run_id, kind="tool.result").order_by("seq")
    ]
    assert any("A person denied this call: not outside the workspace" in o for o in outputs)
    assert ExternalCall.objects.filter(run_id=run_id).count() == 2
    assert Approval.objects.get(pk=risky["approval"]).status == "denied"


def test_budget_cap_pauses_and_answers_say_so(api):
    run_id = make_external(api, max_tokens=100)
    r = api.post(
        f"/api/v1/runs/{run_id}/turns",
        {"text": "big", "input_tokens": 90, "output_tokens": 20},
        content_type="application/json",
    ).json()
    assert r["run_status"] == "paused"
    answer = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "ls"}},
        content_type="application/json",
    ).json()
    assert answer["decision"] == "deny" and answer["run_status"] == "paused"
    assert "budget" in answer["reason"]


def test_handoff_starts_the_next_session(api):
    run_id = make_external(api)
    api.get(f"/api/v1/runs/{run_id}/context")
    r = api.post(
        f"/api/v1/runs/{run_id}/handoff",
        {"summary": "half done", "next_steps": ["write done.txt"]},
        content_type="application/json",
    )
    assert r.status_code == 200, r.content
    ctx = r.json()
    assert ctx["session"] == 2 and "half done" in ctx["first_message"]


def test_bad_uploads_are_refused_and_change_nothing(api):
    run_id = make_external(api)
    api.get(f"/api/v1/runs/{run_id}/context")
    for body in (b"", b"not a tarball", tarball({"../evil.txt": "x"})):
        r = api.put(f"/api/v1/runs/{run_id}/workspace", body, content_type="application/gzip")
        assert r.status_code == 422, (body[:20], r.content)
        assert r["Content-Type"] == "application/problem+json"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    r = api.put(f"/api/v1/runs/{run_id}/workspace", buf.getvalue(), content_type="application/gzip")
    assert r.status_code == 422
    assert not Run.objects.get(pk=run_id).checkpoints.filter(kind="upload").exists()


def test_workers_never_claim_external_runs(api):
    from agents.runtime.loop import drive

    run_id = make_external(api)
    assert drive(run_id).result == "not-claimed"
    assert Run.objects.get(pk=run_id).status == "queued"


def test_an_internal_run_refuses_harness_calls(api):
    r = api.post("/api/v1/runs", {"goal": "g", "checks": ["true"]}, content_type="application/json")
    run_id = r.json()["id"]
    r = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "bash", "input": {}},
        content_type="application/json",
    )
    assert r.status_code == 409 and "external" in r.json()["detail"]


def test_the_cli_creates_an_external_run(capsys):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    call_command(
        "create_run",
        "--goal",
        "g",
        "--check",
        "true",
        "--provider",
        "external",
        "--heartbeat-seconds",
        "30",
    )
    run = Run.objects.get(pk=int(capsys.readouterr().out.strip()))
    assert run.is_external and run.heartbeat_window == 30 and run.status == "queued"
    with pytest.raises(CommandError, match="only for external"):
        call_command("create_run", "--goal", "g", "--check", "true", "--heartbeat-seconds", "30")


def test_a_call_waiting_when_the_run_is_cancelled_is_denied(api):
    run_id = make_external(api)
    risky = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "bash", "input": {"command": "rm -rf /tmp/x"}},
        content_type="application/json",
    ).json()
    assert risky["decision"] == "ask"
    api.post(f"/api/v1/runs/{run_id}/cancel", {"reason": "enough"}, content_type="application/json")
    answer = api.get(f"/api/v1/tool-calls/{risky['id']}").json()
    assert answer["decision"] == "denied" and answer["reason"] == "the run is cancelled"
    r = api.post(
        f"/api/v1/tool-calls/{risky['id']}/result", {"output": "x"}, content_type="application/json"
    )
    assert r.status_code == 409


def test_finish_answers_at_once_and_the_checks_run_in_a_worker(
    api, django_capture_on_commit_callbacks
):
    """The request is not held for the checks (nginx gives up at 120 s); asked again while they
    run, the same finish answers; other calls of the agent go on meanwhile."""
    run_id = make_external(api)
    api.put(
        f"/api/v1/runs/{run_id}/workspace",
        tarball({"done.txt": "yes"}),
        content_type="application/gzip",
    )
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post(
            f"/api/v1/runs/{run_id}/finish", {"summary": "done"}, content_type="application/json"
        )
        assert first.status_code == 202 and first.json()["state"] == "checking"
        again = api.post(
            f"/api/v1/runs/{run_id}/finish", {"summary": "done"}, content_type="application/json"
        )
    assert again.json()["id"] == first.json()["id"]
    beat = api.post(f"/api/v1/runs/{run_id}/heartbeat")
    assert beat.status_code == 200
    assert len(run_queued("external_finish")) == 2
    verdict = api.get(f"/api/v1/runs/{run_id}/finish/{first.json()['id']}").json()
    assert verdict["passed"] is True and verdict["run_status"] == "succeeded", verdict
    assert api.get(f"/api/v1/runs/{run_id}/finish/nope").status_code == 404
    checks = Event.objects.filter(run_id=run_id, kind="check.result").count()
    assert checks == 1  # the second task found the finish done


def _ask(api, run_id: int, command: str) -> dict:
    asked = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": command}},
        content_type="application/json",
    ).json()
    assert asked["decision"] == "ask", asked
    return asked


def test_the_decision_settles_the_call_before_its_agent_reads(api, agent_user):
    """The decision records the call's event in its own transaction (the edited input, the
    denial's reason), so the agent's long poll only reads; its read records nothing again, and
    the call's result follows its tool.call. A paused run's call is left to the agent."""
    from agents import services
    from agents.approvals import decide_as

    run_id = make_external(api)
    a = _ask(api, run_id, "rm -rf build/a")
    decide_as(a["approval"], user=agent_user, decision="edit", input={"command": "rm -rf b/x"})
    call_a = ExternalCall.objects.get(tool_use_id=a["id"])
    called = Event.objects.get(run_id=run_id, seq=call_a.called_seq)
    assert called.kind == "tool.call" and called.payload["input"] == {"command": "rm -rf b/x"}
    assert called.payload["approval_id"] == a["approval"]
    assert Run.objects.get(pk=run_id).status == "queued"

    before = Event.objects.filter(run_id=run_id).count()
    answer = api.get(f"/api/v1/tool-calls/{a['id']}?wait=2").json()
    assert answer["decision"] == "approved" and answer["input"] == {"command": "rm -rf b/x"}
    assert answer["run_status"] == "running"  # its agent read it: the run goes on
    kinds = list(
        Event.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True)
    )[before:]
    assert kinds == ["run.status"], kinds  # the read took the run up and recorded nothing else
    r = api.post(
        f"/api/v1/tool-calls/{a['id']}/result", {"output": ""}, content_type="application/json"
    )
    assert r.status_code == 201, r.content
    a_kinds = [
        e.kind
        for e in Event.objects.filter(run_id=run_id, kind__in=["tool.call", "tool.result"])
        if e.payload["tool_use_id"] == a["id"]
    ]
    assert a_kinds == ["tool.call", "tool.result"]

    b = _ask(api, run_id, "rm -rf build/b")
    decide_as(b["approval"], user=agent_user, decision="deny", reason="keep build/b")
    denied = Event.objects.get(
        run_id=run_id, seq=ExternalCall.objects.get(tool_use_id=b["id"]).result_seq
    )
    assert denied.kind == "tool.result" and denied.payload["is_error"]
    assert "A person denied this call: keep build/b" in denied.payload["output"]
    refused = api.get(f"/api/v1/tool-calls/{b['id']}").json()
    assert refused["decision"] == "denied" and refused["reason"] == "keep build/b"
    r = api.post(
        f"/api/v1/tool-calls/{b['id']}/result", {"output": "ran"}, content_type="application/json"
    )
    assert r.status_code == 409

    c = _ask(api, run_id, "rm -rf build/c")
    services.pause_run(run_id, actor="user:agent", reason="a look first")
    decide_as(c["approval"], user=agent_user, decision="approve")
    call_c = ExternalCall.objects.get(tool_use_id=c["id"])
    assert call_c.called_seq is None and call_c.result_seq is None  # paused: not settled
    paused = api.get(f"/api/v1/tool-calls/{c['id']}").json()
    assert paused["decision"] == "approved" and paused["run_status"] == "paused"
