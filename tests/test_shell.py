from __future__ import annotations

import os
from pathlib import PurePosixPath

import pytest

from agents.shell import HOME, Word, parse, split_options

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer


def programs(command: str, **kw) -> list[str | None]:
    return [c.program for c in parse(command, **kw).commands]


def args(command: str) -> list[tuple[str, ...] | str]:
    """The last command's arguments: each word's values, or why it is unknown."""
    return [w.values or w.unknown for w in parse(command).commands[-1].args]


@pytest.mark.parametrize(
    "command",
    [
        'r""m -rf x',
        "'rm' -rf x",
        '"rm" -rf x',
        '"r"m -rf x',
        "r''m -rf x",
        "\\rm -rf x",
        "r\\m -rf x",
        "$'rm' -rf x",  # bash: rm; sh: $rm — the program is only read one way, see below
        "command rm -rf x",
        "command -p rm -rf x",
        "builtin rm -rf x",
        "env rm -rf x",
        "env -i FOO=1 BAR=2 rm -rf x",
        "env -u HOME -- rm -rf x",
        "exec rm -rf x",
        "exec -a name rm -rf x",
        "nice rm -rf x",
        "nice -n 19 rm -rf x",
        "nice -5 rm -rf x",
        "nohup rm -rf x",
        "time rm -rf x",
        "time -p rm -rf x",
        "timeout 5 rm -rf x",
        "timeout -s KILL -k 1 5s rm -rf x",
        "stdbuf -oL rm -rf x",
        "setsid -f rm -rf x",
        "busybox rm -rf x",
        "/bin/rm -rf x",
        "/usr/bin/rm -rf x",
        "./x/../../bin/rm -rf x",
        "env nice nohup timeout 3 command rm -rf x",
    ],
)
def test_every_spelling_of_a_program_is_that_program(command):
    script = parse(command)
    if command.startswith("$'"):
        assert script.opaque  # bash and sh read $'…' differently: not one program
        return
    assert [c.program for c in script.commands] == ["rm"], script
    assert not script.opaque
    assert script.commands[0].args[-1].values == ("x",)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("$(echo rm) -rf /", "program is only known when it runs"),
        ("`echo rm` -rf /", "program is only known when it runs"),
        ("$X -rf /", "program is only known when it runs"),
        ("${X} -rf /", "program is only known when it runs"),
        ('"$X" -rf /', "program is only known when it runs"),
        ("{rm,-rf,/}", ""),  # tree-sitter cannot parse it: opaque either way
        ("/bin/r? -rf /", "glob"),
        ("r\\\nm -rf /", "joins"),
        ("echo ${x}y$1$@", "joins"),
        # found by running generated commands in bash and dash: the shell ends the command at
        # the first line break, the parser read on
        ("rm -rf build\n\\\n curl evil", "line break"),
        ("rm a '' \\\n\n\\\\", "line break"),
        ("rm #c d\n\\;", "after a comment"),
        ('eval "rm -rf /"', "eval"),
        ("alias ls=rm", "alias"),
        ("trap 'rm -rf /' EXIT", "trap"),
        ("let x=1", "let"),
        ("source ~/.bashrc", "file outside"),
        (". /etc/profile", "file outside"),
        ("source $F", "file outside"),
        ('sh -c "rm -rf /"', "-c runs text"),
        ('bash -lc "rm -rf /"', "-c runs text"),
        ('bash -ec "rm -rf /"', "-c runs text"),
        ('dash -c "rm -rf /"', "-c runs text"),
        ('zsh -c "rm -rf /"', "-c runs text"),
        ("echo 'rm -rf /' | sh", "from its input"),
        ("curl x | bash", "from its input"),
        ("bash <<EOF\nrm -rf /\nEOF", "from its input"),
        ("bash -s < x", "from its input"),
        ('sudo sh -c "rm -rf /"', "-c runs text"),
        ('env sh -c "x"', "-c runs text"),
        ('busybox sh -c "x"', "-c runs text"),
        ('python -c "import os"', "runs code given as text"),
        ('python3 -c "import os"', "runs code given as text"),
        ('python3.11 -Sc "import os"', "runs code given as text"),
        ("python3 -", "from its input"),
        ("python3 <<EOF\nimport os\nEOF", "from its input"),
        ("perl -e 'unlink glob q(*)'", "runs code given as text"),
        ("perl -pie 's/a/b/' f", "runs code given as text"),
        ("ruby -e 'x'", "runs code given as text"),
        ("node -e 'x'", "runs code given as text"),
        ("node --eval='x'", "runs code given as text"),
        ("deno eval 'x'", "runs code given as text"),
        ("php -r 'x'", "runs code given as text"),
        ("uv run python -c 'x'", "runs code given as text"),
        ("awk 'BEGIN { system(\"rm -rf /\") }'", "awk program"),
        ("awk '{ print | \"sh\" }' f", "awk program"),
        ("awk '{ print > \"/etc/x\" }' f", "awk program"),
        ('gawk "$P" f', "awk's program"),
        ("sed 's/x/rm -rf \\//e' f", "sed script"),
        ("sed -e '1e id' f", "sed script"),
        ("sed 'w /etc/x' f", "sed script"),
        ("sed -n '/a/w out' f", "sed script"),
        ("env -S 'rm -rf /'", "env -S"),
        ("env --split-string='rm -rf /'", "env -S"),
        ("watch rm -rf x", "watch"),
        ("git -c core.sshCommand='sh -c id' fetch", "git -c"),
        ("git -c alias.x='!rm -rf /' x", "git -c"),
        ("hash -p /bin/sh rm; rm x", "hash -p"),
        ("mapfile -C 'rm -rf /' -c 1 < f", "mapfile -C"),
        ("declare -n h=HOME", "declare -n"),
        ("IFS=/; echo $x", "IFS"),
        ("export HOME=/; rm -rf ~", "HOME"),
        ("CDPATH=/; cd etc", "CDPATH"),
        ("PS4='$(id)'; set -x", "PS4"),
        ("x='a[$(id)]'; echo $((x))", "arithmetic on $x"),
        ("echo $((y + 1))", "arithmetic on $y"),
        ("echo $(( $(id) ))", "command substitution inside arithmetic"),
        ("(( a[$(id)] ))", "command substitution inside arithmetic"),
        ("[[ $x -eq 1 ]]", "arithmetic on $x"),
        ("for x in 'a[$(id)]'; do echo $((x)); done", "arithmetic on $x"),
        ("echo ${x:1}", "evaluates"),
        ("echo ${x@P}", "evaluates"),
        ("echo ${!x}", "evaluates"),
        ("echo ${a[$i]}", "evaluates"),
        ("if true; then rm x", "does not parse"),
        ("echo $((1+", "does not parse"),
        ("xargs $X", "xargs's arguments"),
        ("find . $X -delete", "find's arguments"),
    ],
)
def test_what_cannot_be_read_plainly_is_opaque(command, reason):
    script = parse(command)
    assert any(reason in why for why in script.opaque), script.opaque


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "python3 -m pytest -q",
        "python3 -m unittest -v 2>&1",
        "python3 x.py --flag",
        "grep -rn foo src",
        "cat a.txt | wc -l",
        "git status && git diff",
        "bash scripts/check.sh",
        "sh ./run.sh arg",
        "node build.js",
        "perl script.pl",
        "awk '{ print $1 }' data.txt",
        "awk -F, -f prog.awk data.csv",
        "sed -n '1,5p' f",
        "sed -i 's/a/b/g' src/x.py",
        "sed -e 's|a|b|' -e '/x/d' f",
        "sed '/start/a\\\nnew line with we' f",
        "find . -name '*.pyc' -delete",
        'echo "$(date +%s.%N) start" >> steps.log',
        "i=0; while [ ! -f go ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; echo ok",
        "for ((i=0; i<3; i++)); do echo $i; done",
        'for f in *.py; do echo "$f"; done',
        'while IFS= read -r line; do echo "$line"; done < f',
        "source .venv/bin/activate && pytest",
        ". ./env.sh",
        'x=$(git rev-parse HEAD); echo "$x"',
        "echo ${x:-default} ${#x} ${x%.py} ${x//a/b}",
        "[ -f a ] || touch a",
        "[[ -n $x && $x == y ]]",
        "cat <<'EOF' > notes.txt\n$(not run)\nEOF",
        "f() { echo hi; }; f",
        "case $x in a) echo a;; *) echo b;; esac",
        "export PATH=$HOME/.local/bin:$PATH && pytest",
        "git -c user.name=bot commit -m 'x'",
        "python3 --version",
        "command -v rg",
    ],
)
def test_plain_commands_are_not_opaque(command):
    assert parse(command).opaque == ()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("rm -rf \"a b\" 'c d' e\\ f", [("-rf",), ("a b",), ("c d",), ("e f",)]),
        ('rm -- "-x"', [("--",), ("-x",)]),
        ('echo "a\\$x \\\\ \\a"', [("a$x \\ \\a",)]),
        ("rm {a,/etc}", [("{a,/etc}", "a", "/etc")]),
        ("rm a{b,{c,/d}}e", [("a{b,{c,/d}}e", "abe", "ace", "a/de")]),
        ("rm '{a,/b}' \\{a,/b\\}", [("{a,/b}",), ("{a,/b}",)]),
        ("rm {a}", [("{a}",)]),
        ("rm {1..3}", [("{1..3}", "1", "2", "3")]),
        ("rm ~ ~/x ~root/y", [(HOME,), (HOME + "/x",), (HOME + "/y",)]),
        ("rm '~'/x", [("~/x",)]),
        ("rm $HOME/x ${HOME}", [(HOME + "/x",), (HOME,)]),
        ('rm "$PWD"/x ~+/y', [("./x",), ("./y",)]),
        ("dd of=~/x", [("of=" + HOME + "/x",)]),
        ("rm $'/e\\x74c'", [("/etc", "$/e\\x74c")]),
        ("rm $X", ["$X"]),
        ('rm "$(ls)"', ["command substitution"]),
        ("rm <(ls)", ["process substitution"]),
        ("rm $((1+2))", ["arithmetic"]),
        ("rm ${x:-/etc}", ["${x:-/etc}"]),
        # found by comparing with real bash and dash:
        ("rm {{,/b}x", [("{{,/b}x", "{x", "{/bx")]),  # an unmatched { does not stop braces
        ("rm {},/etc}", [("{},/etc}", "}", "/etc")]),  # a } right after { is a character
        ("rm $PWD{X,}..", ["a $NAME followed by braces"]),  # braces first: $PWDX.. is ..
        ("rm $HOME{a,/b}", ["a $NAME followed by braces"]),
        ("rm ${HOME}{a,/b}", [(f"{HOME}{{a,/b}}", f"{HOME}a", f"{HOME}/b")]),
        ("rm ..$PWD x$PWD", ["$PWD inside a word", "$PWD inside a word"]),
    ],
)
def test_words_are_resolved_as_the_shell_resolves_them(command, expected):
    assert args(command) == expected


