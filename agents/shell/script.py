"""What a command line runs, as `parse` returns it: each simple command (`Command`) and the
whole line (`Script`), which also says where its path values land.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agents.shell.data import Options, Redirect, Word
from agents.shell.options import split_options
from agents.shell.paths import ROOT, _place
from agents.shell.programs import family


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
