"""The sync client's protocol against `httpx.MockTransport`: auth, errors, retries, paging."""

from __future__ import annotations

import email.utils
import io
import json
import tarfile
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from client_helpers import BASE, event_json, problem, run_json
from shiftlog_client import (
    Client,
    Conflict,
    Forbidden,
    ForkPreview,
    Invalid,
    NotFound,
    RateLimited,
    Rewound,
    Run,
    ShiftlogError,
    TooLarge,
    Unauthorized,
    WorkspaceArchiveError,
)

pytestmark = pytest.mark.no_services


def ok(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_sends_the_token_as_a_bearer_and_reads_a_run(make_client):
    client, rec = make_client(ok(run_json()))
    run = client.get_run(3)
    request = rec.requests[0]
    assert request.headers["authorization"] == "Bearer shl_test"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"].startswith("shiftlog-client/")
    assert str(request.url) == f"{BASE}/api/v1/runs/3"
    assert isinstance(run, Run)
    assert (run.id, run.status, run.external, run.turns) == (3, "running", True, 4)
    assert run.tokens.total == 15
    assert run.cost_usd == Decimal("0.001200")
    assert run.last_contact_at is not None and run.last_contact_at.tzinfo is not None
    assert run.started_at is None
    assert run.raw["url"] == "/runs/3/"


@pytest.mark.parametrize("base", [BASE, BASE + "/", BASE + "/api/v1", BASE + "/api/v1/"])
def test_a_base_url_with_or_without_the_api_prefix_names_the_same_api(base):
    seen = []

    def handler(request):
        seen.append(str(request.url))
        return ok(run_json())

    with Client(base, "t", transport=httpx.MockTransport(handler)) as client:
        client.get_run(3)
    assert seen == [f"{BASE}/api/v1/runs/3"]


def test_a_token_is_required_and_the_url_must_be_http():
    with pytest.raises(ValueError, match="token"):
        Client(BASE, "")
    with pytest.raises(ValueError, match="http"):
        Client("shiftlog.test", "t")


def test_from_env(monkeypatch):
    monkeypatch.setenv("SHIFTLOG_URL", BASE)
    monkeypatch.setenv("SHIFTLOG_TOKEN", "shl_env")
    with Client.from_env() as client:
        assert client.base_url == BASE
        assert client._http.headers["authorization"] == "Bearer shl_env"


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, Invalid),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (413, TooLarge),
        (422, Invalid),
        (500, ShiftlogError),
    ],
)
def test_problem_json_becomes_the_matching_exception(make_client, status, cls):
    client, _ = make_client(problem(status, "Some Title", "no run with id 7"))
    with pytest.raises(cls) as info:
        client.get_run(7)
    error = info.value
    assert type(error) is cls
    assert (error.status, error.title, error.detail) == (status, "Some Title", "no run with id 7")
    assert error.body["type"] == "about:blank"
    assert "no run with id 7" in str(error)


def test_a_422_carries_the_fields_in_errors(make_client):
    errors = [{"loc": ["body", "goal"], "msg": "field required"}]
    client, _ = make_client(
        problem(422, "Unprocessable Entity", "goal: field required", errors=errors)
    )
    with pytest.raises(Invalid) as info:
        client.create_run("", checks=["true"])
    assert info.value.errors == errors


def test_an_error_that_is_not_json_still_raises_with_its_text(make_client):
    client, _ = make_client(httpx.Response(502, text="Bad gateway from the proxy"))
    with pytest.raises(ShiftlogError) as info:
        client.get_run(1)
    assert info.value.status == 502
    assert "Bad gateway" in info.value.detail


def test_a_429_is_retried_honouring_retry_after(make_client):
    limited = problem(429, "Too Many Requests", "slow down", headers={"Retry-After": "2"})
    client, rec = make_client(limited, limited, ok(run_json()))
    run = client.get_run(3)
    assert run.id == 3
    assert len(rec.requests) == 3
    assert client.sleeps == [2.0, 2.0]


