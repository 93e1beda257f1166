"""One spec for every way a run is made (agents/runspec.py): the web form, the API, the CLI, a
fork, a schedule or trigger, a fleet's child and the demos all build a RunSpec, and a run made
through each holds every setting it was given."""

from __future__ import annotations

import json
import sys
import typing
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from agents import checkpoints, services, workspaces
from agents.fleets.spawn import ChildPlan, _create_child
from agents.models import Run
from agents.runspec import RunError, RunSpec
from agents.schedules import cron as schedules
from api.models import ApiToken
from tests.helpers import client_for, drive_until_idle, finish_turn, script, user_with

pytestmark = pytest.mark.django_db

# Every column of a run that is not a setting: what happens to it, who made it, where it is.
RUN_STATE = {
    "id", "status", "status_reason", "created_by", "created_at", "updated_at", "started_at",
    "finished_at", "isolation", "resume_state", "branch_seq", "head_checkpoint", "forked_from",
    "turns", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "cost_usd", "cost_estimated", "active_seconds", "budget_warnings", "last_seq", "lease_owner",
    "lease_expires_at", "lease_renewals", "lease_expiries", "enqueued_at", "last_contact_at",
    "schedule", "trigger", "parent", "depth", "wake_at", "workspace_tree", "pause_cause",
}  # fmt: skip

# The settings a person gives, the same through every entry point (the web's, the API's and the
# CLI's own spellings of them below).
GIVEN = {
    "goal": "settings travel",
    "checks": ["true", "test -d ."],
    "rubric": "tidy",
    "judge_model": "claude-judge",
    "acceptance": [{"name": "passes", "check": "true"}],
    "protected_action": "ask",
    "provider": "external",
    "model": "claude-x",
    "heartbeat_seconds": 120,
    "project": "alpha",
    "max_sessions": 7,
    "max_tokens": 12345,
    "max_cost_usd": "3.5",
    "max_wall_seconds": 3600,
    "max_turns_per_session": 9,
    "max_input_tokens_per_session": 50_000,
    "tool_policy": [{"tool": "bash", "pattern": "curl", "action": "ask"}],
    "allowed_hosts": ["pypi.org"],
    "approval_timeout_seconds": 600,
    "webhook_urls": ["https://hooks.example.com/shiftlog"],
    "slack_channel": "C0ALPHA123",
    "slack_news": ["ended", "budget"],
    "limits": {"memory_mb": 700, "processes": 64, "cpu_seconds": 90, "workspace_mb": 50},
    "fleet_conflicts": "person",
}
# Compared between runs (a run's toolchain is a server path: only the CLI names one).
COMPARED = [n for n in Run.SETTINGS if n not in ("toolchain", "protected", "check_settings")]


def settings_of(run: Run) -> dict:
    run = Run.objects.get(pk=run.pk)
    return {name: getattr(run, name) for name in COMPARED}


@pytest.fixture
def reference(owner):
    return services.create_run(RunSpec(**GIVEN), created_by=owner)


def test_every_run_column_is_a_setting_or_the_runs_own_state():
    columns = {f.name for f in Run._meta.concrete_fields}
    assert set(Run.SETTINGS) | RUN_STATE == columns
    assert not set(Run.SETTINGS) & RUN_STATE
    assert set(Run.SETTINGS) <= set(RunSpec.names())


def test_the_reference_run_holds_what_was_given(reference):
    held = settings_of(reference)
    assert held["max_cost_usd"] == Decimal("3.5")
    assert held["fleet_conflicts"] == "person"
    assert held["tool_policy"][0]["tool"] == "network"  # the allowed host, first
    assert held["acceptance"] == [{"name": "passes", "check": "true", "passing": False}]
    assert held["limits"] == GIVEN["limits"]


