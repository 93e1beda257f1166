"""Reading a shell command the way the shell will, so the tool policy judges what runs, not its text.

`parse(command, workspace=...)` turns a command line into plain data (a `Script`): the simple
commands it runs, how they are joined, their redirections, and every reason it cannot be read
plainly (`Script.opaque`). tree-sitter-bash does the parsing; this package resolves what the shell
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
words tree-sitter splits differently from the shell, and anything it cannot parse or this package
does not know.

The modules, top to bottom; each imports only modules below it:
- parser: `parse`, and the cache of recent readings
- statements: the walk over tree-sitter's statements, and the commands inside substitutions
- words: words and arithmetic as tree-sitter gives them
- commands: a simple command's program under its wrappers, and what it does to the rest
- opaque: the programs whose arguments can be code
- state: one reading in progress, and the tree-sitter grammar
- script: `Command` and `Script`, what `parse` returns
- options: a command's flags and operands, and the option tables per program family
- data: `Word`, `Redirect`, `Options`
- expand: quotes, escapes, braces and `~`, from text to values
- paths: where a value lands against the workspace
- programs: what programs are (shells, interpreters, builtins, wrappers)
"""

from __future__ import annotations

from agents.shell.data import Options, Redirect, Word
from agents.shell.expand import MAX_VALUES
from agents.shell.options import CLUSTERING, FLAG_ALIASES, VALUE_OPTIONS, split_options
from agents.shell.parser import CACHED_LENGTH, parse
from agents.shell.paths import HOME, ROOT
from agents.shell.programs import (
    AWKS,
    GENERIC_WRAPPERS,
    INTERPRETERS,
    OPAQUE_PROGRAMS,
    SHELLS,
    SPECIAL_VARIABLES,
    family,
)
from agents.shell.script import Command, Script
from agents.shell.statements import MAX_DEPTH

__all__ = [
    "AWKS",
    "CACHED_LENGTH",
    "CLUSTERING",
    "FLAG_ALIASES",
    "GENERIC_WRAPPERS",
    "HOME",
    "INTERPRETERS",
    "MAX_DEPTH",
    "MAX_VALUES",
    "OPAQUE_PROGRAMS",
    "ROOT",
    "SHELLS",
    "SPECIAL_VARIABLES",
    "VALUE_OPTIONS",
    "Command",
    "Options",
    "Redirect",
    "Script",
    "Word",
    "family",
    "parse",
    "split_options",
]
