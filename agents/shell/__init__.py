"""Reading a shell command the way the shell will, so the tool policy judges what runs, not its text.

`parse(command, workspace=...)` turns a command line into plain data (a `Script`): the simple
commands it runs, how they are joined, their redirections, and every reason it cannot be read
plainly (`Script.opaque`). tree-sitter-bash does the parsing; this module resolves what the shell
would do with the words. No Django here. The rules:

Words
- Quotes and backslashes are removed as the shell removes them. `~`, `~user` and `$HOME` are a
  home folder (`HOME`): never counted as inside the workspace, whatever HOME is when it runs.
  `$PWD` and `~+` are where the command runs. Braces are expanded as bash does, and the literal
  word is kept beside the expansions (sh does not expand braces); `$'…'` is read both as bash
  (escapes decoded) and as sh (`$` then the text). A word is every value it may become.
- Anything else that is only known when it runs — another variable, a command or process
  substitution, arithmetic — makes the word *unknown* (`Word.unknown` says why).

Commands
- The program is the first word with its folder dropped (`/bin/rm`, `./x/../../bin/rm` are `rm`)
  and wrappers removed: `command`, `builtin`, `exec`, `env`, `nice`, `nohup`, `time`, `timeout`,
  `stdbuf`, `ionice`, `setsid`, `busybox`, `sudo`, `doas` (kept in `Command.wrappers`). Wrappers
  whose options are not modelled (`strace`, `unshare`, `uv run`, …) are read at every position
  after them as if the command could start there. `xargs CMD` is CMD with an unknown argument
  more; `find … -exec CMD {} ;` is CMD on paths under find's starting points.
- Commands inside substitutions, function bodies, `find -exec` and `xargs` are commands too.
- Flags: a word starting with `-` before `--` (GNU tools take flags after operands too); for
  programs known to take single-letter clusters `-rf` is `-r -f`; options that take a value
  (`python -m MOD`, `git -C DIR`, `cp -t DIR`) keep it (`-m pytest`); a few long spellings are
  folded into the short one (`--recursive` is `-r` for rm). After `--` every word is an operand.
- `cd` moves where later commands run, until the subshell it ran in ends; `cd` somewhere unknown
  or outside the workspace makes every later relative path unknown.

Paths (`Script.place`)
- A value is resolved against where its command runs, then normalised (`..`, `.`, `//`,
  trailing `/`). Relative paths inside the workspace and absolute paths under it are inside;
  with no workspace given every absolute path is outside. A glob counts by its literal folder,
  and a glob part that may match `.` or `..` (`.*`, `[.]…`) counts as `..`. When the workspace
  exists on disk, symbolic links in the existing part of the path are followed as well.

Opaque (a person has to read it): a program name that is not one plain word (substitution,
variable, glob, braces), `eval`, `source`/`.` of anything but a file inside the workspace,
`alias`, `trap`, `let`, `coproc`, `enable`, `fc`, `hash -p`, `mapfile -C`, `declare -n`, a shell
given code (`sh -c`, or commands on standard input: `… | sh`, `bash <<EOF`), an interpreter given
code (`python -c`, `python -`, `perl -e`, `node -e`, `ruby -e`, …, or none on its command line),
awk programs that run commands or write files, sed scripts with `e` or `w`, `env -S`, `watch`,
`git -c` keys that run commands, arithmetic on a variable that is not a known number, expansions
that evaluate (`${x:1}`, `${x@P}`, `${!x}`, `${a[$i]}`), assigning HOME, PWD, IFS, CDPATH, …,
words tree-sitter splits differently from the shell, and anything it cannot parse or this module
does not know.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import tree_sitter
import tree_sitter_bash

_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
# One parser per thread: py-tree-sitter holds the GIL while it parses today, but a parser keeps
# state during a parse and is not meant to be shared should that change (py-tree-sitter #111).
_LOCAL = threading.local()


def _parser() -> tree_sitter.Parser:
    parser = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = tree_sitter.Parser(_LANGUAGE)
    return parser


ROOT = PurePosixPath(".")  # the workspace root, as paths relative to it are kept
HOME = "\0home"  # the value of ~ and $HOME: a home folder, never inside the workspace
MAX_VALUES = 64  # a word that may become more values than this is unknown
MAX_DEPTH = 20  # nested substitutions beyond this are opaque

# --- what programs are ------------------------------------------------------------------------
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh"})
# Interpreters and the flags that give them code on the command line.
INTERPRETERS: dict[str, frozenset[str]] = {
    "python": frozenset({"-c"}),
    "perl": frozenset({"-e", "-E"}),
    "ruby": frozenset({"-e"}),
    "node": frozenset({"-e", "--eval", "-p", "--print"}),
    "bun": frozenset({"-e", "--eval", "-p", "--print"}),
    "deno": frozenset({"eval"}),
    "php": frozenset({"-r", "-B", "-R", "-E"}),
    "lua": frozenset({"-e"}),
    "Rscript": frozenset({"-e"}),
    "R": frozenset({"-e"}),
    "julia": frozenset({"-e", "--eval"}),
    "tclsh": frozenset(),
    "osascript": frozenset({"-e"}),
    "pwsh": frozenset({"-c", "-command", "-Command", "-encodedcommand", "-EncodedCommand"}),
}
AWKS = frozenset({"awk", "gawk", "mawk", "nawk"})
# Builtins that run text as commands, or change what later words mean.
OPAQUE_PROGRAMS = {
    "eval": "eval runs text as commands",
    "alias": "an alias changes what a command name means",
    "trap": "trap runs text as commands",
    "let": "let evaluates arithmetic",
    "coproc": "coproc",
    "enable": "enable loads or turns off builtins",
    "fc": "fc runs commands from history",
    "watch": "watch runs its arguments through sh -c",
    "su": "su -c runs text as commands",
    "runuser": "runuser runs text as commands",
    "script": "script -c runs text as commands",
    "parallel": "parallel runs text as commands",
}
# Variables whose assignment changes how the shell reads words or paths.
SPECIAL_VARIABLES = frozenset(
    {"HOME", "PWD", "OLDPWD", "CDPATH", "IFS", "BASH_ENV", "ENV", "GLOBIGNORE", "SHELLOPTS"}
    | {"BASHOPTS", "PS4", "PROMPT_COMMAND", "BASH_CMDS", "BASH_ALIASES", "FUNCNEST"}
)
# Wrappers: short options without a value, short options with one, long options with one.
# Their first operand after the options is the program they run.
_WRAPPERS: dict[str, tuple[str, str, frozenset[str]]] = {
    "command": ("p", "", frozenset()),
    "builtin": ("", "", frozenset()),
    "exec": ("cl", "a", frozenset()),
    "nohup": ("", "", frozenset()),
    "time": ("pav", "of", frozenset({"--output", "--format"})),
    "nice": ("", "n", frozenset({"--adjustment"})),
    "timeout": ("v", "ks", frozenset({"--kill-after", "--signal"})),
    "stdbuf": ("", "ioe", frozenset({"--input", "--output", "--error"})),
    "ionice": ("t", "cn", frozenset({"--class", "--classdata"})),
    "setsid": ("cfw", "", frozenset()),
    "busybox": ("", "", frozenset()),
    "sudo": ("AbEeHiKklnPSsVv", "CDghprTUu", frozenset({"--user", "--group", "--chdir"})),
    "doas": ("nSs", "Cu", frozenset()),
}
# Programs that run the rest of their command line as a command, with options this module does
# not model: every later position may be where the command starts.
GENERIC_WRAPPERS = frozenset(
    {"strace", "ltrace", "valgrind", "unshare", "nsenter", "firejail", "fakeroot", "faketime"}
    | {"proxychains", "proxychains4", "torsocks", "chrt", "taskset", "numactl", "flock"}
    | {"unbuffer", "catchsegv", "chronic", "systemd-run", "bwrap", "chroot", "perf", "gdb"}
)
# Runners whose subcommand `run`/`exec`/`x` runs the rest as a command.
_RUNNERS = frozenset({"uv", "poetry", "pipenv", "conda", "mamba", "pdm", "hatch", "rye"})

# Programs whose single-letter flags may be clustered (`-rf` is `-r -f`).
CLUSTERING = frozenset(
    {"rm", "cp", "mv", "ln", "mkdir", "rmdir", "touch", "chmod", "chown", "chgrp", "ls", "cat"}
    | {"grep", "egrep", "fgrep", "head", "tail", "wc", "sort", "uniq", "cut", "tr", "sed", "du"}
    | {"df", "diff", "patch", "git", "tar", "zip", "unzip", "gzip", "gunzip", "curl", "wget"}
    | {"ssh", "scp", "rsync", "xargs", "pytest", "python", "pip", "shred", "install", "tee"}
    | {"truncate", "unlink", "readlink", "realpath", "stat", "file", "ps", "kill", "sudo"}
    | {"env", "nice", "timeout", "nl", "od", "xxd", "less", "more", "basename", "dirname"}
    | SHELLS
)
# Short options that take a value: `-m pytest` is one flag. Per program family.
VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "python": frozenset({"-m", "-c", "-W", "-X", "-Q"}),
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env"}),
    "cp": frozenset({"-t", "-S", "--target-directory", "--suffix"}),
    "mv": frozenset({"-t", "-S", "--target-directory", "--suffix"}),
    "ln": frozenset({"-t", "-S", "--target-directory", "--suffix"}),
    "install": frozenset({"-t", "-S", "-m", "-o", "-g", "--target-directory", "--mode"}),
    "sed": frozenset({"-e", "-f", "-l", "--expression", "--file"}),
    "sort": frozenset({"-o", "-k", "-t", "-S", "-T", "--output"}),
    "head": frozenset({"-n", "-c"}),
    "tail": frozenset({"-n", "-c"}),
    "grep": frozenset({"-e", "-f", "-m", "-A", "-B", "-C"}),
    "chmod": frozenset(),
    "unzip": frozenset({"-d"}),
    "tar": frozenset({"-C", "-f", "--directory", "--file"}),
    "pip": frozenset({"-r", "-c", "-e", "-t", "--target", "--requirement", "--constraint"}),
    "mkdir": frozenset({"-m", "--mode"}),
    "xargs": frozenset({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"}),
}
# Long spellings folded into one flag, so `rm --recursive --force` is `rm -f -r`.
FLAG_ALIASES: dict[str, dict[str, str]] = {
    "rm": {"-R": "-r", "--recursive": "-r", "--force": "-f", "--dir": "-d", "--verbose": "-v"},
    "cp": {"-R": "-r", "--recursive": "-r", "--force": "-f", "--verbose": "-v"},
    "mv": {"--force": "-f", "--verbose": "-v", "--no-clobber": "-n"},
    "chmod": {"--recursive": "-R", "--verbose": "-v", "--changes": "-c", "--silent": "-f"},
    "chown": {"--recursive": "-R", "--verbose": "-v", "--changes": "-c", "--silent": "-f"},
    "chgrp": {"--recursive": "-R", "--verbose": "-v", "--changes": "-c", "--silent": "-f"},
    "mkdir": {"--parents": "-p", "--verbose": "-v"},
    "git": {"--force": "-f", "--dry-run": "-n", "--quiet": "-q"},
}
# Every long option of the programs above, so an abbreviation (`--rec`) is read as GNU reads it.
_LONG_OPTIONS: dict[str, tuple[str, ...]] = {
    "rm": (
        *("--recursive", "--force", "--dir", "--verbose", "--interactive", "--help"),
        *("--one-file-system", "--no-preserve-root", "--preserve-root", "--version"),
    ),
    "chmod": (
        *("--recursive", "--verbose", "--changes", "--silent", "--quiet", "--reference"),
        *("--no-preserve-root", "--preserve-root", "--help", "--version"),
    ),
}


def family(program: str) -> str:
    """The name a program's rules go by: python3.11 is python, pip3 is pip, nodejs is node."""
    if m := re.fullmatch(r"(python|pypy|pip|perl|ruby|php|lua|node|pydoc)[\d.]*(js)?", program):
        name = m.group(1)
        return "python" if name == "pypy" else name
    if program.startswith("mkfs."):
        return "mkfs"
    return program


