"""Compare two runs: a fork and its original with different files and check results, side by side
on the web (owner, viewer, outsider, anonymous; bad ids) and in `manage.py compare_runs`."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents import checkpoints, compare, eventlog
from agents.models import EventKind, Run
from tests.helpers import call, client_for, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db

CHECK = "grep -q two a.py"


@pytest.fixture
def pair(owner) -> tuple[Run, Run]:
    """An original that wrote a.py and failed its check, and a fork of it that changed a.py,
    added b.txt and passed."""
    original = make_run(
        goal="say two",
        turns=[
            {"text": "Writing.", "tool_calls": [call("write_file", path="a.py", content="one\n")]},
            finish_turn(),
        ],
        checks=[CHECK],
        created_by=owner,
    )
    original = drive_until_idle(original)
    assert original.status == "failed", original.status_reason
    start = checkpoints.create(original.pk, kind="manual", label="after a.py")
    fork = checkpoints.fork(original.pk, start.pk, actor="user:olivia", created_by=owner)
    (fork.workspace_path / "a.py").write_text("two\n")
    (fork.workspace_path / "b.txt").write_text("new\n")
    checkpoints.create(fork.pk, kind="manual", label="fixed")
    eventlog.append(
        fork.pk,
        EventKind.CHECK_RESULT,
        {"command": CHECK, "passed": True, "exit_code": 0, "timed_out": False, "at": "finish"},
    )
    original.refresh_from_db()
    fork.refresh_from_db()
    return original, fork


def test_the_comparison_holds_both_runs_checks_and_the_diff(pair):
    original, fork = pair
    found = compare.compare(original, fork)
    assert found.b.forked_from_run == original.pk and found.a.forked_from_run is None
    assert [r["passed"] for r in found.a.checks[CHECK]] == [False]
    assert [r["passed"] for r in found.b.checks[CHECK]] == [True]
    assert {(c.path, c.status) for c in found.changes} == {("a.py", "changed"), ("b.txt", "added")}
    assert found.a.sessions == 1 and found.b.sessions == 0


def test_the_page_shows_two_columns_the_checks_and_the_diff(owner, pair):
    original, fork = pair
    response = client_for(owner).get(f"/runs/compare/?a={original.pk}&b={fork.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="col-a"' in html and 'id="col-b"' in html
    assert f"Run {original.pk}</a>" in html and f"Run {fork.pk}</a>" in html
    checks = html.split('id="compare-checks"')[1].split("</section>")[0]
    assert CHECK in checks and "fail" in checks and "pass" in checks
    diff = html.split('id="compare-diff"')[1]
    assert "a.py" in diff and "b.txt" in diff and '<span class="add">+two' in diff
    assert '<span class="del">-one' in diff


def test_a_fork_links_to_the_comparison_with_its_origin(owner, pair):
    original, fork = pair
    c = client_for(owner)
    page = c.get(f"/runs/{fork.pk}/").content.decode()
    assert f'href="/runs/compare/?fork={fork.pk}"' in page
    assert 'id="compare-origin"' not in c.get(f"/runs/{original.pk}/").content.decode()
    found = c.get(f"/runs/compare/?fork={fork.pk}").content.decode()
    assert f"Run {original.pk} and run {fork.pk}" in found
    not_a_fork = c.get(f"/runs/compare/?fork={original.pk}")
    assert not_a_fork.status_code == 400 and "is not a fork" in not_a_fork.content.decode()


def test_a_viewer_may_compare_an_outsider_and_anonymous_may_not(viewer, outsider, client, pair):
    original, fork = pair
    url = f"/runs/compare/?a={original.pk}&b={fork.pk}"
    assert client_for(viewer).get(url).status_code == 200
    assert client_for(outsider).get(url).status_code == 404
    assert client_for(outsider).get(f"/runs/compare/?fork={fork.pk}").status_code == 404
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")


def test_one_run_the_user_may_not_see_is_a_404(owner, outsider, pair):
    theirs = make_run(goal="theirs", created_by=outsider)
    original, _ = pair
    c = client_for(owner)
    assert c.get(f"/runs/compare/?a={original.pk}&b={theirs.pk}").status_code == 404
    assert c.get(f"/runs/compare/?a={theirs.pk}&b={original.pk}").status_code == 404


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("a=1", "give run B"),
        ("b=1", "give run A"),
        ("a=x&b=1", "must be a whole number"),
        ("a=1&b=99999999999999999999999", "at most"),
        ("a=1&b=1", "two different runs"),
        ("a=%00&b=2", "whole number"),
    ],
)
def test_missing_or_bad_ids_get_the_form_with_the_reason(owner, query, message):
    response = client_for(owner).get(f"/runs/compare/?{query}")
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="compare-error"' in html and message in html and 'name="a"' in html


def test_without_ids_the_page_asks_for_two(owner):
    response = client_for(owner).get("/runs/compare/")
    assert response.status_code == 200 and 'name="a"' in response.content.decode()


def test_a_run_without_a_checkpoint_yet_has_no_diff(owner):
    a, b = make_run(created_by=owner), make_run(created_by=owner)
    found = compare.compare(a, b)
    assert found.changes is None
    html = client_for(owner).get(f"/runs/compare/?a={a.pk}&b={b.pk}").content.decode()
    assert "has no checkpoint yet" in html


# --- the CLI ---------------------------------------------------------------------------------
def cli(*args: str) -> str:
    out = StringIO()
    call_command("compare_runs", *args, stdout=out)
    return out.getvalue()


def test_compare_runs_prints_a_table_and_the_diff(pair):
    original, fork = pair
    text = cli(str(original.pk), str(fork.pk))
    assert f"run {original.pk}" in text and f"run {fork.pk}" in text
    assert "failed" in text and "queued" in text
    check = next(line for line in text.splitlines() if line.startswith("check "))
    assert "fail" in check and "pass" in check
    assert "changed      a.py" in text and "added        b.txt" in text and "+two" in text
    data = json.loads(cli(str(original.pk), str(fork.pk), "--json"))
    assert data["b"]["forked_from_run"] == original.pk
    assert {c["path"] for c in data["diff"]} == {"a.py", "b.txt"}


@pytest.mark.parametrize(
    ("other", "message"), [(999_999, "no run with id 999999"), (0, "two different runs")]
)
def test_compare_runs_exits_2_on_bad_ids(owner, other, message):
    run = make_run(created_by=owner)
    with pytest.raises(CommandError, match=message) as info:
        call_command(
            "compare_runs", str(run.pk), str(other or run.pk), stdout=StringIO(), stderr=StringIO()
        )
    assert info.value.returncode == 2


def test_compare_runs_exits_2_on_what_is_no_id_from_a_real_process():
    proc = subprocess.run(
        [sys.executable, "manage.py", "compare_runs", "x", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "an id must be a whole number" in proc.stderr
