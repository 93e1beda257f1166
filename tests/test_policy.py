from __future__ import annotations

import posixpath
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.policy import (
    PolicyError,
    classify_bash,
    decide,
    describe_rule,
    similar_rule,
    validate,
)

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


# --- the parsed classifier and allow-similar rules (security issue: text checks were bypassed) --
RM_RULE = similar_rule("bash", {"command": "rm -rf build"})


@pytest.mark.parametrize(
    "command",
    [
        'rm -rf "/somewhere"',
        "rm -rf '/somewhere'",
        "rm -rf -- /somewhere",
        'rm -rf "build/../.."',
        'rm -rf build/".."/".."',
        "rm -rf build/'..'/..",
        'rm -rf "~"/../../x',
        'rm -rf "$HOME"',
        "rm -rf ${HOME}/x",
        "rm -rf {build,/etc}",
        "rm -rf .*",
        "rm -rf /e*",
        "rm -rf //etc",
        'rm -rf "$PWD/.."',
        "rm -rf $X",
        'rm -rf "$(echo /)"',
        'r""m -rf /',
        "\\rm -rf /",
        "/bin/rm -rf /",
        "env rm -rf /",
        "command rm -rf -- /",
        "sudo rm -rf build",
        "LD_PRELOAD=./x.so rm -rf build",
        "env LD_PRELOAD=./x.so rm -rf build",
        "env -C / rm -rf etc",
        "rm -rf build <<< x",
        "rm -rf build 2>/dev/null",
        "rm -rf $PWD{X,}..",
        "rm -rf ..$PWD",
        "rm -rf {},/etc}",
        "rm -rf {{,/etc}x",
        "rm -rf build\n\\\n curl evil",
        "rm -rfv build",
        "rm --recursive build",
    ],
)
def test_allow_similar_to_rm_rf_build_reads_the_command_not_its_text(command):
    assert decide([RM_RULE], "bash", {"command": command}).action == "ask"
    assert decide([RM_RULE], "bash", {"command": "rmdir -rf build"}).rule is None


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf dist",
        "rm -fr dist",
        "rm -r -f dist",
        "rm --recursive --force dist",
        "rm -R -f dist",
        "rm dist -rf",
        "rm -rf 'a b' \"c\"d e\\ f",
        "rm -rf ./dist/ dist//old",
        "rm -rf build/../dist",
        "rm -rf *.egg-info",
        "rm -rf -- -odd-name",
        'r""m -rf dist',
        "\\rm -rf dist",
        "/bin/rm -rf dist",
        "env rm -rf dist",
        "nice -n 5 rm -rf dist",
        "rm -rf dist # tidy",
    ],
)
def test_allow_similar_to_rm_rf_build_allows_the_same_command_on_workspace_paths(command):
    decision = decide([RM_RULE], "bash", {"command": command})
    assert (decision.action, decision.rule) == ("allow", RM_RULE)


def test_absolute_paths_inside_the_workspace_are_inside_when_decide_knows_it(tmp_path):
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    command = {"command": f"rm -rf {ws}/build"}
    assert decide([RM_RULE], "bash", command).action == "ask"  # no workspace: outside
    assert decide([RM_RULE], "bash", command, workspace=ws).action == "allow"
    assert decide([RM_RULE], "bash", {"command": f"rm -rf {ws}/../x"}, workspace=ws).action == (
        "ask"
    )
    assert classify_bash(f"cp a {ws}/b", workspace=ws) == []
    assert classify_bash(f"cp a {ws}/b") == ["writes outside the workspace"]