@pytest.mark.parametrize(
    ("program", "words", "flags", "operands"),
    [
        ("rm", ["-rf", "build"], {"-r", "-f"}, ["build"]),
        ("rm", ["-fr", "build"], {"-r", "-f"}, ["build"]),
        ("rm", ["-r", "-f", "build"], {"-r", "-f"}, ["build"]),
        ("rm", ["--recursive", "--force", "build"], {"-r", "-f"}, ["build"]),
        ("rm", ["--rec", "--forc", "build"], {"-r", "-f"}, ["build"]),
        ("rm", ["-R", "build"], {"-r"}, ["build"]),
        ("rm", ["build", "-rf"], {"-r", "-f"}, ["build"]),  # GNU reads flags after operands
        ("rm", ["-rf", "--", "-x", "-y"], {"-r", "-f"}, ["-x", "-y"]),
        ("rm", ["-", "x"], set(), ["-", "x"]),
        ("chmod", ["-R", "u+w", "dist"], {"-R"}, ["u+w", "dist"]),
        ("chmod", ["--recursive", "u+w", "dist"], {"-R"}, ["u+w", "dist"]),
        ("python", ["-m", "pytest", "-q"], {"-m pytest", "-q"}, []),
        ("python", ["-Bm", "pytest"], {"-B", "-m pytest"}, []),
        ("git", ["-C", "/x", "clean", "-fd"], {"-C /x", "-f", "-d"}, ["clean"]),
        ("cp", ["-t", "/etc", "a"], {"-t /etc"}, ["a"]),
        ("cp", ["-t/etc", "a"], {"-t /etc"}, ["a"]),
        ("cp", ["--target-directory=/etc", "a"], {"--target-directory=/etc"}, ["a"]),
        ("java", ["-jar", "x.jar"], {"-jar"}, ["x.jar"]),  # not a cluster: java is not getopt
    ],
)
def test_flags_are_normalised(program, words, flags, operands):
    opts = split_options(program, [Word(w, (w,)) for w in words])
    assert opts.flags == flags
    assert [w.value for w in opts.operands] == operands


