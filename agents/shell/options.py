"""A command's flags and operands, read as its program family reads them (the rules are
the package's docstring, Commands: flags).
"""

from __future__ import annotations

from collections.abc import Iterable

from agents.shell.data import Options, Word
from agents.shell.programs import _LONG_OPTIONS, CLUSTERING, FLAG_ALIASES, VALUE_OPTIONS


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
