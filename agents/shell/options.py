"""A command's flags and operands, read as its program family reads them (the rules are
the package's docstring, Commands: flags), and per family which flags cluster, which take a
value, and which long spellings fold into a short one.

The tables live beside the one function that reads them. Imported, they would also cost time:
CPython 3.11 compiles a method call on a name bound by `from … import` (`VALUE_OPTIONS.get(…)`)
to make a bound method on every call, and split_options runs for every command the policy reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from agents.shell.data import Options, Word
from agents.shell.programs import SHELLS

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