def test_the_api_makes_the_same_run(reference, owner):
    _, token = ApiToken.issue(owner, ["write"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    r = api.post("/api/v1/runs", json.dumps(GIVEN), content_type="application/json")
    assert r.status_code == 201, r.content
    assert settings_of(Run.objects.get(pk=r.json()["id"])) == settings_of(reference)


def test_the_cli_makes_the_same_run(reference, owner):
    g = GIVEN
    args = ["create_run", "--goal", g["goal"], "--provider", g["provider"], "--json"]
    for check in g["checks"]:
        args += ["--check", check]
    args += [
        "--rubric",
        g["rubric"],
        "--judge-model",
        g["judge_model"],
        "--criterion",
        "passes=true",
    ]
    args += ["--protect-action", "ask", "--model", g["model"], "--heartbeat-seconds", "120"]
    args += ["--project", "alpha", "--max-sessions", "7", "--max-tokens", "12345"]
    args += ["--max-cost", "3.5", "--max-wall-seconds", "3600", "--max-turns-per-session", "9"]
    args += ["--max-input-tokens-per-session", "50000", "--policy", json.dumps(g["tool_policy"])]
    args += ["--allow-host", "pypi.org", "--approval-timeout", "600"]
    args += ["--webhook", g["webhook_urls"][0], "--max-memory-mb", "700", "--max-processes", "64"]
    args += ["--max-cpu-seconds", "90", "--max-workspace-mb", "50", "--fleet-conflicts", "person"]
    args += ["--slack-channel", "C0ALPHA123", "--slack-news", "ended,budget"]
    args += ["--user", owner.get_username()]
    out = StringIO()
    call_command(*args, stdout=out)
    made = Run.objects.get(pk=json.loads(out.getvalue())["id"])
    assert settings_of(made) == settings_of(reference)


def test_the_web_form_makes_the_same_run(reference):
    person = user_with("wendy", "view_run", "control_run", "add_run")
    g = GIVEN
    form = {
        **{k: v for k, v in g.items() if isinstance(v, (str, int))},
        "checks": "\n".join(g["checks"]),
        "criteria": "passes=true",
        "protect_action": "ask",
        "tool_policy": json.dumps(g["tool_policy"]),
        "allowed_hosts": "pypi.org",
        "webhook_urls": g["webhook_urls"][0],
        "slack_news": "ended, budget",
        **{f"max_{k}": v for k, v in g["limits"].items()},
    }
    r = client_for(person).post("/runs/new/", form)
    assert r.status_code == 302, r.content.decode()[:3000]
    made = Run.objects.exclude(pk=reference.pk).get()
    assert settings_of(made) == settings_of(reference)


# The check environment is a path on the server: every entry point names it, and it gives the
# same toolchain (the interpreter's prefix) through each.
ENVIRONMENT = sys.base_prefix


def test_every_entry_point_names_the_same_check_environment(owner):
    person = user_with("wendy", "view_run", "control_run", "add_run")
    ref = services.create_run(RunSpec(**GIVEN, environment=ENVIRONMENT), created_by=owner)
    assert ref.toolchain
    _, token = ApiToken.issue(owner, ["write"])
    r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        "/api/v1/runs", {**GIVEN, "environment": ENVIRONMENT}, content_type="application/json"
    )
    assert r.status_code == 201, r.content
    out = StringIO()
    call_command(
        "create_run", "--goal", "g", "--check", "true", "--env", ENVIRONMENT, "--json", stdout=out
    )
    form = {"goal": "g", "checks": "true", "provider": "external", "environment": ENVIRONMENT}
    assert client_for(person).post("/runs/new/", form).status_code == 302
    made = Run.objects.exclude(pk=ref.pk).order_by("pk")
    assert [m.toolchain for m in made] == [ref.toolchain] * 3


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"environment": "/no/such/python"}, "does not exist"),
        ({"environment": "/usr", "requirements": "r.txt"}, "not both"),
        ({"requirements": "/no/such/requirements.txt"}, "not a requirements file"),
    ],
)
def test_the_web_form_refuses_a_bad_check_environment_on_its_field(fields, words):
    person = user_with("wendy", "view_run", "control_run", "add_run")
    form = {"goal": "g", "checks": "true", "provider": "external", **fields}
    r = client_for(person).post("/runs/new/", form)
    assert r.status_code == 400
    field = r.context["form"].errors.get("environment", [])
    assert any(words in e for e in field), r.context["form"].errors
    assert not Run.objects.exists()


def _scripted(owner) -> Run:
    """The reference's settings, played by a script (a fork needs a checkpoint to start from)."""
    spec = RunSpec(
        **{**GIVEN, "provider": "scripted", "model": None, "heartbeat_seconds": None},
        script=script(finish_turn()),
    )
    return services.create_run(spec, created_by=owner)


def test_a_fork_keeps_every_setting(owner):
    origin = drive_until_idle(_scripted(owner))
    fork = checkpoints.fork(origin.pk, origin.checkpoints.first().pk, actor="user:dana")
    assert settings_of(fork) == {**settings_of(origin), "acceptance": fork.acceptance}
    assert [{**c, "passing": False} for c in origin.acceptance] == fork.acceptance
    assert (fork.protected, fork.check_settings) == (origin.protected, origin.check_settings)