# --- the data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Word:
    source: str
    values: tuple[str, ...] = ()  # every string it may become; () when unknown
    unknown: str = ""  # why its value is only known when it runs; "" when known
    globs: tuple[bool, ...] = ()  # per value: has an unquoted * ? or [ (unsaid: maybe)

    def readings(self) -> list[tuple[str, bool]]:
        """Each value, and whether it may be a glob."""
        return [
            (v, self.globs[i] if i < len(self.globs) else True) for i, v in enumerate(self.values)
        ]

    @property
    def value(self) -> str | None:
        """Its one value, or None when it is unknown or may become several."""
        return self.values[0] if len(self.values) == 1 and not self.unknown else None


@dataclass(frozen=True)
class Redirect:
    op: str  # >, >>, <, &>, >&, <<, <<< …
    target: Word
    cwd: PurePosixPath | None
    fd: str = ""

    @property
    def writes(self) -> bool:
        if self.op == ">&" and self.target.value is not None:
            return not re.fullmatch(r"\d+-?|-", self.target.value)
        return self.op in (">", ">>", ">|", "&>", "&>>", ">&", "<>")


@dataclass(frozen=True)
class Options:
    flags: frozenset[str]  # normalised: -r, -f, --color=auto, "-m pytest"
    operands: tuple[Word, ...]
    values: tuple[tuple[str, Word], ...]  # (option, its value) for options that take one


