"""Verification you can trust: hidden-failure scenarios played by the scripted provider."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from agents import services
from agents.models import Approval, Event, RunStatus
from agents.verification import JUDGE_SYSTEM, criteria_of, goal_coverage
from tests.conftest import call, drive_until_idle, finish_turn, make_run
from tests.fake_anthropic import FakeAnthropic

pytestmark = pytest.mark.django_db

TEST_FILE = "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"


def seeded(tmp_path, code=BUGGY):
    (tmp_path / "test_calc.py").write_text(TEST_FILE)
    (tmp_path / "calc.py").write_text(code)
    return tmp_path


def events(run, kind):
    return [e.payload for e in Event.objects.filter(run=run, kind=kind).order_by("seq")]


def finish_results(run):
    return [r for r in events(run, "tool.result") if r["name"] == "finish"]


def test_finish_while_a_check_fails_is_not_success(tmp_path):
    run = make_run(
        turns=[finish_turn("all good, promise"), {"text": "hm"}],
        checks=["python3 -m unittest -q"],
        workspace_from=seeded(tmp_path),
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.FAILED  # it never succeeded; the script then ran out
    assert [c["passed"] for c in events(run, "check.result")] == [False]
    assert "0 of 1 passed" in finish_results(run)[0]["output"]


def test_editing_a_protected_test_with_a_file_tool_is_denied(tmp_path):
    cheat = call("write_file", path="test_calc.py", content="import unittest\n")
    run = make_run(
        turns=[
            {"tool_calls": [cheat]},
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            finish_turn(),
        ],
        checks=["python3 -m unittest -q"],
        workspace_from=seeded(tmp_path),
        protected_paths=["test_calc.py"],
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    denied = events(run, "tool.result")[0]
    assert denied["is_error"] and "test_calc.py is protected" in denied["output"]
    assert (run.workspace_path / "test_calc.py").read_text() == TEST_FILE


def test_a_protected_test_edited_through_bash_is_detected_and_the_checks_use_the_original(tmp_path):
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command="printf 'import unittest\\n' > test_calc.py")]},
            finish_turn("tests pass now"),
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            finish_turn("fixed for real"),
        ],
        checks=["python3 -m unittest -q"],
        workspace_from=seeded(tmp_path),
        protected_paths=["test_calc.py"],
    )
    run = drive_until_idle(run)
    tampered = events(run, "check.tampered")
    assert len(tampered) == 1 and tampered[0]["files"][0]["path"] == "test_calc.py"
    first, second = finish_results(run)
    assert first["is_error"] and "put back to their originals" in first["output"]
    assert not second["is_error"]
    assert [c["passed"] for c in events(run, "check.result")] == [False, True]
    assert run.status == RunStatus.SUCCEEDED  # only once the code was really fixed
    assert (run.workspace_path / "test_calc.py").read_text() == TEST_FILE


def test_protected_files_can_ask_a_person_instead(tmp_path):
    run = make_run(
        turns=[
            {
                "tool_calls": [
                    call("edit_file", path="./test_calc.py", old_string="4", new_string="0")
                ]
            },
            finish_turn(),
        ],
        checks=["true"],
        workspace_from=seeded(tmp_path),
        protected_paths=["test_calc.py"],
        protected_action="ask",
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL
    requested = events(run, "approval.requested")[0]
    assert "protected" in requested["reason"]
    assert Approval.objects.get(run=run).tool_name == "edit_file"


def test_a_check_that_passed_and_then_fails_is_a_regression(tmp_path):
    run = make_run(
        turns=[
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            {"tool_calls": [call("handoff", summary="calc add fixed, tests pass")]},
            {"tool_calls": [call("write_file", path="calc.py", content=BUGGY)]},
            finish_turn("refactored"),
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            finish_turn("restored"),
        ],
        checks=["python3 -m unittest -q"],
        workspace_from=seeded(tmp_path),
    )
    run = drive_until_idle(run)
    regressed = events(run, "check.regressed")
    assert len(regressed) == 1 and regressed[0]["command"] == "python3 -m unittest -q"
    assert "REGRESSION" in finish_results(run)[0]["output"]
    assert run.status == RunStatus.SUCCEEDED
    out = StringIO()
    call_command("show_run", str(run.pk), "--json", stdout=out)
    history = json.loads(out.getvalue())["checks_history"]["python3 -m unittest -q"]
    assert [(h["at"], h["passed"]) for h in history] == [
        ("session_end", True),
        ("finish", False),
        ("finish", True),
    ]


def test_a_judge_that_rejects_sends_its_reasons_back_and_the_run_goes_on(db):
    script = {
        "turns": [
            {"tool_calls": [call("write_file", path="README.md", content="todo\n")]},
            finish_turn("docs done"),
            {
                "tool_calls": [
                    call(
                        "write_file",
                        path="README.md",
                        content="# calc\nadd(a, b) adds two numbers.\n",
                    )
                ]
            },
            finish_turn("docs really done"),
        ],
        "judge": [
            {
                "criteria": [
                    {
                        "criterion": "README explains add",
                        "passed": False,
                        "reason": "README only says todo",
                    }
                ]
            },
            {
                "criteria": [
                    {"criterion": "README explains add", "passed": True, "reason": "it does"}
                ]
            },
        ],
    }
    run = services.create_run(
        goal="document calc",
        checks=["test -f README.md"],
        script=script,
        rubric="- README explains add",
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    verdicts = events(run, "judge.verdict")
    assert [v["passed"] for v in verdicts] == [False, True]
    first = finish_results(run)[0]
    assert first["is_error"] and "README only says todo" in first["output"]
    assert Event.objects.filter(run=run, kind="judge.verdict").first().actor == "judge"


def test_the_anthropic_judge_sees_goal_rubric_diff_and_checks_but_not_the_agent(settings):
    with FakeAnthropic() as fake:
        settings.SHIFTLOG = {
            **settings.SHIFTLOG,
            "ANTHROPIC_API_KEY": "sk-ant-judge-test-000000",
            "ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_MAX_RETRIES": 0,
            "ANTHROPIC_STRICT": True,
        }
        fake.push_message(
            [
                {"type": "text", "text": "Trust me, it is perfect."},
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "write_file",
                    "input": {"path": "out.txt", "content": "hello\n"},
                },
            ],
            stop_reason="tool_use",
        )
        fake.push_message(
            [
                {
                    "type": "tool_use",
                    "id": "t2",
                    "name": "finish",
                    "input": {"summary": "perfect work"},
                }
            ],
            stop_reason="tool_use",
        )
        fake.push_message(
            [
                {
                    "type": "tool_use",
                    "id": "j1",
                    "name": "verdict",
                    "input": {
                        "criteria": [
                            {"criterion": "out.txt greets", "passed": True, "reason": "says hello"}
                        ]
                    },
                }
            ],
            stop_reason="tool_use",
            model="claude-haiku-4-5",
        )
        run = make_run(
            provider="anthropic",
            checks=["test -f out.txt"],
            rubric="out.txt greets",
            judge_model="claude-haiku-4-5",
        )
        run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    judge = fake.requests[2]["body"]
    assert judge["model"] == "claude-haiku-4-5"
    assert judge["tool_choice"] == {"type": "tool", "name": "verdict"}
    assert JUDGE_SYSTEM in json.dumps(judge["system"])
    text = json.dumps(judge["messages"])
    assert (
        run.goal in text
        and "out.txt greets" in text
        and "+hello" in text
        and "test -f out.txt" in text
    )
    assert "Trust me" not in text and "perfect work" not in text  # never the agent's claims
    assert events(run, "judge.verdict")[0]["model"] == "claude-haiku-4-5"


def test_acceptance_criteria_are_flipped_only_by_the_harness_and_progress_is_kept(tmp_path):
    script = {
        "turns": [
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            {"tool_calls": [call("handoff", summary="calc add works, docs next")]},
            {"tool_calls": [call("write_file", path="NOTES.md", content="add adds")]},
            finish_turn(),
        ],
        "judge": [
            {"criteria": [{"criterion": "documented", "passed": True, "reason": "NOTES.md"}]}
        ],
    }
    run = services.create_run(
        goal="fix calc add and document it",
        checks=["true"],
        script=script,
        workspace_from=seeded(tmp_path),
        acceptance=["tests pass=python3 -m unittest -q", "documented"],
    )
    first = Event.objects.get(run=run, kind="run.created").payload
    assert first["acceptance"] == ["tests pass", "documented"]
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["passing"] for c in run.acceptance] == [True, True]
    progress = [(e["passing"], e["total"]) for e in events(run, "acceptance.updated")]
    assert progress == [(1, 2), (2, 2)]
    second = (
        Event.objects.filter(run=run, kind="session.started")
        .order_by("seq")[1]
        .payload["first_message"]
    )
    assert "1 of 2 passing" in second and "[x] tests pass" in second and "[ ] documented" in second


def test_a_handoff_that_drifts_from_the_goal_is_flagged_and_the_goal_stays_verbatim(db):
    run = make_run(
        goal="Implement CSV export for the invoices report",
        turns=[
            {
                "tool_calls": [
                    call("handoff", summary="Refactored the logging setup and tuned colours")
                ]
            },
            finish_turn(),
        ],
    )
    run = drive_until_idle(run)
    drift = events(run, "drift.warning")
    assert len(drift) == 1 and "invoices" in drift[0]["goal_words_missing"]
    second = (
        Event.objects.filter(run=run, kind="session.started")
        .order_by("seq")[1]
        .payload["first_message"]
    )
    assert "Implement CSV export for the invoices report" in second


def test_goal_coverage_is_high_for_an_on_topic_handoff():
    goal = "Write textstats.py with word_count and top_words, with unit tests"
    assert (
        goal_coverage(
            goal, {"summary": "textstats.py has word_count and top_words; unit tests pass"}
        )
        > 0.6
    )
    assert goal_coverage(goal, {"summary": "tidied the logging"}) < 0.2


def test_bad_verification_input_is_refused_clearly(tmp_path):
    with pytest.raises(services.RunError, match="protect"):
        make_run(turns=[finish_turn()], protected_paths=["nope.py"])
    with pytest.raises(services.RunError, match="needs a 'judge' section"):
        make_run(turns=[finish_turn()], acceptance=["judged thing"])
    with pytest.raises(services.RunError, match="listed twice"):
        make_run(turns=[finish_turn()], acceptance=["a=true", "a=true"])
    with pytest.raises(services.RunError, match="protect-action"):
        make_run(turns=[finish_turn()], protected_action="maybe")


def test_rubric_lines_become_criteria(db):
    run = make_run(turns=[finish_turn()], rubric="- first\n* second\n\n3. third\n")
    assert criteria_of(run) == ["first", "second", "third"]
