"""Programs whose arguments can be commands: a shell or an interpreter given code, awk and
sed programs that run commands or write files, git config keys that run commands. Each check
records why such a command cannot be read plainly.
"""

from __future__ import annotations

import re

from agents.shell.options import split_options
from agents.shell.programs import INTERPRETERS
from agents.shell.script import Command
from agents.shell.state import _State


def _shell_given_code(command: Command, state: _State) -> None:
    opts = command.options()
    if any(v is None for v in (w.value for w in command.args)):
        state.unreadable(f"{command.program}'s arguments are only known when it runs")
    elif any(f.startswith("-") and not f.startswith("--") and "c" in f for f in opts.flags):
        state.unreadable(f"{command.program} -c runs text as commands")
    elif not opts.operands and not opts.flags & {"--version", "--help"}:
        state.unreadable(f"{command.program} runs commands from its input")
    elif any("s" in f for f in opts.flags if not f.startswith("--")):
        state.unreadable(f"{command.program} -s runs commands from its input")


# Options that take the next word as their value: that word is not a script file (`python -X
# importtime -c CODE` runs CODE; read as a script named "importtime", it ran without asking).
VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "python": frozenset({"-X", "-W", "-Q"}),
    "node": frozenset(
        {
            "-r",
            "--require",
            "--import",
            "--loader",
            "--experimental-loader",
            "--input-type",
            "--title",
            "--env-file",
            "-C",
            "--conditions",
        }
    ),
    "ruby": frozenset({"-r", "-I", "-C", "-E", "-F"}),
    "perl": frozenset({"-I", "-M", "-m", "-x"}),
}


def _interpreter_given_code(command: Command, state: _State) -> None:
    fam = command.family
    code_flags = INTERPRETERS[fam]
    takes_value = VALUE_OPTIONS.get(fam, frozenset())
    words = [w.value for w in command.args]
    if any(v is None for v in words):
        state.unreadable(f"{command.program}'s arguments are only known when it runs")
        return
    module = False
    skip = False
    for text in words:
        assert text is not None
        if skip:
            skip = False
            continue
        if text in takes_value:
            skip = True
            continue
        if text in code_flags or text.split("=", 1)[0] in code_flags:
            state.unreadable(f"{command.program} {text} runs code given as text")
            return
        if re.fullmatch(r"-[A-Za-z]+", text) and any("-" + c in code_flags for c in text[1:]):
            state.unreadable(f"{command.program} {text} runs code given as text")
            return
        if fam == "python" and re.fullmatch(r"-[A-Za-z]*m\w*", text):
            module = True
            break
        if text == "-":
            state.unreadable(f"{command.program} - runs code from its input")
            return
        if not text.startswith("-"):
            return  # a script file: code the agent wrote, like any program it runs
    if not module and not any(t in ("--version", "-V", "--help", "-h") for t in words if t):
        state.unreadable(f"{command.program} runs code from its input")


def _awk(command: Command, state: _State) -> None:
    opts = split_options("awk", command.args)
    if "-f" in opts.flags or any(f.startswith("--file") for f in opts.flags):
        return
    program = opts.operands[0].value if opts.operands else None
    if program is None:
        state.unreadable("awk's program is only known when it runs")
    elif re.search(r"system|\||>|getline|close|fflush|ENVIRON", program):
        state.unreadable("the awk program runs commands or writes files")


def _sed(command: Command, state: _State) -> None:
    opts = split_options("sed", command.args)
    scripts = [w for name, w in opts.values if name in ("-e", "--expression")]
    if not scripts and not any(n in ("-f", "--file") for n, _ in opts.values):
        scripts = list(opts.operands[:1])
    for word in scripts:
        if word.value is None or _sed_runs_or_writes(word.value):
            state.unreadable("the sed script runs commands or writes files (e, w)")
            return


def _sed_runs_or_writes(script: str) -> bool:
    """True when a sed script has an e or w command or an s///e or s///w flag (or is unclear)."""
    i, n = 0, len(script)
    while i < n:
        c = script[i]
        if c in " \t\n;{}!0123456789,$~+":
            i += 1
        elif c == "/" or c == "\\":  # an address /re/ or \cREc
            delim = "/" if c == "/" else (script[i + 1] if i + 1 < n else "")
            i = _sed_skip(script, i + (1 if c == "/" else 2), delim)
            if i < 0:
                return True
            while i < n and script[i] in "IM":
                i += 1
        elif c in "sy":
            if i + 1 >= n:
                return True
            delim = script[i + 1]
            i = _sed_skip(script, i + 2, delim)
            i = _sed_skip(script, i, delim) if i >= 0 else -1
            if i < 0:
                return True
            start = i
            while i < n and script[i] not in ";\n}":
                i += 1
            if c == "s" and re.search(r"[ewW]", script[start:i]):
                return True
        elif c in "aic":  # text to the end of the line, and past a line ending in \\
            while i < n and script[i] != "\n":
                i += 2 if script[i] == "\\" else 1
        elif c in ":bTt#":  # labels and comments: to the end of the command
            while i < n and script[i] not in ";\n":
                i += 1
        elif c in "ewWrR":
            return c in "ewW"
        elif c.isalpha() or c in "=":
            i += 1
        else:
            return True
    return False


def _sed_skip(script: str, i: int, delim: str) -> int:
    """Index after the next unescaped `delim` from i, or -1."""
    while i < len(script):
        if script[i] == "\\":
            i += 2
            continue
        if script[i] == delim:
            return i + 1
        i += 1
    return -1


_GIT_RISKY_CONFIG = re.compile(
    r"^(alias\.|core\.(sshcommand|fsmonitor|hookspath|pager|editor|askpass|gitproxy))"
    r"|\.(command|textconv|process|clean|smudge|helper|sshcommand)\b|^(diff|merge)\.\w+\.|"
    r"^(credential|sequence\.editor|gpg\.program|uploadpack|receivepack)",
    re.I,
)


def _git(command: Command, state: _State) -> None:
    for name, word in command.options().values:
        if name in ("-c", "--config-env"):
            key = (word.value or "").split("=", 1)[0]
            if word.value is None or _GIT_RISKY_CONFIG.search(key):
                state.unreadable(f"git -c {key or '?'} can make git run commands")