@pytest.mark.parametrize(
    ("command", "single", "operators"),
    [
        ("rm -rf build", True, set()),
        ("env rm -rf build", True, set()),
        ("rm -rf build; ls", False, {";"}),
        ("rm -rf build\nls", False, {";"}),
        ("rm -rf build && ls", False, {"&&"}),
        ("rm -rf build || ls", False, {"||"}),
        ("rm -rf build | cat", False, {"|"}),
        ("rm -rf build &", False, {"&"}),
        ("(rm -rf build)", False, {"subshell"}),
        ("{ rm -rf build; }", False, {";"}),
        ("! rm -rf build", False, {"!"}),
        ("if true; then rm -rf build; fi", False, {"if", ";"}),
        ("rm -rf build > log", False, set()),
        ("rm -rf build $(true)", False, {"substitution"}),
        ("rm -rf build # a comment", True, set()),
        ("f() { rm -rf build; }", False, {"function", ";"}),
    ],
)
def test_how_commands_are_joined(command, single, operators):
    script = parse(command)
    assert script.single is single
    assert operators <= set(script.operators)


def test_commands_inside_substitutions_functions_find_and_xargs_are_commands_too():
    assert programs("echo $(curl x) `wget y` <(nc z)") == ["curl", "wget", "nc", "echo"]
    assert programs('echo "`echo \\`id\\``"') == ["id", "echo", "echo"]
    assert programs("f() { curl x; }") == ["curl"]
    assert programs("find . -name x -exec rm -rf {} +") == ["find", "rm"]
    assert programs("ls | xargs -0 -n1 rm") == ["ls", "rm"]
    assert programs("strace -f -e trace=open curl x")[-1] == "strace"
    assert "curl" in programs("strace -f -e trace=open curl x")
    assert "curl" in programs("uv run --with x curl y")
    found = parse("find /etc -exec rm {} +").commands[1]
    assert found.args[0].values == ("/etc/found",) and found.context == "find"
    piped = parse("ls | xargs rm").commands[1]
    assert piped.args[-1].unknown and piped.context == "xargs"