@dataclass(frozen=True)
class Command:
    program: str | None  # "rm" however it was written; None when only known when it runs
    args: tuple[Word, ...]  # its arguments, the wrappers' own removed
    wrappers: tuple[str, ...] = ()  # env, nice, sudo, … outermost first
    cwd: PurePosixPath | None = ROOT  # relative to the workspace; None: unknown
    redirects: tuple[Redirect, ...] = ()
    source: str = ""
    context: str = ""  # "" at the top; "command substitution", "find -exec", "xargs", …
    assigns: tuple[str, ...] = ()  # variables set for it alone: `X=1 cmd`, `env X=1 cmd`

    @property
    def family(self) -> str:
        return family(self.program or "")

    def options(self) -> Options:
        return split_options(self.family, self.args)

    def canonical(self) -> str:
        """One line naming what runs, quoting and wrappers resolved: `rm -rf build`."""
        words = [self.program or "?"]
        words += [w.values[0] if w.values and not w.unknown else "?" for w in self.args]
        return " ".join(words)


@dataclass(frozen=True)
class Script:
    source: str
    workspace: Path | None
    commands: tuple[Command, ...] = ()
    operators: tuple[str, ...] = ()  # &&, ||, ;, |, &, subshell, if, for, while, case, function …
    redirects: tuple[Redirect, ...] = ()
    opaque: tuple[str, ...] = ()  # why it cannot be read plainly; () when it can
    single: bool = False  # exactly one simple command, nothing joined, redirected or substituted

    def place(
        self, value: str, cwd: PurePosixPath | None, *, glob: bool = True
    ) -> PurePosixPath | None:
        """Where a path value lands, relative to the workspace root; None when outside/unknown.
        `glob`: its * ? [ may be a glob (False when they were quoted)."""
        return _place(value, cwd, self.workspace, glob=glob)

    def inside(self, word: Word, cwd: PurePosixPath | None) -> bool:
        """Every value the word may become is a path inside the workspace."""
        if word.unknown or not word.values:
            return False
        return all(self.place(v, cwd, glob=g) is not None for v, g in word.readings())


# --- paths ------------------------------------------------------------------------------------
_GLOB = re.compile(r"[*?\[]")


def _place(
    value: str, cwd: PurePosixPath | None, workspace: Path | None, *, glob: bool = True
) -> PurePosixPath | None:
    if value.startswith(HOME) or "\0" in value:
        return None
    if value.startswith("/"):
        if workspace is None:
            return None
        root = PurePosixPath(os.path.normpath(str(workspace)))
        parts = _normalise(PurePosixPath("/"), value, glob)
        if parts is None:
            return None
        absolute = PurePosixPath("/", *parts)
        if absolute != root and root not in absolute.parents:
            return None
        rel = absolute.relative_to(root)
    else:
        if cwd is None:
            return None
        parts = _normalise(cwd, value, glob)
        if parts is None:
            return None
        rel = PurePosixPath(*parts) if parts else PurePosixPath(".")
    if workspace is not None and not _stays_inside_on_disk(Path(workspace), rel, glob):
        return None
    return rel


def _normalise(base: PurePosixPath, value: str, glob: bool) -> list[str] | None:
    """The path's parts after `..` and `.`; a glob part that may match `..` climbs. None: above."""
    stack = [p for p in base.parts if p not in ("/", ".")]
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part == ".." or (glob and _GLOB.search(part) and part[0] in ".[?"):
            if not stack:
                return None
            stack.pop()
        else:
            stack.append(part)
    return stack


def _stays_inside_on_disk(workspace: Path, rel: PurePosixPath, glob: bool) -> bool:
    """Symbolic links in the part of the path that exists do not lead out of the workspace."""
    literal = []
    for part in rel.parts:
        if glob and _GLOB.search(part):
            break
        literal.append(part)
    try:
        root = os.path.realpath(workspace)
        real = os.path.realpath(os.path.join(root, *literal))
    except (OSError, ValueError):
        return False
    return real == root or real.startswith(root.rstrip("/") + "/")


