"""The new-run form says everything the CLI can: verification, people, sandbox, a policy in
rows; and "Run again with changes" fills it from any run."""

from __future__ import annotations

from decimal import Decimal

from agents.models import Run, RunScript
from tests.helpers import call, client_for, finish_turn, make_run

BASE = {"goal": "g", "checks": "true", "provider": "scripted"}


def rows(*rules: dict) -> dict:
    data = {"rules-TOTAL_FORMS": str(len(rules)), "rules-INITIAL_FORMS": "0"}
    for i, rule in enumerate(rules):
        data.update({f"rules-{i}-{k}": v for k, v in rule.items()})
    return data


def test_every_setting_of_the_cli_is_in_the_form(owner):
    response = client_for(owner).post(
        "/runs/new/",
        {
            **BASE,
            "webhook_urls": "https://hooks.example.com/a\n\nhttp://hooks.example.com/b",
            "approval_timeout_seconds": "600",
            "rubric": "The code is readable.\nThe tests cover ties.",
            "judge_model": "claude-sonnet-4-5",
            "criteria": "tests pass=python3 -m unittest -q\nreadable=true",
            "protect": "tests/\nsetup.cfg",
            "protect_action": "ask",
            "max_cpu_seconds": "120",
            "max_cost_usd": "2.5",
            **rows(
                {"tool": "bash", "pattern": "^pip install", "action": "ask", "note": "deps"},
                {"tool": "", "pattern": "", "action": "ask", "note": ""},  # an empty row
                {"tool": "write_file", "pattern": r"\.env$", "action": "deny", "note": ""},
            ),
            "tool_policy": '[{"tool": "bash", "action": "allow", "program": "pytest"}]',
        },
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.webhook_urls == ["https://hooks.example.com/a", "http://hooks.example.com/b"]
    assert run.approval_timeout_seconds == 600 and run.judge_model == "claude-sonnet-4-5"
    assert "ties" in run.rubric and run.max_cost_usd == Decimal("2.5")
    assert [c["name"] for c in run.acceptance] == ["tests pass", "readable"]
    assert run.acceptance[0]["check"] == "python3 -m unittest -q"
    assert any(p.startswith("tests") for p in run.protected) and "setup.cfg" in run.protected
    assert run.protected_action == "ask" and run.limits["cpu_seconds"] == 120
    # The rows in order, then the JSON rules.
    assert run.tool_policy[:2] == [
        {"tool": "bash", "action": "ask", "pattern": "^pip install", "note": "deps"},
        {"tool": "write_file", "action": "deny", "pattern": r"\.env$"},
    ]
    assert run.tool_policy[2]["program"] == "pytest"


def test_bad_settings_are_shown_next_to_their_field(owner):
    c = client_for(owner)
    cases = [
        ({"webhook_urls": "ftp://x.example.com/"}, "field-webhook_urls"),
        ({"approval_timeout_seconds": "0"}, "field-approval_timeout_seconds"),
        ({"criteria": "a=true\na=false"}, "field-criteria"),
        ({"protect": "../outside"}, "field-protect"),
    ]
    for extra, field in cases:
        response = c.post("/runs/new/", {**BASE, **extra})
        html = response.content.decode()
        assert response.status_code == 400, extra
        assert 'class="field has-error" id="' + field + '"' in html, extra
    # A row with a pattern but no tool says so on the row.
    bad_row = c.post(
        "/runs/new/", {**BASE, **rows({"tool": "", "pattern": "^rm", "action": "deny"})}
    )
    assert (
        bad_row.status_code == 400 and "name the tool the rule is for" in bad_row.content.decode()
    )
    assert not Run.objects.exists()


def test_run_again_with_changes_fills_the_form_and_keeps_the_script(owner, outsider):
    source = make_run(
        turns=[{"tool_calls": [call("write_file", path="x", content="1")]}, finish_turn()],
        checks=["test -f x"],
        created_by=owner,
        tool_policy=[
            {"tool": "bash", "pattern": "^curl", "action": "deny"},
            {"tool": "bash", "action": "allow", "program": "pytest"},
        ],
        webhook_urls=["https://hooks.example.com/a"],
        rubric="Be tidy.",
        approval_timeout_seconds=300,
    )
    c = client_for(owner)
    page = c.get(f"/runs/{source.pk}/").content.decode()
    assert f'href="/runs/new/?from={source.pk}"' in page
    html = c.get(f"/runs/new/?from={source.pk}").content.decode()
    assert "Run again with changes" in html and source.goal in html and "test -f x" in html
    assert 'value="^curl"' in html  # the pattern rule as a row
    assert "&quot;program&quot;: &quot;pytest&quot;" in html  # the rest as JSON
    assert "https://hooks.example.com/a" in html and "Be tidy." in html and 'value="300"' in html
    # Posting it (with a change) makes a new run that plays the source's script.
    response = c.post(
        "/runs/new/",
        {**BASE, "goal": "again, tidier", "checks": "test -f x", "script_from": str(source.pk)},
    )
    new = Run.objects.exclude(pk=source.pk).get()
    assert response.status_code == 302 and new.goal == "again, tidier"
    assert RunScript.objects.get(run=new).script == RunScript.objects.get(run=source).script
    # Someone who may not see the source gets no form from it, and not its script.
    assert client_for(outsider).get(f"/runs/new/?from={source.pk}").status_code == 404
    client_for(outsider).post(
        "/runs/new/", {**BASE, "goal": "theirs", "script_from": str(source.pk)}
    )
    theirs = Run.objects.get(goal="theirs")
    assert theirs.script_name == "demo (built in)"
