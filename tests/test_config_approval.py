"""A change to how the checks run is used only when a person approved it: the agent's edit to
test-runner settings (or to a protected test) is held, asked of a person in the inbox with its
diff, and the run waits when it has nothing else to do. Deny: the start's version stays, and the
agent reads the reason. Approve: the approved content is the run's new baseline for that file,
kept by a fork. The checks here are a real pytest suite, run by scripted agents."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from agents import approvals, checkpoints, config_changes, rewinds
from agents.models import (
    Approval,
    ApprovalSubject,
    Checkpoint,
    CheckpointKind,
    Event,
    RunStatus,
)
from agents.sandbox import isolation_available
from api.models import ApiToken
from tests.helpers import call, client_for, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db
needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap", reason="bubblewrap is not usable here"
)

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = (
    "import pytest\n\nfrom calc import add\n\n\n@pytest.mark.slow\ndef test_adds():\n"
    "    assert add(2, 2) == 4\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
)
PYPROJECT = (
    '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\npythonpath = ["."]\n'
)
# The honest change: the marker the tests use, registered (the check runs --strict-markers).
REGISTERED = PYPROJECT + 'markers = ["slow: slow tests"]\n'
DESELECT = "[pytest]\npythonpath = .\naddopts = -k 'not adds'\n"
CHECK = "python3 -m pytest -q -p no:cacheprovider --strict-markers"


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


def config_run(project: Path, *turns: dict, check: str = CHECK):
    return drive_until_idle(
        make_run(
            turns=list(turns),
            checks=[check],
            workspace_from=str(project),
            environment=sys.prefix,  # the test runner's own environment: it has pytest
        )
    )


def write(path: str, content: str) -> dict:
    return {"tool_calls": [call("write_file", path=path, content=content)]}


def finish_outputs(run) -> list[str]:
    return [
        e.payload["output"]
        for e in Event.objects.filter(run=run, kind="tool.result").order_by("seq")
        if e.payload["name"] == "finish"
    ]


def told(run) -> list[str]:
    return [
        e.payload["text"]
        for e in Event.objects.filter(run=run, kind="harness.message").order_by("seq")
        if e.payload.get("reason") == "config_decision"
    ]


@needs_bwrap
def test_a_deselecting_config_is_held_asked_and_a_denial_keeps_the_start(project, decider):
    run = config_run(
        project,
        write("pytest.ini", DESELECT),
        finish_turn("all tests pass"),
        finish_turn("still waiting"),  # nothing else to do: the run waits for the decision
        finish_turn("and again"),
        check=CHECK.replace(" --strict-markers", ""),
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    assert not run.lease_owner  # no worker holds it while a person thinks
    approval = Approval.objects.get(run=run)
    assert approval.subject == ApprovalSubject.CONFIG_CHANGE and approval.status == "pending"
    [held] = approval.tool_input["files"]
    assert held["path"] == "pytest.ini" and "+addopts = -k 'not adds'" in held["diff"]
    first, second = finish_outputs(run)
    assert "1 failed" in first and "HELD" in first and f"approval {approval.pk}" in first
    assert "still waits for a person" in second
    results = Event.objects.filter(run=run, kind="check.result")
    assert results.count() == 2 and not any(r.payload["passed"] for r in results)
    assert not (run.workspace_path / "pytest.ini").exists()  # the start had none

    approvals.decide_as(
        approval.pk, user=decider, decision="deny", reason="fix add(); do not deselect its test"
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.FAILED  # the script's last finish fails on the start's config
    assert "fix add(); do not deselect its test" in told(run)[0]
    assert "1 failed" in finish_outputs(run)[-1]
    decided = Event.objects.filter(run=run, kind="approval.decided").get().payload
    assert decided["decision"] == "denied" and "baseline" not in decided


@needs_bwrap
def test_an_approved_marker_registration_is_used_by_the_next_check_and_by_a_fork(project, decider):
    run = config_run(
        project,
        write("calc.py", FIXED),
        write("pyproject.toml", REGISTERED),
        finish_turn("fixed, and the marker registered"),
        finish_turn("waiting for the marker"),
        finish_turn("done"),
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    first = finish_outputs(run)[0]
    assert "'slow' not found in `markers`" in first and "HELD" in first
    assert (run.workspace_path / "pyproject.toml").read_text() == PYPROJECT  # not used
    approval = Approval.objects.get(run=run)
    assert '+markers = ["slow: slow tests"]' in config_changes.card_diff(approval.tool_input)

    call_command("approve", str(approval.pk), "--user", decider.username)
    run.refresh_from_db()
    entry = run.check_settings["pyproject.toml"]
    assert entry["hash"] == config_changes.digest(REGISTERED.encode())
    decided = Event.objects.get(run=run, kind="approval.decided").payload
    assert decided["baseline"] == [
        {"path": "pyproject.toml", "what": config_changes.SETTINGS, "hash": entry["hash"]}
    ]
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, finish_outputs(run)[-1]
    assert "approved your change" in told(run)[0]
    assert (run.workspace_path / "pyproject.toml").read_text() == REGISTERED
    # The harness's own earlier put-back of the start's version is not the agent's change.
    assert Event.objects.filter(run=run, kind="check.tampered").count() == 1
    assert Approval.objects.filter(run=run).count() == 1

    # A fork copies the approved baseline (what a rewind keeps is shown below, with a quicker
    # check).
    start = Checkpoint.objects.get(run=run, kind=CheckpointKind.RUN_START)
    fork = checkpoints.fork(run.pk, start.pk, actor="user:dana", created_by=decider)
    assert fork.check_settings["pyproject.toml"]["hash"] == entry["hash"]


def test_a_later_different_edit_asks_again_and_the_same_one_never_twice(tmp_path):
    a = [config_changes.Held("pytest.ini", "added", config_changes.SETTINGS, b"[pytest]\n")]
    b = [config_changes.Held("pytest.ini", "added", config_changes.SETTINGS, b"[pytest]\nx=1\n")]
    assert config_changes.call_id(a) == config_changes.call_id(list(a))
    assert config_changes.call_id(a) != config_changes.call_id(b)


@pytest.fixture
def asked(project, decider):
    """A run with a config change waiting (made as the runtime makes it, without a worker)."""
    run = make_run(turns=[finish_turn()], workspace_from=str(project), created_by=decider)
    held = [
        config_changes.Held(
            "tests/conftest.py",
            "added",
            config_changes.SETTINGS,
            b"import os\n# <script>alert(1)</script>\n",
        )
    ]
    return Approval.objects.create(
        run=run,
        tool_use_id=config_changes.call_id(held),
        tool_name=config_changes.TOOL,
        tool_input=config_changes.request_input(held, run.check_settings, run.protected),
        subject=ApprovalSubject.CONFIG_CHANGE,
    )


def test_the_inbox_card_shows_the_diff_escaped_and_approving_there_moves_the_baseline(
    asked, decider
):
    web = client_for(decider)
    page = web.get("/approvals/").content.decode()
    assert "+# &lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "Approve the change" in page and "Edit before approving" not in page
    web.post(reverse("approval-decide", args=[asked.pk]), {"decision": "approve"})
    asked.run.refresh_from_db()
    entry = asked.run.check_settings["tests/conftest.py"]
    assert entry["hash"] == config_changes.digest(b"import os\n# <script>alert(1)</script>\n")


def test_an_edit_or_allow_similar_is_refused_and_a_denial_via_the_api_needs_a_reason(
    asked, decider
):
    out = io.StringIO()
    call_command("approvals", stdout=out)
    assert "config_change tests/conftest.py\n--- /dev/null" in out.getvalue()
    with pytest.raises(CommandError, match="approved or denied, not edited"):
        call_command("approve", str(asked.pk), "--user", decider.username, "--input", "{}")
    with pytest.raises(approvals.ApprovalError, match="approve it alone"):
        approvals.decide_as(asked.pk, user=decider, decision="approve", allow_similar=True)
    _, token = ApiToken.issue(decider, ["read", "decide"])
    c = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/approvals/{asked.pk}/decision"
    assert c.post(url, {"decision": "deny"}, content_type="application/json").status_code == 422
    body = {"decision": "deny", "reason": "no conftest"}
    r = c.post(url, body, content_type="application/json")
    assert r.status_code == 200 and r.json()["status"] == "denied"
    asked.run.refresh_from_db()
    assert "tests/conftest.py" not in asked.run.check_settings  # denied: the baseline stays


@pytest.mark.parametrize("rewind", [False, True])
def test_an_approved_protected_file_is_the_baseline_also_after_a_rewind(tmp_path, decider, rewind):
    """A protected file changed and one added under the protected folder, with bash: held, and
    once approved what the checks use, whether the run goes on (the harness's own put-back is
    not taken for the agent's change) or is rewound to its start (the baseline is run state)."""
    root = tmp_path / "spec"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "SPEC.md").write_text("version 1\n")
    run = drive_until_idle(
        make_run(
            turns=[
                {"tool_calls": [call("bash", command="echo 'version 2' > docs/SPEC.md")]},
                {"tool_calls": [call("bash", command="echo new > docs/NEW.md")]},
                {"tool_calls": [call("bash", command="echo '# ok' > docs/conftest.py")]},
                finish_turn(),
                finish_turn(),
                finish_turn(),
            ],
            checks=["grep -q 'version 2' docs/SPEC.md && test -e docs/NEW.md"],
            workspace_from=str(root),
            protected_paths=["docs/"],
        )
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    assert (run.workspace_path / "docs" / "SPEC.md").read_text() == "version 1\n"
    assert not (run.workspace_path / "docs" / "NEW.md").exists()
    approval = Approval.objects.get(run=run)
    held = {f["path"]: f for f in approval.tool_input["files"]}
    assert sorted(held) == ["docs/NEW.md", "docs/SPEC.md", "docs/conftest.py"]
    assert held["docs/SPEC.md"]["what"] == config_changes.PROTECTED
    assert "+version 2" in held["docs/SPEC.md"]["diff"] and "+new" in held["docs/NEW.md"]["diff"]
    approvals.decide_as(approval.pk, user=decider, decision="approve", reason="the spec moved")
    if rewind:
        start = Checkpoint.objects.get(run=run, kind=CheckpointKind.RUN_START)
        rewinds.rewind(run.pk, start.pk, actor="user:dana")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, finish_outputs(run)[-1]
    assert "1 of 1 passed" in finish_outputs(run)[-1]
    assert "Their comment: the spec moved" in told(run)[0]
    assert run.protected["docs/SPEC.md"]["hash"] == config_changes.digest(b"version 2\n")
    assert Approval.objects.filter(run=run).count() == 1  # nothing asked again
    # The conftest.py under the protected folder is test settings too: both baselines moved.
    assert run.check_settings["docs/conftest.py"]["hash"] == config_changes.digest(b"# ok\n")
    assert (run.workspace_path / "docs" / "conftest.py").read_text() == "# ok\n"