# --- flags ------------------------------------------------------------------------------------
def split_options(program_family: str, args: Iterable[Word]) -> Options:
    """Flags and operands of a command, read as `program_family` reads them."""
    takes_value = VALUE_OPTIONS.get(program_family, frozenset())
    aliases = FLAG_ALIASES.get(program_family, {})
    flags: set[str] = set()
    operands: list[Word] = []
    values: list[tuple[str, Word]] = []
    words = list(args)
    i = 0
    ended = False
    while i < len(words):
        word = words[i]
        i += 1
        text = word.value
        if ended or text is None or not text.startswith("-") or text == "-":
            operands.append(word)
            continue
        if text == "--":
            ended = True
            continue
        if text.startswith("--"):
            name, eq, rest = text.partition("=")
            name = _unabbreviate(program_family, name)
            if name in takes_value and not eq and i < len(words):
                value = words[i]
                i += 1
                flags.add(f"{name} {value.value if value.value is not None else '?'}")
                values.append((name, value))
                continue
            if eq:
                values.append((name, Word(rest, (rest,))))
            flags.add(aliases.get(name, name) + eq + rest)
            continue
        if program_family not in CLUSTERING:
            flags.add(aliases.get(text, text))
            continue
        for j, letter in enumerate(text[1:], start=1):
            flag = "-" + letter
            if flag in takes_value:
                attached = text[j + 1 :]
                if attached:
                    value = Word(attached, (attached,))
                elif i < len(words):
                    value = words[i]
                    i += 1
                else:
                    value = Word("", ("",))
                flags.add(f"{flag} {value.value if value.value is not None else '?'}")
                values.append((flag, value))
                break
            flags.add(aliases.get(flag, flag))
    return Options(frozenset(flags), tuple(operands), tuple(values))


def _unabbreviate(program_family: str, name: str) -> str:
    known = _LONG_OPTIONS.get(program_family, ())
    if name in known:
        return name
    matches = [k for k in known if k.startswith(name)] if len(name) > 3 else []
    return matches[0] if len(matches) == 1 else name


# --- words ------------------------------------------------------------------------------------
# A word is built from parts: ("lit", text, quoted), ("alt", bash_text, sh_text), ("unk", why).
_Part = tuple[str, ...]

_ANSI_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def _ansi_c(text: str) -> str:
    """The value of bash's $'…' (without the $' and ')."""

    def one(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] in _ANSI_ESCAPES:
            return _ANSI_ESCAPES[s[0]]
        if s[0] in "01234567":
            return chr(int(s, 8) & 0xFF)
        if s[0] in "xuU":
            return chr(int(s[1:], 16)) if len(s) > 1 else "\\" + s
        if s[0] == "c" and len(s) == 2:
            return chr(ord(s[1].upper()) ^ 0x40)
        return "\\" + s

    pattern = r"\\([0-7]{1,3}|x[0-9a-fA-F]{0,2}|u[0-9a-fA-F]{0,4}|U[0-9a-fA-F]{0,8}|c.|.)"
    return re.sub(pattern, one, text, flags=re.S)


def _unquoted(text: str) -> list[_Part]:
    """An unquoted word's text: a backslash quotes the next character, backslash-newline is gone."""
    parts: list[_Part] = []
    buf = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if buf:
                parts.append(("lit", buf, ""))
                buf = ""
            if text[i + 1] != "\n":
                parts.append(("lit", text[i + 1], "q"))
            i += 2
            continue
        buf += c
        i += 1
    if buf:
        parts.append(("lit", buf, ""))
    return parts


