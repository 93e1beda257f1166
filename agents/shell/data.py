"""The plain values a command is read into: a word and every value it may become, a
redirection, and a command's flags and operands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath


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
