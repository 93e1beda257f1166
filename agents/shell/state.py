"""The reading of one command line in progress (`_State`: what it has found so far, where
the commands run), and the tree-sitter grammar commands are parsed with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import tree_sitter
import tree_sitter_bash

from agents.shell.data import Redirect
from agents.shell.paths import ROOT, _place
from agents.shell.script import Command

_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
# One parser per thread: py-tree-sitter holds the GIL while it parses today, but a parser keeps
# state during a parse and is not meant to be shared should that change (py-tree-sitter #111).
_LOCAL = threading.local()


def _parser() -> tree_sitter.Parser:
    parser = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = tree_sitter.Parser(_LANGUAGE)
    return parser


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