def _double_quoted(text: str) -> str:
    """Text inside "…": a backslash quotes only $ ` " \\ and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _expand(parts: list[_Part]) -> tuple[tuple[str, ...], str, tuple[bool, ...]]:
    """The values a word's parts may become and whether each may be a glob, or ((), why, ())
    when they are only known at run time."""
    for part in parts:
        if part[0] == "unk":
            return (), part[1], ()
    variants: list[list[tuple[str, bool]]] = [[]]
    for part in parts:
        if part[0] == "lit":
            chars = [(c, bool(part[2])) for c in part[1]]
            variants = [v + chars for v in variants]
        else:  # alt: bash reads one thing, sh another
            variants = [v + [(c, True) for c in text] for v in variants for text in part[1:]]
        if len(variants) > MAX_VALUES:
            return (), "too many readings", ()
    values: dict[str, bool] = {}
    for chars in variants:
        expanded = [chars, *_braces(chars)]
        if len(expanded) > MAX_VALUES:
            return (), "too many brace expansions", ()
        for one in expanded:
            text = _tilde(one)
            glob = any(c in "*?[" and not quoted for c, quoted in one)
            values[text] = values.get(text, False) or glob
    if len(values) > MAX_VALUES:
        return (), "too many brace expansions", ()
    return tuple(values), "", tuple(values.values())


def _tilde(chars: list[tuple[str, bool]]) -> str:
    text = "".join(c for c, _ in chars)
    starts = [0]
    eq = text.find("=")
    if eq > 0 and re.fullmatch(r"[A-Za-z_]\w*", text[:eq]):
        starts.append(eq + 1)  # bash expands ~ after the = of an assignment-like word
    for start in reversed(starts):
        if start >= len(chars) or chars[start] != ("~", False):
            continue
        end = text.find("/", start)
        end = len(text) if end < 0 else end
        if any(q for _, q in chars[start:end]):
            continue
        user = text[start + 1 : end]
        home = "." if user == "+" else HOME
        text = text[:start] + home + text[end:]
    return text


def _braces(chars: list[tuple[str, bool]], budget: list[int] | None = None) -> list[list[Any]]:
    """bash's brace expansion of a word's characters (quoted ones are never syntax)."""
    budget = budget if budget is not None else [MAX_VALUES * 4]
    n = len(chars)
    for i in range(n):
        if chars[i] != ("{", False) or (i and chars[i - 1] == ("$", False)):
            continue
        depth, commas, close = 0, [], None
        for j in range(i, n):
            c, quoted = chars[j]
            if quoted or (c == "}" and j == i + 1 and depth == 1):
                continue  # quoted, or a } right after the { (bash reads `{},a}` as } and a)
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    close = j
                    break
            elif c == "," and depth == 1:
                commas.append(j)
        if close is None:
            continue  # an unmatched { is a plain character; braces after it still expand
        body = chars[i + 1 : close]
        if commas:
            cuts = [i, *commas, close]
            alternatives = [chars[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        else:
            alternatives = _sequence(body)
            if not alternatives:
                continue
        out: list[list[Any]] = []
        for alt in alternatives:
            budget[0] -= 1
            if budget[0] < 0:
                return out + [[("\0", True)]] * (MAX_VALUES + 1)
            word = chars[:i] + alt + chars[close + 1 :]
            out.extend(_braces(word, budget) or [word])
        return out
    return []


def _sequence(body: list[tuple[str, bool]]) -> list[list[tuple[str, bool]]]:
    if any(q for _, q in body):
        return []
    text = "".join(c for c, _ in body)
    m = re.fullmatch(
        r"(-?\d+)\.\.(-?\d+)(?:\.\.-?\d+)?|([A-Za-z])\.\.([A-Za-z])(?:\.\.-?\d+)?", text
    )
    if not m:
        return []
    if m.group(1) is not None:
        a, b = int(m.group(1)), int(m.group(2))
        items = [str(a), str(a + (1 if b >= a else -1)), str(b)]
    else:
        items = [m.group(3), m.group(4)]  # letters never make / or .
    return [[(c, True) for c in item] for item in dict.fromkeys(items)]


# --- the walker -------------------------------------------------------------------------------
_OPERATORS = frozenset({"&&", "||", ";", "|", "|&", "&", ";;", "\n"})
_WORDISH = frozenset(
    {"word", "string", "raw_string", "concatenation", "simple_expansion", "expansion"}
    | {"command_substitution", "process_substitution", "number", "ansi_c_string"}
    | {"translated_string", "brace_expression", "arithmetic_expansion"}
)
_SAFE_EXPANSION_OPS = frozenset(
    {":-", "-", ":=", "=", ":?", "?", ":+", "+", "#", "##", "%", "%%", "/", "//", "/#", "/%"}
    | {"^", "^^", ",", ",,"}
)
_NUMBER = re.compile(r"\d+|0[xX][0-9a-fA-F]+|\d+#[0-9a-zA-Z@_]+")
_NUMERIC_SPECIALS = frozenset({"#", "?", "$", "!", "RANDOM", "SECONDS", "LINENO", "BASHPID"})
_NUMERIC_SPECIALS |= {"PPID", "UID", "EUID", "SHLVL", "COLUMNS", "LINES", "OPTIND"}


@dataclass
class _State:
    workspace: Path | None
    source: bytes
    # Reads the commands of a substitution met inside a word. Words hold substitutions, which
    # hold statements, which hold words: the statement walker hands itself in here, so the code
    # that reads words never has to import the code that reads statements.
    substitution: Callable[[tree_sitter.Node, _State], None]
    cwd: PurePosixPath | None = ROOT
    commands: list[Command] = field(default_factory=list)
    operators: list[str] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    numeric: set[str] = field(default_factory=set)  # variables only ever set to numbers
    depth: int = 0
    context: str = ""

    def place(self, value: str) -> PurePosixPath | None:
        return _place(value, self.cwd, self.workspace)

    def text(self, node: tree_sitter.Node) -> str:
        return self.source[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def unreadable(self, why: str) -> None:
        if why not in self.opaque:
            self.opaque.append(why)


def parse(command: str, *, workspace: Path | str | None = None) -> Script:
    """Read a shell command as the shell will; see the module's docstring for the rules."""
    where = str(workspace) if workspace is not None else None
    if len(command) > CACHED_LENGTH:
        return _parse(command, where)
    return _cached_parse(command, where)


def _parse(command: str, workspace: str | None) -> Script:
    where = Path(workspace) if workspace is not None else None
    state = _State(where, command.encode(), _substitution)
    tree = _parser().parse(state.source)
    root = tree.root_node
    state.numeric = _numeric_variables(root, state)
    _walk_statements(root, state)
    statements = [c for c in root.named_children if c.type != "comment"]
    single = (
        len(statements) == 1
        and statements[0].type == "command"
        and len(state.commands) == 1
        and not state.redirects
        and not state.operators
        and not state.opaque
        and not state.commands[0].context
    )
    return Script(
        source=command,
        workspace=state.workspace,
        commands=tuple(state.commands),
        operators=tuple(dict.fromkeys(state.operators)),
        redirects=tuple(state.redirects),
        opaque=tuple(state.opaque),
        single=single,
    )


# The same command is read by the policy, then by approvals, checkpoints …: keep recent ones.
# (Paths are resolved on the file system only when asked, so a cached Script stays true.)
CACHED_LENGTH = 4096
_cached_parse = functools.lru_cache(maxsize=1024)(_parse)


def _walk_statements(node: tree_sitter.Node, state: _State) -> None:
    """A node holding statements: program, list, pipeline, compound_statement, do_group …"""
    named = 0
    for child in node.children:
        if not child.is_named:
            if child.type in _OPERATORS:
                state.operators.append(child.type)
            continue
        if child.type == "comment":
            continue
        named += 1
        _statement(child, state)
    if node.type == "program" and named > 1:
        state.operators.append(";")