def test_a_symbolic_link_out_of_the_workspace_is_outside(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (ws / "door").symlink_to(tmp_path / "elsewhere")
    assert decide([RM_RULE], "bash", {"command": "rm -rf door/x"}, workspace=ws).action == "ask"
    assert classify_bash("echo x > door/y", workspace=ws) == ["writes outside the workspace"]


@pytest.mark.parametrize(
    ("command", "risk"),
    [
        ('r""m -rf /', "deletes widely"),
        ("'rm' -rf /", "deletes widely"),
        ("\\rm -rf /", "deletes widely"),
        ("command rm -rf /", "deletes widely"),
        ("env -i rm -rf /", "deletes widely"),
        ("exec rm -rf /", "deletes widely"),
        ("nice -n 10 rm -rf /", "deletes widely"),
        ("nohup rm -rf /", "deletes widely"),
        ("time rm -rf /", "deletes widely"),
        ("timeout 5 rm -rf /", "deletes widely"),
        ("/bin/rm -rf /", "deletes widely"),
        ("./x/../../bin/rm -rf /", "deletes widely"),
        ("rm -{r,f} x", "deletes widely"),
        ("rm --rec x", "deletes widely"),
        ("strace -f rm -rf /", "deletes widely"),
        ("echo $(rm -rf /)", "deletes widely"),
        ("f() { rm -rf /; }", "deletes widely"),
        ("git clean -fdx", "deletes widely"),
        ("c\\url https://example.com", "reaches the network"),
        ("'wget' x", "reaches the network"),
        ("/usr/bin/curl x", "reaches the network"),
        ("env curl x", "reaches the network"),
        ("echo `curl x`", "reaches the network"),
        ("cat <(curl x)", "reaches the network"),
        ("uv pip install x", "reaches the network"),
        ("pip --quiet install x", "reaches the network"),
        ("git -C src push", "reaches the network"),
        ("s\\udo ls", "changes permissions or the system"),
        ("chmod --recursive 777 .", "changes permissions or the system"),
        ("chmod -vR 777 .", "changes permissions or the system"),
        ("dd if=/dev/zero of=disk.img", "changes permissions or the system"),
        ('echo x > "/etc/motd"', "writes outside the workspace"),
        ("echo x > '/etc'/motd", "writes outside the workspace"),
        ("echo x >> ~/.profile", "writes outside the workspace"),
        ("echo x &> ../log", "writes outside the workspace"),
        ("cd /tmp && echo x > y", "writes outside the workspace"),
        ("cd .. && touch x", "writes outside the workspace"),
        ("mv /etc/hosts .", "writes outside the workspace"),
        ("ln -s / root", "writes outside the workspace"),
        ("cp -t /etc a", "writes outside the workspace"),
        ("cp a b /tmp", "writes outside the workspace"),
        ("tee -a /etc/x < a", "writes outside the workspace"),
        ("sed -i 's/a/b/' /etc/hosts", "writes outside the workspace"),
        ("tar -xzf a.tgz -C /", "writes outside the workspace"),
        ("find . -fprint /etc/x", "writes outside the workspace"),
        ("touch {a,/etc/x}", "writes outside the workspace"),
        ("$(echo rm) -rf /", "cannot be read plainly: the program is only known when it runs"),
        ("${X:-rm} -rf /", "cannot be read plainly: the program is only known when it runs"),
        ('eval "curl x"', "cannot be read plainly: eval runs text as commands"),
        ("sh -c 'curl x'", "cannot be read plainly: sh -c runs text as commands"),
        ("python3 -c 'import os'", "cannot be read plainly: python3 -c runs code given as text"),
        ("rm -rf $(cat list)", "cannot be read plainly: the arguments of rm are only known"),
        ("ls | xargs rm", "cannot be read plainly: the arguments of rm are only known"),
        ("echo x > $OUT", "cannot be read plainly: a redirection writes to $OUT"),
    ],
)
def test_the_classifier_reads_the_parsed_command(command, risk):
    risks = classify_bash(command)
    assert any(r.startswith(risk) for r in risks), risks


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "python3 -m pytest -q",
        "grep -rn foo src",
        "cat a.txt | wc -l",
        'echo "$(date +%s.%N) start" >> steps.log',
        "i=0; while [ ! -f go ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; echo ok",
        "python3 -m unittest -v 2>&1 && rm build.log",
        "cd src && make && cd .. && ls",
        "echo x > /dev/null 2>/dev/stderr",
        "find . -name '*.py' -exec grep -n TODO {} +",
        "git log --oneline | head -5",
        "source .venv/bin/activate && pytest -x",
        "cp -r src dist && mv dist/a dist/b",
        "mkdir -p build/out && touch build/out/.keep",
        "tar -czf out.tgz src",
        "sed -n '1,20p' src/app.py",
        "awk -F: '{ print $1 }' data.txt",
        "rm -- -odd",
        "which curl",
        "command -v wget",
    ],
)
def test_plain_contained_commands_stay_allowed(command):
    assert classify_bash(command) == []
    assert decide([], "bash", {"command": command}).action == "allow"


