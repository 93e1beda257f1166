"""One simple command: its program found under its wrappers (`env`, `sudo`, `timeout`, …;
`xargs` and `find -exec` run commands of their own), and what it does to the reading of the rest
(`cd`, `source`, and the builtins and programs that cannot be read plainly).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from agents.shell.data import Word
from agents.shell.opaque import _awk, _git, _interpreter_given_code, _sed, _shell_given_code
from agents.shell.paths import _GLOB, HOME, _place
from agents.shell.programs import (
    _RUNNERS,
    _WRAPPERS,
    AWKS,
    GENERIC_WRAPPERS,
    INTERPRETERS,
    OPAQUE_PROGRAMS,
    SHELLS,
)
from agents.shell.script import Command
from agents.shell.state import _State


def _simple(
    words: list[Word],
    state: _State,
    *,
    source: str,
    context: str = "",
    assigns: list[str] | None = None,
) -> None:
    """Record one simple command (and the commands it runs), unwrapping its program."""
    context = context or state.context
    assigns = list(assigns or [])
    cwd = state.cwd
    wrappers: list[str] = []
    while words:
        head = words[0]
        name = head.value
        why = ""
        if name is None:
            why = "the program is only known when it runs" + (
                f" ({head.unknown})"
                if head.unknown
                else " (it has several readings: braces, or $'…' that bash and sh read apart)"
            )
        elif _GLOB.search(name):
            why = "the program name is a glob"
        if why:
            state.unreadable(why)
            unknown = Command(None, tuple(words[1:]), tuple(wrappers), cwd, (), source, context)
            state.commands.append(unknown)  # its wrappers (sudo) still count
            return
        program = name.rsplit("/", 1)[-1] if "/" in name.rstrip("/") else name
        program = program.replace(HOME, "~")
        rest = words[1:]
        unwrapped = _unwrap(program, rest, state, assigns)
        if unwrapped is None:
            break
        wrappers.append(program)
        words, chdir = unwrapped
        if words is _GAVE_UP:  # its options could not be read: what it runs is unknown
            unknown = Command(None, tuple(rest), tuple(wrappers), cwd, (), source, context)
            state.commands.append(unknown)
            return
        if chdir is not _SAME:
            cwd = chdir
    else:
        return  # a wrapper alone: `nohup`, `exec` with redirections only
    command = Command(
        program=program,
        args=tuple(words[1:]),
        wrappers=tuple(wrappers),
        cwd=cwd,
        source=source,
        context=context,
        assigns=tuple(assigns),
    )
    state.commands.append(command)
    _understand(command, state)


_SAME = object()  # a wrapper that leaves where the command runs as it was
_GAVE_UP: list[Word] = []  # a wrapper whose options could not be read (compared by identity)


def _unwrap(
    program: str, rest: list[Word], state: _State, assigns: list[str]
) -> tuple[list[Word], Any] | None:
    """If `program` only runs the rest: the rest as a command, and where it runs (a path, None
    when unknown, or _SAME). None when `program` is not a wrapper."""
    if program == "env":
        return _env(rest, state, assigns)
    if program == "xargs":
        _xargs(rest, state)
        return [], _SAME
    if program == "command" and any(
        re.fullmatch(r"-p?[vV]p?", w.value or "") for w in _leading_options(rest)
    ):
        return None  # `command -v x` asks about x, it does not run it
    if program in GENERIC_WRAPPERS:
        for i, word in enumerate(rest):
            if word.value is None or not word.value.startswith("-"):
                _simple(rest[i:], state, source=" ".join(w.source for w in rest[i:]))
        return None
    if program in _RUNNERS and rest and rest[0].value in ("run", "exec", "x"):
        tail = rest[1:]
        for i, word in enumerate(tail):
            if word.value is None or not word.value.startswith("-"):
                _simple(tail[i:], state, source=" ".join(w.source for w in tail[i:]))
        return None
    spec = _WRAPPERS.get(program)
    if spec is None:
        return None
    plain, valued, long_valued = spec
    i = 0
    cwd_change: Any = _SAME
    while i < len(rest):
        text = rest[i].value
        if text is None:
            state.unreadable(f"{program}'s arguments are only known when it runs")
            return _GAVE_UP, _SAME
        if text == "--":
            i += 1
            break
        if not text.startswith("-") or text == "-":
            break
        i += 1
        if text.startswith("--"):
            name = text.split("=", 1)[0]
            if name in long_valued and "=" not in text:
                i += 1
            if name == "--chdir":
                cwd_change = _cd_target(
                    text.split("=", 1)[1] if "=" in text else _value(rest, i - 1), state
                )
            continue
        if program == "nice" and re.fullmatch(r"-\d+", text):
            continue
        for j, letter in enumerate(text[1:], start=1):
            if letter in valued:
                if j == len(text) - 1:
                    if letter == "D" and program == "sudo":
                        cwd_change = _cd_target(_value(rest, i), state)
                    i += 1
                break
            if letter not in plain:
                state.unreadable(f"an option of {program} this reader does not know ({text})")
                return _GAVE_UP, _SAME
    if program == "timeout" and i < len(rest):
        i += 1  # the duration
    if program in ("sudo", "doas") and i >= len(rest):
        return [Word("sh", ("sh",)), Word("-s", ("-s",))], _SAME  # a root shell
    return rest[i:], cwd_change


def _leading_options(words: list[Word]) -> list[Word]:
    """The words before the first that is not an option."""
    for i, word in enumerate(words):
        if word.value is None or not word.value.startswith("-") or word.value in ("-", "--"):
            return words[:i]
    return words


def _value(words: list[Word], i: int) -> str | None:
    return words[i].value if i < len(words) else None


def _env(rest: list[Word], state: _State, assigns: list[str]) -> tuple[list[Word], Any]:
    i = 0
    cwd: Any = _SAME
    while i < len(rest):
        text = rest[i].value
        if text is None:
            state.unreadable("env's arguments are only known when it runs")
            return _GAVE_UP, _SAME
        if text in ("-S", "--split-string") or text.startswith(("-S", "--split-string=")):
            state.unreadable("env -S splits text into a command")
            return _GAVE_UP, _SAME
        if text in ("-u", "--unset", "-C", "--chdir"):
            if text in ("-C", "--chdir"):
                cwd = _cd_target(_value(rest, i + 1), state)
            i += 2
            continue
        if text.startswith(("-C", "--chdir=")):
            cwd = _cd_target(text[2:] if text.startswith("-C") else text.split("=", 1)[1], state)
            i += 1
            continue
        if text == "--":
            i += 1
            continue
        if text.startswith("-") and text != "-":
            if not re.fullmatch(r"-[i0v]+|--(ignore-environment|null|debug)|-u.+|--unset=.*", text):
                state.unreadable(f"an option of env this reader does not know ({text})")
                return _GAVE_UP, _SAME
            i += 1
            continue
        if "=" in text and re.fullmatch(r"[A-Za-z_]\w*", text.split("=", 1)[0]):
            assigns.append(text.split("=", 1)[0])
            i += 1
            continue
        break
    return rest[i:], cwd


def _xargs(rest: list[Word], state: _State) -> None:
    i = 0
    replace = None
    while i < len(rest):
        text = rest[i].value
        if text is None:
            state.unreadable("xargs's arguments are only known when it runs")
            return
        if text == "--":
            i += 1
            break
        if not text.startswith("-") or text == "-":
            break
        i += 1
        if text.startswith("--"):
            if text in ("--arg-file", "--delimiter", "--eof", "--max-lines", "--max-args"):
                i += 1
            if text.startswith("--replace"):
                replace = text.split("=", 1)[1] if "=" in text else "{}"
            continue
        letter = text[1:2]
        if letter in "adEILnPs":
            if letter == "I":
                replace = text[2:] or _value(rest, i)
            i += 1 if len(text) == 2 else 0
        elif letter == "i":
            replace = text[2:] or "{}"
        elif not re.fullmatch(r"-[0oprtxl]\d*|-e.*|-[0-9]+", text):
            state.unreadable(f"an option of xargs this reader does not know ({text})")
            return
    command = rest[i:] or [Word("echo", ("echo",))]
    unknown = Word("(input)", (), "xargs reads its arguments from input")
    if replace:
        command = [unknown if w.value is not None and replace in w.value else w for w in command]
    else:
        command = [*command, unknown]
    _simple(command, state, source="xargs " + " ".join(w.source for w in command), context="xargs")


def _cd_target(value: str | None, state: _State) -> PurePosixPath | None:
    if value is None or (state.cwd is None and not value.startswith("/")):
        return None
    return _place(value, state.cwd, state.workspace)


def _understand(command: Command, state: _State) -> None:
    """What a resolved command does to the shell reading the rest, or why it cannot be read."""
    program = command.program or ""
    fam = command.family
    values = [w.value for w in command.args]
    if program in ("cd", "pushd", "popd"):
        if program == "cd" and len(values) == 1 and values[0] not in (None, "-"):
            state.cwd = _cd_target(values[0], state)
        else:
            state.cwd = None
        return
    if program in OPAQUE_PROGRAMS:
        state.unreadable(OPAQUE_PROGRAMS[program])
    elif program in ("source", "."):
        where = command.args[0] if command.args else None
        if where is None or where.value is None or state.place(where.value) is None:
            state.unreadable(f"{program} runs commands from a file outside the workspace")
    elif program == "hash" and "-p" in values:
        state.unreadable("hash -p changes what a command name runs")
    elif program == "mapfile" or program == "readarray":
        if any(v and v.startswith("-C") for v in values):
            state.unreadable("mapfile -C runs text as commands")
    elif program in ("declare", "typeset", "local", "export", "readonly"):
        if any(v and re.fullmatch(r"-\w*n\w*", v) for v in values):
            state.unreadable("declare -n makes a variable name another")
    elif program in SHELLS:
        _shell_given_code(command, state)
    elif fam in INTERPRETERS:
        _interpreter_given_code(command, state)
    elif program in AWKS:
        _awk(command, state)
    elif program == "sed":
        _sed(command, state)
    elif program == "find":
        _find(command, state)
    elif fam == "git":
        _git(command, state)


def _find(command: Command, state: _State) -> None:
    args = list(command.args)
    roots: list[str] = []
    i = 0
    while i < len(args) and args[i].value is not None:
        text = args[i].value or ""
        if text.startswith("-") or text in ("(", "!", ","):
            break
        roots.append(text)
        i += 1
    if any(w.value is None for w in args):
        state.unreadable("find's arguments are only known when they run")
        return
    bases = roots or ["."]
    found = Word("{}", tuple(f"{r.rstrip('/') or '/'}/found" for r in bases))
    while i < len(args):
        text = args[i].value
        i += 1
        if text in ("-exec", "-execdir", "-ok", "-okdir"):
            start = i
            while i < len(args) and args[i].value not in (";", "+"):
                i += 1
            inner = [found if w.value == "{}" else w for w in args[start:i]]
            i += 1
            saved = state.cwd
            if text.endswith("dir"):
                state.cwd = None  # it runs in each found file's folder
            _simple(inner, state, source=" ".join(w.source for w in args[start:i]), context="find")
            state.cwd = saved
