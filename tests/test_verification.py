"""Verification you can trust: hidden-failure scenarios played by the scripted provider."""

from __future__ import annotations

import json
import shutil
from io import StringIO

import pytest
from django.core.management import call_command

from agents import services, verification
from agents.blobstore import BlobStore
from agents.eventlog import describe
from agents.models import Approval, Artifact, Event, RunStatus
from agents.runspec import RunSpec
from agents.sandbox import Workspace
from agents.verification import JUDGE_SYSTEM, criteria_of, goal_coverage
from tests.fake_anthropic import FakeAnthropic
from tests.helpers import call, drive_until_idle, finish_turn, make_run

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
    # Each checkpoint keeps the checks' reading at that point: the ratchet's memory.
    cps = {c["kind"]: c for c in json.loads(out.getvalue())["checkpoints"]}
    assert cps["run_start"]["checks"] == {}
    ends = [c for c in json.loads(out.getvalue())["checkpoints"] if c["kind"] == "session_end"]
    first, last = (
        ends[0]["checks"]["python3 -m unittest -q"],
        ends[-1]["checks"]["python3 -m unittest -q"],
    )
    assert (first["at"], first["passed"]) == ("session_end", True)
    assert (last["at"], last["passed"]) == ("finish", True) and last["seq"] > first["seq"]


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
        RunSpec(
            goal="document calc",
            checks=["test -f README.md"],
            script=script,
            rubric="- README explains add",
        )
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
    # The judge is asked whether the change special-cases the tests' inputs (issue 29).
    assert "special-case the tests' inputs" in text
    assert (
        "special-cases the tests' own inputs" in judge["system"][0]["text"]
        if isinstance(judge["system"], list)
        else "special-cases the tests' own inputs" in judge["system"]
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
        RunSpec(
            goal="fix calc add and document it",
            checks=["true"],
            script=script,
            workspace_from=seeded(tmp_path),
            acceptance=["tests pass=python3 -m unittest -q", "documented"],
        )
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
    # A path that does not exist yet may be protected (its creation is a change); one outside
    # the workspace may not.
    assert make_run(turns=[finish_turn()], protected_paths=["nope.py"]).protected["nope.py"][
        "absent"
    ]
    with pytest.raises(services.RunError, match="protect"):
        make_run(turns=[finish_turn()], protected_paths=["../outside.py"])
    with pytest.raises(services.RunError, match="needs a 'judge' section"):
        make_run(turns=[finish_turn()], acceptance=["judged thing"])
    with pytest.raises(services.RunError, match="listed twice"):
        make_run(turns=[finish_turn()], acceptance=["a=true", "a=true"])
    with pytest.raises(services.RunError, match="protect-action"):
        make_run(turns=[finish_turn()], protected_action="maybe")


def test_rubric_lines_become_criteria(db):
    run = make_run(turns=[finish_turn()], rubric="- first\n* second\n\n3. third\n")
    assert criteria_of(run) == ["first", "second", "third"]


# --- protected folders --------------------------------------------------------------------------
PATCH_ASSERTS = "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
FOLDER_CHECK = "python3 -m unittest discover -s tests"


def seeded_folder(tmp_path, code=BUGGY):
    (tmp_path / "tests").mkdir(parents=True)
    (tmp_path / "tests" / "test_calc.py").write_text(TEST_FILE)
    (tmp_path / "calc.py").write_text(code)
    return tmp_path


def test_a_file_tool_may_not_create_a_new_file_in_a_protected_folder(tmp_path):
    run = make_run(
        turns=[
            {
                "tool_calls": [
                    call("write_file", path="tests/test_0_patch.py", content=PATCH_ASSERTS)
                ]
            },
            {"tool_calls": [call("write_file", path="tests_notes/todo.txt", content="fix add\n")]},
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            finish_turn(),
        ],
        checks=[FOLDER_CHECK],
        workspace_from=seeded_folder(tmp_path),
        protected_paths=["tests/"],
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    denied, sibling, _fixed = events(run, "tool.result")[:3]
    assert denied["is_error"] and "tests/test_0_patch.py is protected" in denied["output"]
    assert not (run.workspace_path / "tests" / "test_0_patch.py").exists()
    assert not sibling["is_error"]  # a folder merely named alike is not protected
    assert events(run, "check.tampered") == []


def test_a_new_file_in_a_protected_folder_asks_a_person_when_the_run_says_ask(tmp_path):
    run = make_run(
        turns=[
            {"tool_calls": [call("write_file", path="tests/conftest.py", content="x = 1\n")]},
            finish_turn(),
        ],
        checks=["true"],
        workspace_from=seeded_folder(tmp_path),
        protected_paths=["tests"],
        protected_action="ask",
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert "tests/conftest.py is protected" in events(run, "approval.requested")[0]["reason"]


def test_a_file_added_to_a_protected_folder_through_bash_is_taken_out_before_the_checks(
    tmp_path,
):
    run = make_run(
        turns=[
            {
                "tool_calls": [
                    call("bash", command=f"printf '%s' '{PATCH_ASSERTS}' > tests/test_0_patch.py")
                ]
            },
            finish_turn("tests pass now"),
            {"tool_calls": [call("write_file", path="calc.py", content=FIXED)]},
            finish_turn("fixed for real"),
        ],
        checks=[FOLDER_CHECK],
        workspace_from=seeded_folder(tmp_path),
        protected_paths=["tests/"],
    )
    run = drive_until_idle(run)
    tampered = events(run, "check.tampered")
    assert len(tampered) == 1
    [added] = tampered[0]["files"]
    assert added["path"] == "tests/test_0_patch.py" and added["change"] == "added"
    kept = Artifact.objects.get(run=run, name="moved-aside/tests/test_0_patch.py")
    assert kept.blob_hash == added["found"]  # moved aside, not lost
    assert BlobStore().get(kept.blob_hash) == PATCH_ASSERTS.encode()
    assert not (run.workspace_path / "tests" / "test_0_patch.py").exists()
    first, second = finish_results(run)
    assert first["is_error"] and "tests/test_0_patch.py (added)" in first["output"]
    assert not second["is_error"]
    assert [c["passed"] for c in events(run, "check.result")] == [False, True]
    assert run.status == RunStatus.SUCCEEDED  # only once the code was really fixed


def test_a_protected_folder_swapped_for_a_link_is_put_back_without_touching_where_it_led(tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    seeded_folder(work)
    workspace = Workspace(work)
    prints = verification.fingerprint(workspace, ["tests"])
    assert prints["tests/"]["folder"] is True and "tests/test_calc.py" in prints
    elsewhere.mkdir()
    (elsewhere / "test_calc.py").write_text(TEST_FILE)
    (elsewhere / "test_0_patch.py").write_text(PATCH_ASSERTS)
    shutil.rmtree(work / "tests")
    (work / "tests").symlink_to(elsewhere)
    changes = verification.tampered(workspace, prints)
    assert {(c["path"], c["change"]) for c in changes} == {
        ("tests", "replaced by a link or a file"),
        ("tests/test_calc.py", "deleted or replaced"),
    }
    verification.restore_originals(workspace, prints, changes)
    assert not (work / "tests").is_symlink()
    assert sorted(p.name for p in (work / "tests").iterdir()) == ["test_calc.py"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["test_0_patch.py", "test_calc.py"]
    assert verification.tampered(workspace, prints) == []


def test_caches_in_a_protected_folder_are_cleared_not_reported(tmp_path):
    workspace = Workspace(seeded_folder(tmp_path))
    prints = verification.fingerprint(workspace, ["tests/"])
    cache = tmp_path / "tests" / "__pycache__"
    cache.mkdir()
    (cache / "test_calc.cpython-311.pyc").write_bytes(b"crafted")
    assert verification.tampered(workspace, prints) == []
    verification.clear_caches(workspace, prints)
    assert not cache.exists() and (tmp_path / "tests" / "test_calc.py").exists()


def test_links_in_a_protected_folder_from_the_start_stay_and_new_ones_are_reported(tmp_path):
    workspace = Workspace(seeded_folder(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(tmp_path / "data")
    prints = verification.fingerprint(workspace, ["tests"])
    (tmp_path / "tests" / "more").symlink_to(tmp_path / "data")
    changes = verification.tampered(workspace, prints)
    assert [(c["path"], c["change"]) for c in changes] == [("tests/more", "added")]
    assert verification.restore_originals(workspace, prints, changes) == {}
    assert (tmp_path / "tests" / "fixtures").is_symlink()
    assert not (tmp_path / "tests" / "more").exists() and (tmp_path / "data").is_dir()


def test_a_single_protected_file_does_not_protect_its_neighbours(tmp_path):
    workspace = Workspace(seeded_folder(tmp_path))
    prints = verification.fingerprint(workspace, ["tests/test_calc.py"])
    assert list(prints) == ["tests/test_calc.py"]
    assert verification.is_protected(prints, "./tests/test_calc.py")
    assert not verification.is_protected(prints, "tests/conftest.py")
    (tmp_path / "tests" / "conftest.py").write_text("x = 1\n")
    assert verification.tampered(workspace, prints) == []


# --- drift at a forced handoff ------------------------------------------------------------------
def test_a_forced_handoff_is_measured_for_drift_on_the_agents_last_words(stubborn_agent):
    def chatter(text):
        return [{"text": text, "tool_calls": [call("list_files")]}] * 4  # limit 2 + grace 2

    run = make_run(
        goal="Implement CSV export for the invoices report",
        turns=[
            *chatter("Tidying the logging colours."),
            *chatter("Writing the CSV export of the invoices report."),
            finish_turn(),
        ],
        max_turns_per_session=2,
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    first, second, _third = run.sessions.order_by("index")
    assert first.handoff["forced"] and second.handoff["forced"]
    drift = Event.objects.filter(run=run, kind="drift.warning")
    assert [e.session_id for e in drift] == [first.pk]  # the on-topic forced handoff is fine
    warning = drift[0].payload
    assert warning["forced"] is True and "invoices" in warning["goal_words_missing"]
    assert warning["summary"] == "Tidying the logging colours."  # not the harness's boilerplate


def test_a_forced_handoff_without_any_words_from_the_agent_is_flagged():
    forced = {"summary": "The session reached its limit ...", "forced": True, "last_text": ""}
    warning = verification.drift("Implement CSV export for the invoices report", forced)
    assert warning is not None and warning["coverage"] == 0 and warning["forced"] is True


# --- how the events read ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        (
            "check.regressed",
            {"command": "pytest -q", "passed_at_seq": 12, "at": "finish"},
            "REGRESSION: `pytest -q` passed at #12 and fails now (finish)",
        ),
        (
            "check.tampered",
            {
                "files": [
                    {"path": "tests/test_a.py", "change": "modified"},
                    {"path": "tests/conftest.py", "change": "added"},
                ],
                "at": "finish",
            },
            "TAMPERED: 2 protected file(s) changed, the checks ran against the originals: "
            "tests/test_a.py (modified), tests/conftest.py (added)",
        ),
        (
            "drift.warning",
            {
                "coverage": 0.125,
                "threshold": 0.2,
                "goal_words_missing": ["csv", "export", "invoices"],
                "summary": "tidied logging",
            },
            "drift: the handoff speaks of 12% of the goal (below 20%); missing: csv, export, invoices",
        ),
        (
            "drift.warning",
            {"coverage": 0, "threshold": 0.2, "goal_words_missing": ["csv"], "forced": True},
            "drift: the forced handoff (the agent's last words) speaks of 0% of the goal",
        ),
        (
            "judge.verdict",
            {
                "passed": False,
                "model": "scripted",
                "error": "",
                "criteria": [
                    {"criterion": "README explains add", "passed": False, "reason": "only todo"},
                    {"criterion": "tests pass", "passed": True, "reason": "they do"},
                ],
            },
            "judge rejected, 1 of 2 criteria met: ✘ README explains add: only todo; "
            "✔ tests pass: they do",
        ),
    ],
)
def test_verification_events_read_as_one_plain_line(kind, payload, expected):
    line = describe(kind, payload)
    assert line.startswith(expected) and "\n" not in line and "{" not in line