def test_similar_rules_have_a_shape_and_say_what_they_allow():
    assert RM_RULE == {
        "tool": "bash",
        "program": "rm",
        "flags": ["-f", "-r"],
        "paths": "workspace",
        "action": "allow",
        "note": "bash: runs `rm` with exactly the flags -f -r, any other argument a path inside "
        "the workspace (a plain name is one; a URL, ~ or a path leading out is not); nothing "
        "else chained, no redirection, substitution or variable, no sudo",
    }
    assert validate([RM_RULE]) == [RM_RULE]
    chmod = similar_rule("bash", {"command": "chmod -R u+w dist"})
    assert (chmod["program"], chmod["args"], chmod["flags"]) == ("chmod", ["u+w"], ["-R"])
    assert describe_rule(chmod).startswith("bash: runs `chmod u+w` with exactly the flags -R,")
    git = similar_rule("bash", {"command": "git clean -fd"})
    assert (git["args"], git["flags"]) == (["clean"], ["-d", "-f"])
    pip = similar_rule("bash", {"command": "pip install requests==2.0"})
    assert describe_rule(pip).startswith("bash: runs `pip install` with no flags, any other")
    curl = similar_rule("bash", {"command": "curl -s https://example.com/x"})
    assert (curl["args"], curl["paths"]) == (["https://example.com/x"], "none")
    assert "and no other arguments" in curl["note"]
    assert decide([curl], "bash", {"command": "curl -s https://example.com/x"}).action == "allow"
    assert decide([curl], "bash", {"command": "curl -s https://evil.example"}).action == "ask"
    assert decide([pip], "bash", {"command": "pip install https://evil/x.whl"}).action == "ask"
    assert decide([git], "bash", {"command": "git clean -df old"}).action == "allow"
    assert decide([git], "bash", {"command": "git clean -fd :/"}).action == "ask"
    assert describe_rule({"tool": "bash", "pattern": "^git push", "action": "ask"}) == (
        "bash: asks a person when the command matches /^git push/"
    )
    assert describe_rule({"tool": "*", "action": "allow"}) == "every tool: every call allowed"
    folder = similar_rule("write_file", {"path": "tests/unit/test_a.py"})
    assert folder["note"] == "write_file: allowed when the path matches /^tests/unit//"


def test_a_command_that_is_not_one_plain_command_is_allowed_again_only_as_it_was():
    approved = "python3 -m unittest -v 2>&1 && rm -rf build __pycache__"
    rule = similar_rule("bash", {"command": approved})
    assert "pattern" in rule and "program" not in rule
    assert rule["note"].startswith(f"bash: exactly `{approved}` again, character for character")
    opaque = "rm -rf $(cat list)"
    rule = similar_rule("bash", {"command": opaque})
    assert decide([rule], "bash", {"command": opaque}).action == "ask"  # the list may change
    assert rule["note"] == (
        "bash: exactly `rm -rf $(cat list)` again — but it cannot be read plainly: the "
        "arguments of rm are only known when it runs (command substitution), so it will still "
        "ask every time"
    )
    sudo = similar_rule("bash", {"command": "sudo rm -rf build"})
    assert "program" not in sudo


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"tool": "bash", "program": "rm", "action": "ask"}, "can only allow"),
        ({"tool": "write_file", "program": "rm", "action": "allow"}, "is for bash"),
        ({"tool": "bash", "program": "rm", "pattern": "x", "action": "allow"}, "is for bash"),
        ({"tool": "bash", "program": "/bin/rm", "action": "allow"}, "program name"),
        ({"tool": "bash", "flags": ["-r"], "action": "allow"}, "program name"),
        ({"tool": "bash", "program": "rm", "flags": "-rf", "action": "allow"}, "list of flags"),
        ({"tool": "bash", "program": "rm", "flags": ["r"], "action": "allow"}, "list of flags"),
        ({"tool": "bash", "program": "rm", "args": "x", "action": "allow"}, "list of strings"),
        ({"tool": "bash", "program": "rm", "paths": "any", "action": "allow"}, "paths must be"),
        ({"tool": "bash", "action": "allow", "note": 3}, "note must be a string"),
    ],
)
def test_bad_similar_rules_are_refused_clearly(rule, message):
    with pytest.raises(PolicyError, match=message):
        validate([rule])


def test_similar_rules_stored_by_earlier_versions_are_read_as_similar_rules():
    # What similar_rule("bash", {"command": "rm -rf build"}) returned before the parser.
    legacy = {
        "tool": "bash",
        "pattern": r"^\s*rm\s+\-rf(?!.*(?:\s|/)\.\.(?:/|\s|$))(?!.*\s[/~])"
        r"(?:\s+[^;&|`$()<>\n\\]*)?\s*$",
        "action": "allow",
    }
    rules = validate([legacy])
    assert decide(rules, "bash", {"command": "rm -rf dist"}).action == "allow"
    assert decide(rules, "bash", {"command": 'rm -rf "/somewhere"'}).action == "ask"
    assert decide(rules, "bash", {"command": "rm -rf -- /somewhere"}).action == "ask"
    assert describe_rule(legacy).startswith("bash: older allow-similar rule, read as: runs `rm`")