def test_retry_after_as_an_http_date(make_client):
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    limited = problem(429, "Too Many Requests", headers={"Retry-After": when})
    client, _ = make_client(limited, ok(run_json()))
    client.get_run(3)
    assert 3 <= client.sleeps[0] <= 5


def test_past_max_retries_a_429_raises_rate_limited(make_client):
    limited = problem(429, "Too Many Requests", "600 a minute", headers={"Retry-After": "7"})
    client, rec = make_client(limited, max_retries=2)
    with pytest.raises(RateLimited) as info:
        client.get_run(3)
    assert info.value.retry_after == 7.0
    assert len(rec.requests) == 3  # the first try and two retries
    assert client.sleeps == [7.0, 7.0]


def test_retries_can_be_turned_off_and_waits_are_capped(make_client):
    limited = problem(429, "Too Many Requests", headers={"Retry-After": "3600"})
    client, rec = make_client(limited, max_retries=0)
    with pytest.raises(RateLimited):
        client.get_run(3)
    assert len(rec.requests) == 1
    client, _ = make_client(limited, ok(run_json()), max_retry_wait=5)
    client.get_run(3)
    assert client.sleeps[-1] == 5


def test_create_run_sends_only_the_fields_given(make_client):
    client, rec = make_client(ok(run_json(status="queued"), 201))
    run = client.create_run(
        "make done.txt", checks=["test -f done.txt"], provider="external", heartbeat_seconds=60
    )
    assert run.status == "queued"
    assert rec.requests[0].method == "POST"
    assert rec.requests[0].url.path == "/api/v1/runs"
    assert rec.json() == {
        "goal": "make done.txt",
        "checks": ["test -f done.txt"],
        "provider": "external",
        "heartbeat_seconds": 60,
    }


def test_list_runs_passes_filters_and_iter_runs_follows_next_cursor(make_client):
    pages = {
        None: {"items": [run_json(9), run_json(8)], "next_cursor": "c1"},
        "c1": {"items": [run_json(7), run_json(6)], "next_cursor": "c2"},
        "c2": {"items": [run_json(5)], "next_cursor": None},
    }

    def handler(request):
        return ok(pages[request.url.params.get("cursor")])

    client, rec = make_client(handler)
    page = client.list_runs(status="running", provider="external", q="done", limit=2)
    assert [r.id for r in page.items] == [9, 8]
    assert page.next_cursor == "c1"
    assert dict(rec.requests[0].url.params) == {
        "status": "running",
        "provider": "external",
        "q": "done",
        "limit": "2",
    }
    ids = [r.id for r in client.iter_runs(status="running", page_size=2)]
    assert ids == [9, 8, 7, 6, 5]
    assert [r.url.params.get("cursor") for r in rec.requests[1:]] == [None, "c1", "c2"]
    assert all(r.url.params["status"] == "running" for r in rec.requests[1:])


def test_run_actions(make_client):
    client, rec = make_client(
        ok(run_json(status="paused")),
        ok(run_json(status="queued")),
        ok(run_json(status="cancelled")),
        ok({"seq": 44}, 201),
    )
    assert client.pause_run(3, "lunch").status == "paused"
    assert client.resume_run(3, max_tokens=5000, max_cost_usd="2.50").status == "queued"
    assert client.cancel_run(3, reason="wrong goal").status == "cancelled"
    assert client.note_run(3, "break ties alphabetically") == 44
    paths = [r.url.path for r in rec.requests]
    assert paths == [f"/api/v1/runs/3/{a}" for a in ("pause", "resume", "cancel", "note")]
    bodies = [json.loads(b) for b in rec.bodies]
    assert bodies == [
        {"reason": "lunch"},
        {"max_tokens": 5000, "max_cost_usd": "2.50"},
        {"reason": "wrong goal"},
        {"text": "break ties alphabetically"},
    ]