def _statement(node: tree_sitter.Node, state: _State) -> None:
    kind = node.type
    if node.has_error or node.is_missing or kind == "ERROR":
        state.unreadable("it does not parse")
        return
    if kind == "command":
        _command(node, state)
    elif kind == "redirected_statement":
        body, *redirects = node.children
        if body.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            redirects = [body, *redirects]
        else:
            _statement(body, state)
        for r in redirects:
            _redirect(r, state)
    elif kind in ("list", "pipeline"):
        _walk_statements(node, state)
    elif kind in ("compound_statement", "do_group", "else_clause", "elif_clause"):
        if node.children and node.children[0].type == "((":
            state.operators.append("arithmetic")
            for child in node.named_children:
                _arithmetic(child, state)
            return
        _walk_statements(node, state)
    elif kind == "subshell":
        state.operators.append("subshell")
        saved = state.cwd
        _walk_statements(node, state)
        state.cwd = saved
    elif kind == "negated_command":
        state.operators.append("!")
        _walk_statements(node, state)
    elif kind in ("if_statement", "while_statement"):
        state.operators.append("if" if kind == "if_statement" else "while")
        _walk_statements(node, state)
    elif kind == "for_statement":
        state.operators.append("for")
        body = [c for c in node.named_children if c.type == "do_group"]
        for child in node.named_children:
            if child.type in _WORDISH:
                _word(child, state)
        for child in body:
            _statement(child, state)
    elif kind == "c_style_for_statement":
        state.operators.append("for")
        for child in node.named_children:
            if child.type == "do_group" or child.type == "compound_statement":
                _statement(child, state)
            else:
                _arithmetic(child, state)
    elif kind == "case_statement":
        state.operators.append("case")
        for child in node.named_children:
            if child.type == "case_item":
                for item in child.named_children:
                    if item.type in _WORDISH:
                        _word(item, state)
                    elif item.type != "extglob_pattern":
                        _statement(item, state)
            else:
                _word(child, state)
    elif kind == "function_definition":
        state.operators.append("function")
        for child in node.named_children:
            if child.type != "word":
                _statement(child, state)
    elif kind in ("variable_assignment", "variable_assignments"):
        _assignments(node, state)
    elif kind == "declaration_command":
        _declaration(node, state)
    elif kind == "unset_command":
        for child in node.named_children:
            if child.type in _WORDISH:
                _word(child, state)
    elif kind == "test_command":
        _test(node, state)
    elif kind in _WORDISH:  # a statement that is only an expansion: `$x`
        state.unreadable("the program is only known when it runs")
        _word(node, state)
    else:
        state.unreadable(f"shell syntax this reader does not know ({kind})")


def _command(node: tree_sitter.Node, state: _State) -> None:
    words: list[Word] = []
    redirects: list[tree_sitter.Node] = []
    assigns: list[str] = []
    previous: tree_sitter.Node | None = None
    for child in node.children:
        if previous is not None and (split := _split_differently(previous, child, state)):
            state.unreadable(split)
        previous = child
        if child.type == "variable_assignment":
            _assignments(child, state, prefix=True)
            assigns.append(state.text(child).split("=", 1)[0])
            continue
        if child.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            redirects.append(child)
            continue
        if child.type == "comment":
            if child != node.children[-1]:
                state.unreadable("a command the parser continues after a comment")
            continue
        if child.type == "command_name":
            child = child.named_children[0] if child.named_children else child
        if not child.is_named or child.type not in _WORDISH:
            state.unreadable(f"a word this reader does not know ({child.type!r})")
            continue
        words.append(_word(child, state))
    for r in redirects:
        _redirect(r, state)
    if words:
        _simple(words, state, source=state.text(node), assigns=assigns)


def _split_differently(a: tree_sitter.Node, b: tree_sitter.Node, state: _State) -> str:
    """Why the shell would not read `a` and `b` as two words of one command, or "": no blank
    between them (one word to the shell, two to the parser), or a line break that ends the
    command (the parser took newline + backslash-newline for a continuation)."""
    gap = state.source[a.end_byte : b.start_byte].replace(b"\\\n", b"")
    if b"\n" in gap:
        return "a line break the parser reads as part of the command"
    if gap.strip():
        return "text the parser skipped"
    words = ("command_name", "variable_assignment", *_WORDISH)
    if not gap and a.type in words and b.type in words:
        return "words the shell joins and the parser splits"
    return ""


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


def _interpreter_given_code(command: Command, state: _State) -> None:
    fam = command.family
    code_flags = INTERPRETERS[fam]
    words = [w.value for w in command.args]
    if any(v is None for v in words):
        state.unreadable(f"{command.program}'s arguments are only known when it runs")
        return
    module = False
    for text in words:
        assert text is not None
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


def _assignments(node: tree_sitter.Node, state: _State, *, prefix: bool = False) -> None:
    """`X=v`: HOME, IFS … set for the rest of the command change how it reads words; set only for
    one command (`IFS= read -r line`) they do not: its words are read before the assignment."""
    assignments = [node] if node.type == "variable_assignment" else node.named_children
    for a in assignments:
        if a.type != "variable_assignment":
            continue
        target = a.child_by_field_name("name") or (a.named_children or [None])[0]
        if target is not None and target.type == "subscript":
            _arithmetic(target, state)
            name = state.text(target.named_children[0]) if target.named_children else ""
        else:
            name = state.text(target) if target is not None else ""
        if name in SPECIAL_VARIABLES and not prefix:
            state.unreadable(f"it sets {name}, which changes how the shell reads words")
        value = a.child_by_field_name("value")
        if value is None:
            continue
        if value.type == "array":
            for item in value.named_children:
                _word(item, state) if item.type in _WORDISH else None
        elif value.type in _WORDISH:
            _word(value, state)
        else:
            state.unreadable(f"shell syntax this reader does not know ({value.type})")


