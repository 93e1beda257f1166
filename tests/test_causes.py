"""What an approval is about and why a run is paused are fields, not strings read back: a tool
that happens to be called "network" is a tool call, and a reason that happens to start like a
fleet's or a store's pause does not make a run resume with them."""

from __future__ import annotations

import pytest

from agents import approvals, reaper, services
from agents.models import ApprovalSubject, PauseCause, Run, RunStatus
from tests.helpers import make_run

pytestmark = pytest.mark.django_db


def _ask(run: Run, tool: str, tool_input: dict, **kw):
    created, _ = approvals.request(
        run, [("call-1", tool, tool_input, "why")], session_id=None, seq=0, actor="harness",
        lease_owner="", **kw,
    )  # fmt: skip
    return created["call-1"]


def test_a_tool_called_network_is_a_tool_call_not_a_host(supervisor):
    run = make_run(provider="external")
    asked = _ask(run, "network", {"host": "evil.example", "port": 443})
    assert asked.subject == ApprovalSubject.TOOL_CALL
    # Denying it denies that call: it adds no network rule to the run's policy.
    approvals.decide(asked.pk, user=supervisor, approve=False, comment="no")
    assert not any(r.get("tool") == "network" for r in Run.objects.get(pk=run.pk).tool_policy)


def test_a_host_asked_about_is_allowed_or_denied_never_edited(supervisor):
    run = make_run(provider="external")
    asked = _ask(run, "network", {"host": "pypi.org", "port": 443}, subject="network_host")
    with pytest.raises(approvals.ApprovalError, match="not edited"):
        approvals.decide(
            asked.pk, user=supervisor, approve=True, edited_input={"host": "a", "port": 1}
        )
    approvals.decide(asked.pk, user=supervisor, approve=False, comment="not that host")
    rules = Run.objects.get(pk=run.pk).tool_policy
    assert rules[0]["tool"] == "network" and rules[0]["action"] == "deny"


def test_a_child_a_person_paused_stays_paused_when_its_parent_resumes(owner):
    parent = make_run(created_by=owner)
    child = make_run(created_by=owner, parent=parent)
    # The person's reason reads like a cascade's: once, that resumed the child with the parent.
    services.pause_run(child.pk, actor="user:olivia", reason="paused with its fleet's parent")
    services.pause_run(parent.pk, actor="user:olivia")
    assert Run.objects.get(pk=child.pk).pause_cause == PauseCause.PERSON
    services.resume_run(parent.pk, actor="user:olivia")
    assert Run.objects.get(pk=child.pk).status == RunStatus.PAUSED
    other = make_run(created_by=owner, parent=parent)
    services.pause_run(parent.pk, actor="user:olivia")  # this one pauses with its parent
    assert Run.objects.get(pk=other.pk).pause_cause == PauseCause.FLEET
    services.resume_run(parent.pk, actor="user:olivia")
    assert Run.objects.get(pk=other.pk).status == RunStatus.QUEUED
    assert Run.objects.get(pk=child.pk).status == RunStatus.PAUSED


def test_only_a_run_the_store_paused_resumes_when_the_store_answers(owner):
    run = make_run(created_by=owner)
    services.pause_run(run.pk, actor="user:olivia", reason="blob store unreachable: my words")
    assert reaper.resume_when_store_is_back() == []
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


def test_a_pause_says_its_cause_in_the_log_and_a_resume_clears_it(owner):
    run = make_run(created_by=owner)
    services.pause_run(run.pk, actor="user:olivia")
    status = run.events.filter(kind="run.status").order_by("-seq").first()
    assert status.payload["cause"] == "person"
    services.resume_run(run.pk, actor="user:olivia")
    assert Run.objects.get(pk=run.pk).pause_cause == ""


def test_every_runtime_tells_the_agent_an_undecided_call_in_the_same_words(supervisor):
    from agents import decision_words
    from agents.models import Approval, ApprovalStatus

    run = make_run(provider="external")
    asked = _ask(run, "bash", {"command": "rm -rf build"})
    for status, words in [
        (ApprovalStatus.EXPIRED, "nobody decided in time (expired)"),
        (ApprovalStatus.DISCARDED, "the run was rewound past it, or ended (discarded)"),
    ]:
        Approval.objects.filter(pk=asked.pk).update(status=status, comment="")
        asked.refresh_from_db()
        assert decision_words.refusal(asked) == words
    Approval.objects.filter(pk=asked.pk).update(status=ApprovalStatus.DENIED, comment="keep it")
    asked.refresh_from_db()
    assert decision_words.refusal(asked) == "keep it"


def test_the_api_and_show_run_say_why_a_run_is_paused(owner):
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.test import Client

    from api.models import ApiToken

    run = make_run(created_by=owner)
    services.pause_run(run.pk, actor="user:olivia")
    _, token = ApiToken.issue(owner, ["read"])
    got = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/v1/runs/{run.pk}").json()
    assert got["pause_cause"] == "person"
    out = StringIO()
    call_command("show_run", str(run.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["pause_cause"] == "person"