def test_an_allow_pattern_does_not_vouch_for_what_it_cannot_read():
    rules = validate([{"tool": "bash", "pattern": "^make", "action": "allow"}])
    assert decide(rules, "bash", {"command": "make test"}).action == "allow"
    assert decide(rules, "bash", {"command": "make test; eval $X"}).action == "ask"
    assert decide(rules, "bash", {"command": "make $(curl x)"}).action == "ask"
    assert decide(rules, "bash", {"command": "make; rm -rf ~"}).action == "ask"
    assert decide(rules, "bash", {"command": "make > /etc/x"}).action == "ask"
    pip = validate([{"tool": "bash", "pattern": "^pip install", "action": "allow"}])
    assert decide(pip, "bash", {"command": "pip install x | tee log"}).action == "allow"
    assert decide(pip, "bash", {"command": "pip install x && curl y"}).action == "ask"
    everything = validate([{"tool": "bash", "action": "allow"}])  # no pattern: the operator's call
    assert decide(everything, "bash", {"command": "eval $X"}).action == "allow"


def test_ask_and_deny_patterns_also_see_the_command_as_it_runs():
    rules = validate([{"tool": "bash", "pattern": r"^rm -rf", "action": "deny"}])
    for command in ('r""m -rf x', "\\rm -rf x", "env rm -rf x", "ls; 'rm' -rf x"):
        assert decide(rules, "bash", {"command": command}).action == "deny", command


# --- properties: generated commands with quoting and path tricks -------------------------------
# The generator makes each command from structured choices and knows from them, without the
# parser, what the command really does: which program runs, with which flags, on which paths.

PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
WS = posixpath.realpath(tempfile.gettempdir()) + "/shiftlog-policy-ws"  # never created

# Each program's flags: canonical name -> spellings (short ones may be clustered).
FLAG_SPELLINGS = {
    "rm": {
        "-r": ["-r", "-R", "--recursive"],
        "-f": ["-f", "--force"],
        "-v": ["-v", "--verbose"],
        "-d": ["-d", "--dir"],
    },
    "chmod": {"-R": ["-R", "--recursive"], "-v": ["-v", "--verbose"], "-c": ["-c", "--changes"]},
    "git": {"-f": ["-f", "--force"], "-d": ["-d"], "-x": ["-x"], "-n": ["-n", "--dry-run"]},
}
SEEDS = {
    "rm": ("rm -rf build", [], {"-r", "-f"}),
    "chmod": ("chmod -R u+w dist", ["u+w"], {"-R"}),
    "git": ("git clean -fd", ["clean"], {"-f", "-d"}),
}
LEADING = {"rm": [[]], "chmod": [["u+w"], ["777"], ["go-w"]], "git": [["clean"], ["status"]]}


@st.composite
def program_text(draw, name: str, *, tricky: bool = True):
    """(text, plain): the program spelled some way; plain when it runs `name` itself."""
    spellings = [
        name,
        f"'{name}'",
        f'"{name}"',
        f'{name[0]}""{name[1:]}',
        f'"{name[0]}"{name[1:]}',
        "\\" + name,
        f"{name[0]}\\{name[1:]}",
        f"/bin/{name}",
        f"/usr/bin/{name}",
        f"./x/../../bin/{name}",
    ]
    text = draw(st.sampled_from(spellings))
    wrappers = draw(
        st.lists(
            st.sampled_from(["command", "env", "exec", "nice", "nohup", "time", "timeout 5"]),
            max_size=2,
        )
    )
    plain = True
    if tricky:
        twist = draw(st.sampled_from(["", "", "", "sudo", "subst", "backquote", "var", "ansi"]))
        if twist == "sudo":
            wrappers.insert(0, "sudo")
            plain = False
        elif twist:
            text = {
                "subst": f"$(echo {name})",
                "backquote": f"`echo {name}`",
                "var": '"$P"',
                "ansi": f"$'{name}'",
            }[twist]
            plain = False
    return " ".join([*wrappers, text]), plain