def _declaration(node: tree_sitter.Node, state: _State) -> None:
    keyword = node.children[0].type if node.children else ""
    words = []
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assignments(child, state)
        elif child.type in _WORDISH:
            words.append(_word(child, state))
        elif child.type != "variable_name":
            state.unreadable(f"shell syntax this reader does not know ({child.type})")
    if any(w.value and re.fullmatch(r"-\w*n\w*", w.value) for w in words):
        state.unreadable("declare -n makes a variable name another")
    if any(w.value is None for w in words):
        state.unreadable(f"{keyword}'s arguments are only known when it runs")


def _test(node: tree_sitter.Node, state: _State) -> None:
    """[ … ] and [[ … ]]: only their substitutions run; [[ -eq ]] evaluates arithmetic."""
    double = bool(node.children) and node.children[0].type == "[["
    for child in _descendants(node):
        if child.type in _RUNS_OR_EXPANDS:
            _word(child, state)
        elif child.type == "ERROR":
            state.unreadable("it does not parse")
        elif double and child.type == "binary_expression":
            ops = [c for c in child.children if c.type == "test_operator"]
            if ops and state.text(ops[0]) in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                for side in child.named_children:
                    if side.type != "test_operator":
                        _arithmetic(side, state)


_RUNS_OR_EXPANDS = frozenset(
    {"command_substitution", "process_substitution", "arithmetic_expansion", "expansion"}
    | {"simple_expansion"}
)