def test_set_run_slack_sends_only_what_changes(make_client):
    client, rec = make_client(ok(run_json()), ok(run_json()), ok(run_json()))
    client.set_run_slack(3, channel="#ops", news=["ended", "budget"])
    client.set_run_slack(3, news=[])
    client.set_run_slack(3, channel="", news="project")
    assert [r.url.path for r in rec.requests] == ["/api/v1/runs/3/slack"] * 3
    assert [json.loads(b) for b in rec.bodies] == [
        {"slack_channel": "#ops", "slack_news": ["ended", "budget"]},
        {"slack_news": []},
        {"slack_channel": "", "slack_news": None},
    ]


def test_a_conflict_on_resuming_a_running_run(make_client):
    client, _ = make_client(problem(409, "Conflict", "run 3 is running"))
    with pytest.raises(Conflict, match="running"):
        client.resume_run(3)


def test_a_rewind_the_agent_missed_is_its_own_conflict(make_client):
    """An upload, handoff or finish refused because a person rewound the run: a Rewound (a
    Conflict) naming the rewind, so an agent knows to read its context and restore first."""
    rewind = {"checkpoint": 2, "by": "user:dev", "note": "not that way"}
    client, _ = make_client(
        problem(409, "Conflict", "the run was rewound to checkpoint 2", rewound=rewind),
        problem(409, "Conflict", "run 3 is running", rewound=None),
    )
    with pytest.raises(Rewound) as info:
        client.handoff(3, "went on")
    assert isinstance(info.value, Conflict) and info.value.rewound == rewind
    with pytest.raises(Conflict) as other:
        client.handoff(3, "went on")
    assert type(other.value) is Conflict


def test_rewind_dry_run_and_a_queued_rewind(make_client):
    discarded = {"events": 10, "sessions": 1}
    client, rec = make_client(
        ok({"checkpoint": 2, "dry_run": True, "discarded": discarded}),
        ok({"checkpoint": 2, "dry_run": False, "discarded": discarded}, 202),
    )
    preview = client.rewind_run(3, 2, dry_run=True)
    assert (preview.dry_run, preview.queued, preview.discarded) == (True, False, discarded)
    done = client.rewind_run(3, 2, note="a lone dash is not a word")
    assert (done.dry_run, done.queued) == (False, True)
    assert rec.json() == {"checkpoint": 2, "note": "a lone dash is not a word", "dry_run": False}


def test_fork_returns_a_run_or_a_preview(make_client):
    client, _ = make_client(
        ok({"checkpoint": 2, "dry_run": True, "would_copy": {"files": 3}}),
        ok(run_json(run_id=4, status="queued"), 201),
    )
    preview = client.fork_run(3, 2, dry_run=True)
    assert isinstance(preview, ForkPreview)
    assert preview.would_copy == {"files": 3}
    fork = client.fork_run(3, 2, note="try again")
    assert isinstance(fork, Run) and fork.id == 4


def test_list_events_and_iter_events_page_on_with_after(make_client):
    events = [event_json(seq) for seq in range(1, 8)]

    def handler(request):
        after = int(request.url.params.get("after", 0))
        limit = int(request.url.params.get("limit", 200))
        items = [e for e in events if e["seq"] > after][:limit]
        return ok({"items": items, "last_seq": 7})

    client, rec = make_client(handler)
    page = client.list_events(3, after=2, limit=2)
    assert [e.seq for e in page.items] == [3, 4]
    assert page.last_seq == 7
    assert page.items[0].payload == {"n": 3} and page.items[0].session == 1
    seqs = [e.seq for e in client.iter_events(3, after=1, page_size=3)]
    assert seqs == [2, 3, 4, 5, 6, 7]
    afters = [r.url.params["after"] for r in rec.requests[1:]]
    assert afters == ["1", "4", "7"][: len(afters)]
    assert len(rec.requests) == 3  # stopped at last_seq without asking for an empty page