@st.composite
def path_operand(draw, *, tricky: bool = True):
    """(text, values, known): an operand and every path the shell may make of it, as
    (start, parts) with start "ws", "/" or "home" and parts (name, may_be_dotdot)."""
    prefixes = {  # text: (start, parts, its text inside a word that sh leaves unexpanded)
        "": ("ws", [], ""),
        "./": ("ws", [], "./"),
        f"{WS}/": ("ws", [], f"{WS}/"),
        '"$PWD"/': ("ws", [], f"{WS}/"),
        "'~'/": ("ws", [("~", False)], "~/"),
        "'$HOME'/": ("ws", [("$HOME", False)], "$HOME/"),
        "/": ("/", [], "/"),
        "//": ("/", [], "//"),
        "/tmp/": ("/", [("tmp", False)], "/tmp/"),
        "~/": ("home", [], "~/"),
        "$HOME/": ("home", [], "/home/agent/"),
        '"$HOME"/': ("home", [], "/home/agent/"),
    }
    prefix = draw(st.sampled_from(list(prefixes)))
    start, parts, literal = prefixes[prefix][0], list(prefixes[prefix][1]), prefixes[prefix][2]
    pieces = []
    names = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["build", "dist", "a b", "..", ".", "*", "x*", ".*", "-x"]))
        if name == "-x" and not pieces and not prefix:
            name = "x-"  # a first word starting with - would be a flag, not a path
        quote = draw(st.sampled_from(["raw", "single", "double", "split", "backslash"]))
        if quote == "raw" and " " in name:
            quote = "single"
        raw = {  # the part left unquoted, where * is a glob
            "raw": name,
            "single": "",
            "double": "",
            "split": name[2:],
            "backslash": "",
        }[quote]
        pieces.append(
            {
                "raw": name,
                "single": f"'{name}'",
                "double": f'"{name}"',
                "split": f'"{name[:2]}"{name[2:]}',
                "backslash": "".join("\\" + c for c in name),
            }[quote]
        )
        parts.append((name, "*" in raw and name.startswith(".")))
        names.append(name)
    joiner = draw(st.sampled_from(["/", "/", "//"]))
    trailing = draw(st.sampled_from(["", "/"]))
    text = prefix + joiner.join(pieces) + trailing
    values = [(start, parts)]
    if tricky:
        twist = draw(st.sampled_from(["", "", "", "", "brace", "var", "subst"]))
        if twist == "brace":
            other = draw(st.sampled_from(["/etc", "..", "../x", "~", "dist"]))
            text = "{" + text + "," + other + "}"
            start2 = "home" if other == "~" else ("/" if other.startswith("/") else "ws")
            values.append((start2, [(p, False) for p in other.strip("/~").split("/") if p]))
            # sh does not expand braces: the word itself is a relative path starting with {
            word = "{" + literal + joiner.join(names) + trailing + "," + other + "}"
            values.append(("ws", [(p, p.startswith(".") and "*" in p) for p in word.split("/")]))
        elif twist:
            return ('"$X"' if twist == "var" else "$(echo build)"), [], False
    return text, values, True


def truly_inside(start: str, parts: list[tuple[str, bool]]) -> bool:
    """Where the shell would really land, by posixpath: ~ is a home folder, never the workspace;
    a glob starting with . may match `..`."""
    if start == "home":
        return False
    path = WS if start == "ws" else "/"
    for name, may_be_dotdot in parts:
        path = posixpath.join(path, ".." if may_be_dotdot else name)
    path = posixpath.normpath(path)
    return path == WS or path.startswith(WS + "/")


@st.composite
def generated_command(draw, program: str, *, tricky: bool = True):
    """A command line and what it truly is: (text, truth) with truth the facts the property
    checks, computed from the choices made here."""
    name = "rm" if program == "rm" else program
    if program == "rm" and tricky:
        name = draw(st.sampled_from(["rm", "rm", "rm", "rmdir", "shred"]))
    prog_text, plain = draw(program_text(name, tricky=tricky))
    spellings = FLAG_SPELLINGS[program]
    chosen = draw(st.sets(st.sampled_from(sorted(spellings)), max_size=3))
    tokens: list[str] = []
    shorts = []
    for flag in sorted(chosen):
        spelled = draw(st.sampled_from(spellings[flag]))
        (shorts if len(spelled) == 2 else tokens).append(spelled)
    while shorts:  # clusters of any size, any order
        size = draw(st.integers(1, len(shorts)))
        cluster = draw(st.permutations(shorts[:size]))
        tokens.append("-" + "".join(s[1] for s in cluster))
        shorts = shorts[size:]
    tokens = draw(st.permutations(tokens))
    leading = draw(st.sampled_from(LEADING[program]))
    operands = draw(st.lists(path_operand(tricky=tricky), min_size=0, max_size=3))
    dashdash = draw(st.booleans())
    after = draw(st.booleans()) and program != "git" and not dashdash  # GNU reads flags late
    words = [prog_text]
    if program == "git":
        words += leading + list(tokens)
    else:
        words += ([] if after else list(tokens)) + leading
    words += ["--"] if dashdash else []
    words += [text for text, _, _ in operands]
    words += list(tokens) if after else []
    tail = ""
    if tricky:
        tail = draw(
            st.sampled_from(
                [
                    *("", "", "", " # note", "; curl x", " && ls", " | cat", " > /dev/null"),
                    *(" > out.txt", " 2>&1", " $(true)", " &", "\nls", " <<< x"),
                ]
            )
        )
    truth = {
        "program": name if plain else None,
        "flags": set(chosen),
        "leading": leading,
        "inside": all(
            known and all(truly_inside(*v) for v in values) for _, values, known in operands
        ),
        "known": all(known for _, _, known in operands),
        "alone": tail in ("", " # note"),
    }
    return " ".join(words) + tail, truth