def _descendants(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """Every node below, not looking into words that _word reads whole."""
    for child in node.children:
        yield child
        if child.type not in _RUNS_OR_EXPANDS:
            yield from _descendants(child)


def _numeric_variables(root: tree_sitter.Node, state: _State) -> set[str]:
    """Variables this command only ever sets to plain numbers (safe inside arithmetic)."""
    numeric: set[str] = set()
    other: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type == "variable_assignment":
            target = node.named_children[0] if node.named_children else None
            if target is None or target.type != "variable_name":
                continue
            value = node.child_by_field_name("value")
            is_number = value is not None and (
                value.type in ("number", "arithmetic_expansion")
                or (value.type == "word" and _NUMBER.fullmatch(state.text(value)) is not None)
            )
            (numeric if is_number else other).add(state.text(target))
        elif node.type == "for_statement":
            target = node.child_by_field_name("variable")
            if target is not None:
                other.add(state.text(target))
        elif (
            node.type == "command"
            and node.named_children
            and state.text(node.named_children[0])
            in ("read", "getopts", "printf", "mapfile", "readarray")
        ):
            for child in node.named_children[1:]:  # variables set from input
                if child.type == "word" and re.fullmatch(r"[A-Za-z_]\w*", state.text(child)):
                    other.add(state.text(child))
    return numeric - other


def _arithmetic(node: tree_sitter.Node, state: _State) -> None:
    """Arithmetic evaluates the values of the variables it names as arithmetic again; a value
    like `a[$(cmd)]` would run cmd. So every variable must be one this command sets to numbers."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n.type
        if kind in ("command_substitution", "process_substitution"):
            state.unreadable("a command substitution inside arithmetic")
            _word(n, state)
            continue
        if kind == "ERROR":
            state.unreadable("it does not parse")
            continue
        if kind in ("variable_name", "special_variable_name"):
            names = [state.text(n)]
        elif kind == "word":
            names = [t for t in re.findall(r"[\w#@]+", state.text(n)) if not _NUMBER.fullmatch(t)]
        else:
            names = []
        for name in names:
            if name not in state.numeric and name not in _NUMERIC_SPECIALS:
                state.unreadable(f"arithmetic on ${name}, whose value is not a known number")
        if kind in ("variable_name", "special_variable_name", "word"):
            continue
        if kind in ("string", "raw_string", "ansi_c_string", "translated_string"):
            state.unreadable("text inside arithmetic")
            continue
        stack.extend(n.children)


def _redirect(node: tree_sitter.Node, state: _State) -> None:
    op = ""
    fd = ""
    target: Word | None = None
    for child in node.children:
        if child.type == "file_descriptor":
            fd = state.text(child)
        elif not child.is_named:
            op = op or child.type
        elif child.type == "heredoc_body":
            _heredoc_body(child, state)
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            _redirect(child, state)
        elif child.type in ("heredoc_start", "heredoc_end", "heredoc_content"):
            continue
        elif child.type in _WORDISH and target is None:
            target = _word(child, state)
        elif child.type in _WORDISH:
            _word(child, state)  # `cat <<< a b`: only the first is the target, all are read
        else:
            state.unreadable(f"a redirection this reader does not know ({child.type})")
    if node.type == "heredoc_redirect":
        target = Word("(here-document)", ("",))
    if target is None:
        state.unreadable("a redirection without a target")
        return
    state.redirects.append(Redirect(op, target, state.cwd, fd))


def _heredoc_body(node: tree_sitter.Node, state: _State) -> None:
    """An unquoted here-document's substitutions run; its variables are only data."""
    for child in node.named_children:
        if child.type in ("command_substitution", "arithmetic_expansion", "expansion"):
            _word(child, state)


def _word(node: tree_sitter.Node, state: _State) -> Word:
    """A word as the shell reads it: its values, or why it cannot be known."""
    parts = list(_parts(node, state, quoted=False))
    for i, part in enumerate(parts):
        after = parts[i + 1] if i + 1 < len(parts) else ("", "", "q")
        braced = after[0] == "lit" and not after[2] and after[1].startswith("{")
        if part[0] in ("pwd", "home") and braced:  # braces expand first: $HOME{x,} is $HOMEx
            parts[i] = ("unk", "a $NAME followed by braces")
            continue
        if part[0] == "pwd":  # $PWD is where it runs only at the start of a word
            parts[i] = ("lit", ".", "q") if i == 0 else ("unk", "$PWD inside a word")
        elif part[0] == "home":
            parts[i] = ("lit", HOME, "q")
    values, unknown, globs = _expand(parts)
    return Word(state.text(node), values, unknown, globs)


def _parts(node: tree_sitter.Node, state: _State, *, quoted: bool) -> Iterator[_Part]:
    kind = node.type
    text = state.text(node)
    if kind in ("word", "number"):
        if re.search(r"(?<!\\)(?:\\\\)*\n", text):
            state.unreadable("a line break the parser reads as part of a word")
        if quoted:
            yield ("lit", text, "q")
        else:
            yield from _unquoted(text)
    elif kind == "raw_string":
        yield ("lit", text[1:-1], "q")
    elif kind == "ansi_c_string":
        yield ("alt", _ansi_c(text[2:-1]), "$" + text[2:-1])
    elif kind == "translated_string":
        inner = text[2:-1]
        yield ("alt", _double_quoted(inner), "$" + _double_quoted(inner))
        if "$" in inner or "`" in inner:
            yield ("unk", 'an expansion inside $"…"')
    elif kind == "string":
        yield from _string(node, state)
    elif kind == "concatenation":
        previous = None
        for child in node.children:
            if previous is not None and previous.end_byte != child.start_byte:
                state.unreadable("words the shell joins and the parser splits")
            previous = child
            if not child.is_named:
                state.unreadable(f"a word this reader does not know ({child.type!r})")
                yield ("unk", "unreadable")
                continue
            yield from _parts(child, state, quoted=quoted)
    elif kind == "brace_expression":
        yield ("lit", text, "q" if quoted else "")
    elif kind == "simple_expansion" or kind == "expansion":
        yield from _expansion(node, state)
    elif kind == "command_substitution":
        state.substitution(node, state)
        yield ("unk", "command substitution")
    elif kind == "process_substitution":
        state.substitution(node, state)
        yield ("unk", "process substitution")
    elif kind == "arithmetic_expansion":
        for child in node.named_children:
            _arithmetic(child, state)
        yield ("unk", "arithmetic")
    else:
        state.unreadable(f"a word this reader does not know ({kind})")
        yield ("unk", kind)


def _first_part(node: tree_sitter.Node) -> bool:
    """The node starts the word it is in (nothing before it in its concatenation or string)."""
    while node.parent is not None and node.parent.type in ("concatenation", "string"):
        first = node.parent.children[0]
        if node.parent.type == "string":
            if node.start_byte != node.parent.start_byte + 1:
                return False
        elif first.start_byte != node.start_byte:
            return False
        node = node.parent
    return True


def _string(node: tree_sitter.Node, state: _State) -> Iterator[_Part]:
    """ "…": the text between its expansions is taken from the source, so nothing is skipped."""
    inner = [c for c in node.children if c.is_named]
    start = node.start_byte + 1
    for child in inner:
        if child.type == "string_content":
            continue
        if child.start_byte > start:
            literal = state.source[start : child.start_byte].decode("utf-8", "replace")
            yield ("lit", _double_quoted(literal), "q")
        yield from _parts(child, state, quoted=True)
        start = child.end_byte
    end = node.end_byte - 1
    if end > start:
        yield ("lit", _double_quoted(state.source[start:end].decode("utf-8", "replace")), "q")


def _expansion(node: tree_sitter.Node, state: _State) -> Iterator[_Part]:
    named = node.named_children
    ops = [c.type for c in node.children if not c.is_named and c.type not in ("$", "${", "}")]
    name = state.text(named[0]) if named and named[0].type in ("variable_name",) else ""
    if node.type == "simple_expansion" or (not ops and len(named) == 1 and name):
        if name == "HOME":
            yield ("home",) if node.type == "simple_expansion" else ("lit", HOME, "q")
            return
        if name == "PWD":
            if state.cwd is None:
                yield ("unk", "$PWD after a cd somewhere unknown")
            elif node.type == "simple_expansion":
                yield ("pwd",)
            else:
                yield ("lit", ".", "q") if _first_part(node) else ("unk", "$PWD inside a word")
            return
        if named and named[0].type not in ("variable_name", "special_variable_name"):
            state.unreadable(f"a word this reader does not know ({named[0].type})")
        yield ("unk", f"${name or state.text(node)[1:]}")
        return
    if any(op not in _SAFE_EXPANSION_OPS for op in ops) or any(
        c.type == "subscript" for c in named
    ):
        bad = [op for op in ops if op not in _SAFE_EXPANSION_OPS] or ["[…]"]
        state.unreadable(f"an expansion that evaluates its text ({bad[0]})")
    for child in named[1:]:
        if child.type in _WORDISH:
            _word(child, state)  # ${x:-$(cmd)} runs cmd when x is empty
    yield ("unk", state.text(node))


def _substitution(node: tree_sitter.Node, state: _State) -> None:
    """The commands a substitution runs are commands too; a backquoted one is read again."""
    if state.depth >= MAX_DEPTH:
        state.unreadable("substitutions nested too deep")
        return
    saved_cwd, saved_context = state.cwd, state.context
    state.depth += 1
    state.operators.append("substitution")
    state.context = state.context or node.type.replace("_", " ")
    try:
        text = state.text(node)
        if text.startswith("`"):
            inner = re.sub(r"\\([$`\\])", r"\1", text[1:-1])
            _walk_statements(_parser().parse(inner.encode()).root_node, _backquoted(state, inner))
        else:
            for child in node.named_children:
                if child.type != "comment":
                    _statement(child, state)
    finally:
        state.depth -= 1
        state.cwd, state.context = saved_cwd, saved_context


def _backquoted(state: _State, text: str) -> _State:
    """The state for reading a backquoted substitution's own text (read again, unescaped):
    the same lists, so what it finds is recorded with the rest."""
    return _State(
        state.workspace,
        text.encode(),
        state.substitution,
        cwd=state.cwd,
        commands=state.commands,
        operators=state.operators,
        redirects=state.redirects,
        opaque=state.opaque,
        numeric=state.numeric,
        depth=state.depth,
        context=state.context,
    )