def test_approvals_list_get_and_decide(make_client):
    approval = {
        "id": 5,
        "run": 3,
        "status": "pending",
        "tool": "bash",
        "input": {"command": "rm -rf build"},
        "reason": "deletes widely",
        "created_at": "2026-12-04T17:00:00Z",
        "expires_at": None,
        "decided_by": None,
        "decided_at": None,
        "comment": "",
        "edited_input": None,
    }
    decided = {
        **approval,
        "status": "approved",
        "decided_by": "eve",
        "edited_input": {"command": "rm -rf build/x"},
    }
    client, rec = make_client(ok({"items": [approval]}), ok(approval), ok(decided))
    [pending] = client.list_approvals(run=3)
    assert (pending.id, pending.tool, pending.input) == (5, "bash", {"command": "rm -rf build"})
    assert dict(rec.requests[0].url.params) == {"status": "pending", "run": "3"}
    assert client.get_approval(5).status == "pending"
    result = client.decide(5, "edit", input={"command": "rm -rf build/x"}, allow_similar=True)
    assert result.decided_by == "eve"
    assert rec.requests[-1].url.path == "/api/v1/approvals/5/decision"
    assert rec.json() == {
        "decision": "edit",
        "reason": "",
        "allow_similar": True,
        "input": {"command": "rm -rf build/x"},
    }


def test_decide_refuses_what_the_server_would(make_client):
    client, rec = make_client(ok({}))
    with pytest.raises(ValueError, match="reason"):
        client.decide(5, "deny")
    with pytest.raises(ValueError, match="edited input"):
        client.decide(5, "edit")
    with pytest.raises(ValueError, match="approve, deny or edit"):
        client.decide(5, "maybe")  # type: ignore[arg-type]
    assert rec.requests == []


def test_checkpoints_and_diffs(make_client):
    cp = {"number": 2, "kind": "manual", "label": "before", "seq": 9, "session": 1,
          "files": 3, "bytes_total": 120, "created_at": "2026-12-04T17:00:00Z"}  # fmt: skip
    diff = {"a": 1, "b": "live", "changes": [
        {"path": "a.py", "change": "modified", "kind": "text", "diff": "@@ -1 +1 @@"}]}  # fmt: skip
    client, rec = make_client(
        ok({"items": [cp]}),
        ok(cp, 201),
        ok(diff),
        httpx.Response(200, text="diff --git a/a.py b/a.py\n"),
    )
    [listed] = client.list_checkpoints(3)
    assert (listed.number, listed.files, listed.label) == (2, 3, "before")
    assert client.create_checkpoint(3, "before").number == 2
    assert rec.json(1) == {"label": "before"}
    result = client.diff(3, 1, "live")
    assert result.b == "live" and result.changes[0].path == "a.py"
    assert dict(rec.requests[2].url.params) == {"a": "1", "b": "live"}
    assert client.diff_patch(3, 1, 2).startswith("diff --git")
    assert rec.requests[3].url.path == "/api/v1/runs/3/diff.patch"


def test_export_streams_to_a_path_or_a_file(make_client, tmp_path):
    blob = b"\x1f\x8b" + bytes(range(256)) * 500
    client, rec = make_client(httpx.Response(200, content=blob))
    target = tmp_path / "cp2.tar.gz"
    assert client.export_checkpoint(3, 2, target) == len(blob)
    assert target.read_bytes() == blob
    assert rec.requests[0].url.path == "/api/v1/runs/3/checkpoints/2/export.tar.gz"
    sink = io.BytesIO()
    assert client.export_checkpoint(3, 2, sink) == len(blob)
    assert sink.getvalue() == blob
    assert list(tmp_path.iterdir()) == [target]  # no part file left behind


def test_a_failed_export_leaves_no_file(make_client, tmp_path):
    client, _ = make_client(problem(404, "Not Found", "no checkpoint 9"))
    with pytest.raises(NotFound):
        client.export_checkpoint(3, 9, tmp_path / "x.tar.gz")
    assert list(tmp_path.iterdir()) == []