def test_a_scheduled_or_triggered_run_keeps_every_setting(owner):
    """Both make their run with run_from_template; it once left out fleet_conflicts."""
    template = _scripted(owner)
    made = schedules.run_from_template(template, actor="schedule:1")
    assert settings_of(made) == settings_of(template)
    assert made.fleet_conflicts == "person"
    again = schedules.run_from_template(template, goal="another goal", actor="trigger:1")
    assert settings_of(again) == {**settings_of(template), "goal": "another goal"}


def test_a_fleet_child_keeps_its_parents_settings_but_what_it_is_given(owner):
    parent = _scripted(owner)
    part = {"goal": "a part", "checks": ["true"], "script": script(finish_turn())}
    tree = workspaces.snapshot(parent).tree
    plan = ChildPlan(0, part, "", tree, 100, Decimal("0.5"))
    child = _create_child(parent, plan, "run:1")
    own = {"goal", "checks", "provider", "model", "script_name", "max_tokens", "max_cost_usd"}
    own |= {"max_wall_seconds", "rubric", "judge_model", "acceptance", "heartbeat_seconds"}
    inherited = [n for n in COMPARED if n not in own]
    assert {n: getattr(child, n) for n in inherited} == {n: getattr(parent, n) for n in inherited}
    assert (child.goal, child.max_tokens, child.max_cost_usd) == ("a part", 100, Decimal("0.5"))
    assert child.parent == parent and child.depth == 1


def test_the_demos_are_made_from_a_spec(owner):
    from agents.fleets.demo import create_fleet_demo_run

    demo = services.create_demo_run(owner, turn_delay_seconds=0)
    assert (demo.goal, demo.max_turns_per_session) == (services.DEMO_GOAL, 4)
    fleet = create_fleet_demo_run(owner, turn_delay_seconds=0)
    assert fleet.script_name == "fleet demo (built in)"


def test_a_spec_of_a_run_is_the_spec_it_was_made_from(reference):
    again = RunSpec.of(reference).clean()
    made = RunSpec(**GIVEN).clean()
    for name in COMPARED:
        assert getattr(again, name) == getattr(made, name), name


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"checks": []}, "checks", "at least one check"),
        ({"checks": "pytest -q"}, "checks", "a list of shell commands"),
        ({"provider": "robot"}, "provider", "provider must be one of"),
        ({"fleet_conflicts": "both"}, "fleet_conflicts", "agent or person"),
        ({"protected_action": "warn"}, "protected_action", "deny or ask"),
        ({"limits": {"gpu": 1}}, "limits", "unknown limit 'gpu'"),
        ({"limits": {"memory_mb": 1}}, "memory_mb", "at least 16"),
        ({"max_cost_usd": "NaN"}, "max_cost_usd", "finite"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"heartbeat_seconds": 5, "provider": "scripted"}, "heartbeat_seconds", "external"),
        ({"environment": "/usr", "requirements": "r.txt"}, "environment", "not both"),
        ({"workspace_from": "/no/such/folder"}, "workspace_from", "not a folder"),
        ({"webhook_urls": ["ftp://x"]}, "webhook_urls", "http://"),
        ({"acceptance": ["a", "a"]}, "acceptance", "listed twice"),
        ({"goal": "  "}, "goal", "needs a goal"),
        ({"slack_channel": "general"}, "slack_channel", "not a Slack channel"),
        ({"slack_channel": "#General Chat"}, "slack_channel", "not a Slack channel"),
        ({"slack_news": ["ended", "started"]}, "slack_news", "unknown kind 'started'"),
        ({"slack_news": "off,ended"}, "slack_news", "unknown kind 'off'"),
    ],
)
def test_a_bad_spec_is_refused_naming_its_field(changes, field, words):
    spec = RunSpec(**{**GIVEN, "provider": "external", **changes})
    with pytest.raises(RunError) as e:
        spec.clean()
    assert e.value.field == field and words in str(e.value)


def test_the_clients_spec_is_the_apis(owner):
    """The Python client's RunSpec (clients/python) names what POST /runs takes, with the same
    choices, so the two cannot drift apart."""
    from shiftlog_client import _ops

    _, token = ApiToken.issue(owner, ["read"])
    schema = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/openapi.json").json()
    body = schema["components"]["schemas"]["RunCreate"]["properties"]
    hints = typing.get_type_hints(_ops.RunSpec)
    assert set(hints) | {"goal"} == set(body)
    for name, hint in hints.items():
        if typing.get_origin(hint) is typing.Literal:
            assert set(typing.get_args(hint)) == set(_enum(body[name])), name
    # And every name the API takes is a field of the server's own spec.
    assert set(body) <= set(RunSpec.names())


def _enum(prop: dict) -> list:
    if "enum" in prop:
        return prop["enum"]
    for option in prop.get("anyOf", []):
        if "enum" in option:
            return option["enum"]
    return []
