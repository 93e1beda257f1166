"""`create_run` without `--script` says the scripted provider will play the demo's script (on
stderr: stdout keeps only the id or the JSON, which scripts and the README rely on); the web
form's script field says the same."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from agents.models import Run, RunScript
from agents.services import DEMO_GOAL
from tests.helpers import client_for
from tests.procs import BASE_DIR

NOTICE = (
    "no --script given: the scripted provider will play the built-in demo script, which works "
    "on the demo's task (textstats.py), not on this goal. Give --script FILE to have it play "
    "your own."
)


def create(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("create_run", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_a_goal_of_ones_own_without_a_script_is_told_it_gets_the_demo_script():
    out, err = create("--goal", "Write a haiku about queues", "--check", "true")
    assert err.strip() == NOTICE
    run = Run.objects.get(pk=int(out))  # only the id on stdout
    assert RunScript.objects.get(run=run).script["name"] == "demo"


@pytest.mark.django_db
def test_with_json_stdout_is_still_only_the_json():
    out, err = create("--goal", "Write a haiku", "--check", "true", "--json")
    assert json.loads(out)["status"] == "queued"
    assert err.strip() == NOTICE


@pytest.mark.django_db
def test_the_demos_own_goal_is_only_told_it_is_the_demos_goal():
    out, err = create("--goal", DEMO_GOAL, "--check", "python3 -m unittest -q")
    assert int(out)
    assert "the demo's goal" in err and "not on this goal" not in err


@pytest.mark.django_db
def test_a_script_of_ones_own_gets_no_notice(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "hi"}]}))
    out, err = create("--goal", "g", "--check", "true", "--script", str(script))
    assert int(out) and err == ""


def test_as_a_real_command_it_exits_0_with_the_notice_on_stderr_only(procs):
    done = subprocess.run(
        [sys.executable, "manage.py", "create_run", "--goal", "Sort my photos", "--check", "true"],
        cwd=BASE_DIR,
        env=procs.env(),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().isdigit(), done.stdout
    assert NOTICE in done.stderr


@pytest.mark.django_db
def test_the_web_forms_script_field_says_the_same(owner):
    page = html.unescape(client_for(owner).get("/runs/new/").content.decode())
    assert (
        "Empty: the scripted provider will play the built-in demo script, which works on the "
        "demo's task (textstats.py), not on this goal." in page
    )