def test_artifacts(make_client):
    art = {"id": 8, "name": "handoff-1.md", "kind": "handoff", "size": 5,
           "mime_type": "text/markdown", "session": 1, "created_at": "2026-12-04T17:00:00Z"}  # fmt: skip
    client, rec = make_client(ok({"items": [art]}), ok(art), httpx.Response(200, content=b"# hi\n"))
    assert [a.name for a in client.list_artifacts(3)] == ["handoff-1.md"]
    assert client.get_artifact(8).mime_type == "text/markdown"
    assert client.artifact_content(8) == b"# hi\n"
    assert [r.url.path for r in rec.requests] == [
        "/api/v1/runs/3/artifacts",
        "/api/v1/artifacts/8",
        "/api/v1/artifacts/8/content",
    ]


def _names(body: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_upload_workspace_puts_a_gzip_of_the_folder(make_client, tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link.py").symlink_to("src/a.py")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    client, rec = make_client(ok({"checkpoint": 4, "files": 4, "bytes_total": 40}, 201))
    result = client.upload_workspace(3, tmp_path)
    assert (result.checkpoint, result.files) == (4, 4)
    request = rec.requests[0]
    assert request.method == "PUT"
    assert request.url.path == "/api/v1/runs/3/workspace"
    assert request.headers["content-type"] == "application/gzip"
    assert int(request.headers["content-length"]) == len(rec.bodies[0])
    members = _names(rec.bodies[0])
    assert set(members) == {"src", "src/a.py", ".git", ".git/HEAD", "empty", "link.py", "run.sh"}
    assert members["link.py"].issym() and members["link.py"].linkname == "src/a.py"
    assert members["run.sh"].mode & 0o111
    assert members["src/a.py"].isfile()


def test_a_429_on_upload_sends_the_whole_archive_again(make_client, tmp_path):
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * 4096)
    limited = problem(429, "Too Many Requests", headers={"Retry-After": "1"})
    client, rec = make_client(limited, ok({"checkpoint": 1, "files": 1, "bytes_total": 1}, 201))
    client.upload_workspace(3, tmp_path)
    assert len(rec.bodies) == 2
    assert rec.bodies[0] == rec.bodies[1]
    assert "big.bin" in _names(rec.bodies[1])


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside", "./../../work2/x"])
def test_upload_refuses_a_symlink_leaving_the_folder(make_client, tmp_path, target):
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "bad").symlink_to(target)
    client, rec = make_client(ok({}))
    with pytest.raises(WorkspaceArchiveError, match="sub/bad"):
        client.upload_workspace(3, work)
    assert rec.requests == []


def test_upload_archive_sends_bytes_as_given(make_client):
    client, rec = make_client(ok({"checkpoint": 1, "files": 0, "bytes_total": 0}, 201))
    client.upload_archive(3, b"\x1f\x8bnot really")
    assert rec.bodies[0] == b"\x1f\x8bnot really"


def test_memory_is_read_remembered_and_forgotten_by_key(make_client):
    memory = {
        "project": "p",
        "items": [
            {"scope": "run", "key": "a/b c", "text": "t", "pinned": True, "uses": 2, "by": "x"}
        ],
    }
    client, rec = make_client(ok(memory))
    entries = client.remember(3, "a/b c", "t", pinned=True)
    assert rec.requests[-1].method == "PUT"
    assert rec.requests[-1].url.raw_path == b"/api/v1/runs/3/memory/a%2Fb%20c"
    assert rec.json() == {"text": "t", "scope": "run", "pinned": True}
    assert entries[0].key == "a/b c" and entries[0].pinned and entries[0].uses == 2
    client.remember(3, "k", "t", scope="project")
    assert rec.json() == {"text": "t", "scope": "project"}  # the pin left as it is
    assert client.read_memory(3)[0].text == "t" and rec.requests[-1].method == "GET"
    client.forget(3, "k", scope="project")
    assert rec.requests[-1].method == "DELETE"
    assert str(rec.requests[-1].url).endswith("/api/v1/runs/3/memory/k?scope=project")
