"""What programs are, as far as reading a command goes: shells, interpreters and the flags
that give them code, builtins that cannot be read plainly, variables that change how words are
read, and wrappers with the options they take.

Plain tables (and `family`), read by the command reader, the option splitter and the checks.
"""

from __future__ import annotations

import re

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
# Programs that run the rest of their command line as a command, with options this reader does
# not model: every later position may be where the command starts.
GENERIC_WRAPPERS = frozenset(
    {"strace", "ltrace", "valgrind", "unshare", "nsenter", "firejail", "fakeroot", "faketime"}
    | {"proxychains", "proxychains4", "torsocks", "chrt", "taskset", "numactl", "flock"}
    | {"unbuffer", "catchsegv", "chronic", "systemd-run", "bwrap", "chroot", "perf", "gdb"}
)
# Runners whose subcommand `run`/`exec`/`x` runs the rest as a command.
_RUNNERS = frozenset({"uv", "poetry", "pipenv", "conda", "mamba", "pdm", "hatch", "rye"})


def family(program: str) -> str:
    """The name a program's rules go by: python3.11 is python, pip3 is pip, nodejs is node."""
    if m := re.fullmatch(r"(python|pypy|pip|perl|ruby|php|lua|node|pydoc)[\d.]*(js)?", program):
        name = m.group(1)
        return "python" if name == "pypy" else name
    if program.startswith("mkfs."):
        return "mkfs"
    return program