def seed_rule(program: str) -> dict:
    return similar_rule("bash", {"command": SEEDS[program][0]})


def allowed_by_the_rule(truth: dict, program: str) -> bool:
    _, leading, flags = SEEDS[program]
    return (
        truth["program"] == program
        and truth["flags"] == flags
        and truth["leading"] == leading
        and truth["inside"]
        and truth["alone"]
    )


@pytest.mark.parametrize("program", sorted(SEEDS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_an_allow_similar_rule_never_allows_another_program_other_flags_or_a_path_outside(
    program, data
):
    text, truth = data.draw(generated_command(program))
    decision = decide([seed_rule(program)], "bash", {"command": text}, workspace=WS)
    if decision.rule is not None:
        assert allowed_by_the_rule(truth, program), (text, truth, decision)
    if decision.action == "allow":  # by the rule, or because the classifier saw no risk
        assert truth["program"] is not None, (text, decision)
        assert truth["inside"] or program == "git", (text, truth, decision)


@pytest.mark.parametrize("program", sorted(SEEDS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_an_allow_similar_rule_allows_every_plain_spelling_of_the_same_command(program, data):
    text, truth = data.draw(generated_command(program, tricky=False))
    decision = decide([seed_rule(program)], "bash", {"command": text}, workspace=WS)
    if allowed_by_the_rule(truth, program):
        assert (decision.action, decision.rule) == ("allow", seed_rule(program)), (text, truth)
    else:
        assert decision.rule is None, (text, truth, decision)


RISKY = [
    ("rm", "deletes widely"),
    ("curl", "reaches the network"),
    ("wget", "reaches the network"),
    ("ssh", "reaches the network"),
    ("sudo", "changes permissions or the system"),
    ("chmod", "changes permissions or the system"),
    ("git", "reaches the network"),
]


@st.composite
def risky_command(draw):
    program, risk = draw(st.sampled_from(RISKY))
    prog_text, plain = draw(program_text(program))
    words = [prog_text]
    if program == "rm":
        words.append(draw(st.sampled_from(["-r", "-f", "-rf", "-fr", "-Rv", "--recursive"])))
        words.append(draw(st.sampled_from(["--force", "-v", "-i", ""])))
    elif program == "chmod":
        words += [draw(st.sampled_from(["-R", "-vR", "--recursive"])), "u+w"]
    elif program == "git":
        words += [draw(st.sampled_from(["", "-C src", "--no-pager"])), "push"]
    elif program == "sudo":
        words.append(draw(st.sampled_from(["ls", "-u root ls", "-i", "true"])))
    else:
        words.append(draw(st.sampled_from(["https://example.com", "host", "-s x"])))
    words += [text for text, _, _ in draw(st.lists(path_operand(), max_size=2))]
    tail = draw(st.sampled_from(["", " && ls", " | cat", " > out.txt", " # x", "; true"]))
    return " ".join(w for w in words if w) + tail, risk, plain


@PROPERTY_SETTINGS
@given(risky_command(), st.sampled_from([None, WS]))
def test_a_risky_program_is_never_classified_safe_however_it_is_written(generated, workspace):
    text, risk, plain = generated
    risks = classify_bash(text, workspace=workspace)
    assert risks, text
    if plain:
        assert risk in risks, (text, risks)
    else:
        assert risk in risks or any(r.startswith("cannot be read plainly") for r in risks)
