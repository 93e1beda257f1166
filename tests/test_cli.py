from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from agents.models import Run, RunStatus
from tests.helpers import demo_to_success, drive_until_idle, make_run

pytestmark = pytest.mark.django_db


def cli(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_run_prints_the_id_and_json_with_json(owner):
    run_id = int(cli("create_run", "--goal", "g", "--check", "true", "--user", "olivia"))
    run = Run.objects.get(pk=run_id)
    assert run.created_by == owner
    assert run.provider == "scripted" and run.model == "scripted"
    data = json.loads(
        cli("create_run", "--goal", "g", "--check", "true", "--json", "--max-cost", "2.5")
    )
    assert data["status"] == "queued"
    assert str(Run.objects.get(pk=data["id"]).max_cost_usd) == "2.500000"


def test_create_run_with_a_script_file_and_a_workspace(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps({"turns": [{"tool_calls": [{"name": "finish", "input": {"summary": "ok"}}]}]})
    )
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "given.txt").write_text("hello")
    run_id = int(
        cli(
            "create_run",
            "--goal",
            "g",
            "--check",
            "grep -q hello given.txt",
            "--script",
            str(script),
            "--workspace-from",
            str(seed),
        )
    )
    run = drive_until_idle(Run.objects.get(pk=run_id))
    assert run.status == RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--goal", "g"], "at least one --check"),
        (["--goal", " ", "--check", "true"], "needs a goal"),
        (["--goal", "g", "--check", "true", "--script", "/nope.json"], "script file not found"),
        (
            ["--goal", "g", "--check", "true", "--provider", "anthropic", "--script", "x.json"],
            "only for --provider scripted",
        ),
        (["--goal", "g", "--check", "true", "--max-cost", "lots"], "max-cost must be a number"),
        (
            ["--goal", "g", "--check", "true", "--max-sessions", "0"],
            "max-sessions must be at least 1",
        ),
        (["--goal", "g", "--check", "true", "--workspace-from", "/nonexistent"], "is not a folder"),
        (["--goal", "g", "--check", "true", "--user", "nobody"], "no user named"),
    ],
)
def test_create_run_refuses_bad_arguments_clearly_with_exit_2(args, message):
    with pytest.raises(CommandError, match=message) as info:
        cli("create_run", *args)
    assert info.value.returncode == 2
    assert not Run.objects.exists()


def test_an_invalid_script_file_is_refused_with_where_it_is_wrong(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"turns": [{"tool_calls": [{"input": {}}]}]}))
    with pytest.raises(
        CommandError, match=r"turns\[0\]\.tool_calls\[0\]: missing required field 'name'"
    ):
        cli("create_run", "--goal", "g", "--check", "true", "--script", str(bad))
    bad.write_text("{not json")
    with pytest.raises(CommandError, match="is not valid JSON"):
        cli("create_run", "--goal", "g", "--check", "true", "--script", str(bad))


def test_show_run_reports_status_sessions_usage(decider):
    run = demo_to_success(decider)
    data = json.loads(cli("show_run", str(run.pk), "--json"))
    assert data["status"] == "succeeded"
    assert data["offline"] is True
    assert len(data["sessions"]) >= 2
    assert data["usage"]["turns"] == run.turns
    text = cli("show_run", str(run.pk))
    assert "succeeded" in text and "(offline)" in text and "session 1: ended with a handoff" in text


def test_tail_run_prints_one_event_a_line_and_after_filters(decider):
    run = demo_to_success(decider)
    lines = cli("tail_run", str(run.pk)).splitlines()
    assert len(lines) == run.last_seq
    assert lines[0].startswith("#1 ") and "run.created" in lines[0]
    rows = [
        json.loads(line)
        for line in cli("tail_run", str(run.pk), "--json", "--after", "10").splitlines()
    ]
    assert [r["seq"] for r in rows] == list(range(11, run.last_seq + 1))
    # --follow on a finished run prints everything and returns.
    assert len(cli("tail_run", str(run.pk), "--follow").splitlines()) == run.last_seq


def test_control_commands_name_the_acting_user(owner):
    run_id = int(cli("create_run", "--goal", "g", "--check", "true"))
    assert "paused" in cli("pause_run", str(run_id), "--user", "olivia")
    with pytest.raises(CommandError, match="already paused"):
        cli("pause_run", str(run_id))
    assert "queued" in cli("resume_run", str(run_id), "--user", "olivia")
    cli("note_run", str(run_id), "try harder", "--user", "olivia")
    assert "cancelled" in cli("cancel_run", str(run_id))
    with pytest.raises(CommandError, match="only a paused run can be resumed"):
        cli("resume_run", str(run_id))
    actors = list(
        Run.objects.get(pk=run_id)
        .events.filter(kind__in=["run.status", "human.note"])
        .values_list("actor", flat=True)
    )
    assert actors[:3] == ["user:olivia", "user:olivia", "user:olivia"]
    assert actors[3].startswith("cli:")


def test_commands_on_a_missing_run_exit_2():
    for command in ("show_run", "tail_run", "pause_run", "resume_run", "cancel_run"):
        with pytest.raises(CommandError, match="no run with id 4242") as info:
            cli(command, "4242")
        assert info.value.returncode == 2