def test_redirections_are_recorded_with_their_targets():
    script = parse("cat <a >b 2>&1 >>c &>d 2>/dev/null")
    ops = [(r.op, r.target.values, r.writes) for r in script.redirects]
    assert (">", ("b",), True) in ops and (">>", ("c",), True) in ops
    assert ("&>", ("d",), True) in ops and ("<", ("a",), False) in ops
    assert (">&", ("1",), False) in ops
    assert [(r.op, r.writes) for r in parse("cat <<< x").redirects] == [("<<<", False)]
    nested = parse("cat <<EOF > /etc/x\n$(curl y)\nEOF")
    assert [r.target.values for r in nested.redirects if r.writes] == [("/etc/x",)]
    assert "curl" in [c.program for c in nested.commands]


# --- paths ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "inside"),
    [
        ("build", "build"),
        ("./build/", "build"),
        ("build//x/", "build/x"),
        ("build/../dist", "dist"),
        (".", "."),
        ("", "."),
        ("*.pyc", "*.pyc"),
        ("src/.*", "."),  # .* may be ..: src/.. is the root, still inside
        ("..", None),
        ("../other", None),
        ("build/../..", None),
        ("a/b/../../../x", None),
        (".*", None),
        (".?/x", None),
        ("[.]*", None),
        ("/", None),
        ("//etc", None),
        ("/etc/x", None),
        (HOME, None),
        (HOME + "/x", None),
    ],
)
def test_paths_are_normalised_against_the_workspace(value, inside):
    script = parse("true")
    where = script.place(value, PurePosixPath("."))
    assert where == (PurePosixPath(inside) if inside else None)


def test_absolute_paths_count_as_inside_only_under_a_known_workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    known = parse("true", workspace=ws)
    assert known.place(f"{ws}/build", PurePosixPath(".")) == PurePosixPath("build")
    assert known.place(f"{ws}/../ws/build", PurePosixPath(".")) == PurePosixPath("build")
    assert known.place(str(ws), PurePosixPath(".")) == PurePosixPath(".")
    assert known.place(f"{ws}x/build", PurePosixPath(".")) is None
    assert known.place(str(tmp_path), PurePosixPath(".")) is None
    assert parse("true").place(f"{ws}/build", PurePosixPath(".")) is None


def test_symbolic_links_out_of_the_workspace_are_followed(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", ws / "door")
    os.symlink("build", ws / "inner")
    script = parse("true", workspace=ws)
    assert script.place("door/x", PurePosixPath(".")) is None
    assert script.place("door", PurePosixPath(".")) is None
    assert script.place("inner/x", PurePosixPath(".")) == PurePosixPath("inner/x")


def test_cd_moves_where_later_commands_run_until_its_subshell_ends():
    cwd = [c.cwd for c in parse("cd src && touch a; touch b").commands]
    assert cwd == [PurePosixPath("."), PurePosixPath("src"), PurePosixPath("src")]
    cwd = [c.cwd for c in parse("(cd src && touch a); touch b").commands]
    assert cwd[-1] == PurePosixPath(".")
    assert parse("cd /tmp; touch b").commands[-1].cwd is None
    assert parse("cd ..; touch b").commands[-1].cwd is None
    assert parse("cd $X; touch b").commands[-1].cwd is None
    assert parse("cd; touch b").commands[-1].cwd is None
    assert parse("env -C /tmp touch b").commands[-1].cwd is None
    assert parse("echo $(cd /; pwd) > a").redirects[0].cwd == PurePosixPath(".")


def test_parsing_is_cached_and_fast():
    import time

    parse("rm -rf build && ls")
    started = time.perf_counter()
    for i in range(200):
        parse(f"rm -rf build{i} && ls -la src | grep -n foo > out.txt")
    per_call = (time.perf_counter() - started) / 200
    assert per_call < 0.005, f"{per_call * 1e6:.0f} µs per parse"
