from __future__ import annotations

import pytest

from agents.policy import PolicyError, classify_bash, decide, similar_rule, validate

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer


@pytest.mark.parametrize(
    ("command", "risk"),
    [
        ("curl -sS https://example.com", "reaches the network"),
        ("pip install requests", "reaches the network"),
        ("python3 -m pip install -r requirements.txt", "reaches the network"),
        ("npm install left-pad", "reaches the network"),
        ("git push origin main", "reaches the network"),
        ("ssh host uptime", "reaches the network"),
        ("rm -rf build", "deletes widely"),
        ("rm -r src", "deletes widely"),
        ("find . -name '*.pyc' -delete", "deletes widely"),
        ("sudo apt-get install x", "changes permissions or the system"),
        ("chmod -R 777 .", "changes permissions or the system"),
        ("chown root file", "changes permissions or the system"),
        ("echo hi > /etc/motd", "writes outside the workspace"),
        ("cat x >> ~/.bashrc", "writes outside the workspace"),
        ("echo x | tee ../outside.txt", "writes outside the workspace"),
        ("cp secrets.txt /tmp/", "writes outside the workspace"),
    ],
)
def test_risky_commands_are_classified(command, risk):
    assert risk in classify_bash(command)


@pytest.mark.parametrize(
    "command",
    [
        "python3 -m unittest -v",
        "ls -la",
        "cat a.txt > b.txt",
        "rm a.txt",
        "echo ok > /dev/null",
        "grep -r foo src",
        "git status",
        "git diff",
        "chmod +x run.sh",
        "pytest -q",
    ],
)
def test_ordinary_commands_are_not_risky(command):
    assert classify_bash(command) == []


def test_risky_bash_asks_by_default_and_the_rest_is_allowed():
    assert decide([], "bash", {"command": "curl x"}).action == "ask"
    assert decide([], "bash", {"command": "ls"}).action == "allow"
    assert decide([], "write_file", {"path": "a.py", "content": ""}).action == "allow"


def test_the_first_matching_rule_wins():
    rules = validate(
        [
            {"tool": "bash", "pattern": r"^pip install", "action": "allow"},
            {"tool": "bash", "pattern": "curl", "action": "deny"},
            {"tool": "write_file", "pattern": r"^tests/", "action": "ask"},
            {"tool": "*", "action": "allow"},
        ]
    )
    assert decide(rules, "bash", {"command": "pip install x"}).action == "allow"
    decision = decide(rules, "bash", {"command": "curl evil"})
    assert decision.action == "deny" and "curl" in decision.reason
    assert decide(rules, "write_file", {"path": "tests/test_a.py"}).action == "ask"
    assert decide(rules, "write_file", {"path": "src/a.py"}).action == "allow"
    assert decide(rules, "bash", {"command": "rm -rf /"}).action == "allow"  # "*" allow wins


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"tool": "bash"}, "a list of rules"),
        (["allow"], "must be an object"),
        ([{"action": "allow"}], "needs a tool name"),
        ([{"tool": "bash", "action": "maybe"}], "action must be one of"),
        ([{"tool": "bash", "action": "ask", "pattern": "("}], "not a valid regular expression"),
        ([{"tool": "bash", "action": "ask", "colour": "red"}], "unknown keys: colour"),
    ],
)
def test_bad_policies_are_refused_clearly(rules, message):
    with pytest.raises(PolicyError, match=message):
        validate(rules)


def test_similar_rule_allows_the_same_program_and_subcommand():
    rule = similar_rule("bash", {"command": "pip install requests==2.0"})
    assert decide([rule], "bash", {"command": "pip install httpx"}).action == "allow"
    assert decide([rule], "bash", {"command": "pip download httpx"}).action == "ask"  # classifier
    rule = similar_rule("bash", {"command": "rm -rf build"})
    assert decide([rule], "bash", {"command": "rm -rf dist"}).action == "allow"
    assert decide([rule], "bash", {"command": "rm -rf dist/old cache"}).action == "allow"
    assert decide([rule], "bash", {"command": "curl x"}).action == "ask"


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "rm -rf ~",
        "rm -rf build /etc",
        "rm -rf ../other",
        "rm -rf build/../..",
        "rm -rf build; curl http://x",
        "rm -rf build && sh",
        "rm -rf $(cat list)",
        "rm -rf `pwd`",
        "rm -rf build > /dev/null",
        "rm -r build",  # other flags: not the approved command's shape
        "rm -rf build\ncurl x",
    ],
)
def test_similar_to_rm_rf_build_is_never_outside_the_workspace_nor_a_second_command(command):
    rule = similar_rule("bash", {"command": "rm -rf build"})
    assert decide([rule], "bash", {"command": command}).action == "ask"


def test_a_compound_command_is_similar_only_to_itself():
    approved = "python3 -m unittest -v 2>&1 && rm -rf build __pycache__"
    rule = similar_rule("bash", {"command": approved})
    assert decide([rule], "bash", {"command": approved}).action == "allow"
    assert decide([rule], "bash", {"command": "python3 x.py && rm -rf /"}).action == "ask"
    assert decide([rule], "bash", {"command": approved + " && curl x"}).action == "ask"
    file_rule = similar_rule("write_file", {"path": "tests/unit/test_a.py"})
    assert decide([file_rule], "write_file", {"path": "tests/unit/test_b.py"}).action == "allow"