def test_argparse_errors_exit_2_from_a_real_process():
    proc = subprocess.run(
        [sys.executable, "manage.py", "show_run", "not-a-number"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "an id must be a whole number" in proc.stderr


def test_bootstrap_creates_an_admin_once_with_a_one_time_login_link(client):
    out = cli("bootstrap")
    assert "Created the admin account" in out and "Created the demo run" in out
    link = out.split("login link for admin: ")[1].split()[0]
    path = link.removeprefix("http://127.0.0.1:8000")
    assert client.get(path).status_code == 200  # asks for a click: GET changes nothing
    response = client.post(path)
    assert response.status_code == 302
    assert client.get("/admin/agents/run/").status_code == 200
    client.logout()
    assert client.post(path).status_code == 403  # used up
    again = cli("bootstrap")
    assert "Created" not in again  # no second admin, no second demo
    assert Run.objects.count() == 1


def test_pages_require_login(client):
    assert client.get("/").status_code == 302
    assert client.get("/admin/agents/run/").status_code == 302
    assert client.get("/login/MQ/bad-token/").status_code == 403


def test_tail_run_describes_verification_events_in_words(owner):
    from agents import eventlog
    from tests.helpers import make_run

    run = make_run(created_by=owner)
    eventlog.append(run.pk, "check.regressed", {"command": "pytest -q", "passed_at_seq": 3})
    eventlog.append(
        run.pk, "check.tampered", {"files": [{"path": "tests/conftest.py", "change": "added"}]}
    )
    eventlog.append(
        run.pk,
        "drift.warning",
        {"coverage": 0.1, "threshold": 0.2, "goal_words_missing": ["invoices"]},
    )
    eventlog.append(
        run.pk,
        "judge.verdict",
        {"passed": True, "criteria": [{"criterion": "documented", "passed": True, "reason": "ok"}]},
    )
    lines = cli("tail_run", str(run.pk), "--after", "1").splitlines()
    assert [line.split()[2] for line in lines] == [
        "check.regressed",
        "check.tampered",
        "drift.warning",
        "judge.verdict",
    ]
    assert "REGRESSION: `pytest -q` passed at #3 and fails now" in lines[0]
    assert "TAMPERED: 1 protected file(s) changed" in lines[1]
    assert "tests/conftest.py (added)" in lines[1]
    assert "drift: the handoff speaks of 10% of the goal (below 20%); missing: invoices" in lines[2]
    assert "judge accepted, 1 of 1 criteria met: ✔ documented: ok" in lines[3]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_tail_run_follow_prints_events_appended_after_it_started_until_the_run_ends(procs):
    from agents import services
    from tests.helpers import make_run
    from tests.procs import wait_for

    run = make_run(turns=[{"text": "x"}])  # queued: no worker drives it here
    tail = procs.spawn(
        "tail",
        [sys.executable, "manage.py", "tail_run", str(run.pk), "--follow", "--interval", "0.1"],
    )
    wait_for(
        lambda: "run.created" in tail.log(),
        timeout=30,
        what="tail_run to print the log so far",
        details=tail.log,
    )
    assert tail.popen.poll() is None, tail.log()  # a live run: it keeps following
    services.note_run(run.pk, "a note written after tail_run started", actor="user:olivia")
    wait_for(
        lambda: "a note written after tail_run started" in tail.log(),
        timeout=15,
        what="tail_run to print the new event",
        details=tail.log,
    )
    services.cancel_run(run.pk, actor="user:olivia")
    assert tail.wait(timeout=15) == 0, tail.log()  # the run is over: so is the tail
    lines = tail.log().splitlines()
    run.refresh_from_db()
    assert [int(line.split()[0].lstrip("#")) for line in lines] == list(
        range(1, run.last_seq + 1)
    ), lines
    assert "queued → cancelled" in lines[-1]


def test_tail_run_json_names_a_session_by_its_number_in_the_run(decider):
    """As the API and show_run do: not the session's database id."""
    from agents.models import Session

    first = demo_to_success(decider)  # its sessions take the first ids
    second = demo_to_success(decider)
    assert Session.objects.filter(run=second, index=1).get().pk != 1
    lines = [json.loads(x) for x in cli("tail_run", str(second.pk), "--json").splitlines()]
    assert {x["session"] for x in lines} - {None} == {1, 2}
    assert first.pk != second.pk


def test_show_run_json_says_what_made_a_run(owner):
    from agents.schedules import cron as schedules

    template = drive_until_idle(make_run(created_by=owner, goal="nightly"))
    schedule = schedules.create(template, "0 3 * * *", actor="user:olivia")
    made = schedules.run_from_template(template, actor="schedule", schedule=schedule)
    shown = json.loads(cli("show_run", str(made.pk), "--json"))
    assert (shown["schedule"], shown["trigger"], shown["forked_from"]) == (schedule.pk, None, None)
    assert json.loads(cli("show_run", str(template.pk), "--json"))["schedule"] is None


LIGHT_START = """
import json, sys
import django
django.setup()
from django.core import checks
from django.core.management import execute_from_command_line
ran = []
checks.run_checks = lambda *a, **k: ran.append(1) or []
try:
    execute_from_command_line(["manage.py", *sys.argv[1:]])
except BaseException:
    pass
heavy = ["proxy", "daphne.server", "twisted.internet.reactor"]
print(json.dumps({"checks": bool(ran), "loaded": [m for m in heavy if m in sys.modules]}))
"""


@pytest.mark.parametrize("argv", [["checkpoint_run", "4242"], ["schedules"]])
def test_a_command_on_a_run_starts_without_the_servers_or_the_system_checks(argv, procs):
    """The CLI's start-up is most of a command's time: a command on one run (or schedule) loads
    neither the web server, nor the egress proxy's HTTP library, nor runs Django's system checks
    (the servers' start does)."""
    env = procs.env(DJANGO_SETTINGS_MODULE="shiftlog.settings")
    light = [sys.executable, "-c", LIGHT_START]
    proc = subprocess.run([*light, *argv], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"checks": False, "loaded": []}
    proc = subprocess.run([*light, "check"], capture_output=True, text=True, timeout=60, env=env)
    assert (
        json.loads(proc.stdout.splitlines()[-1])["checks"] is True
    )  # `manage.py check` still does
