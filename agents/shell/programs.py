"""What programs are, as far as reading a command goes: shells, interpreters and the flags
that give them code, builtins that cannot be read plainly, wrappers and the options they take,
and per program family which flags cluster, take a value or have long spellings.

Plain tables (and `family`), read by the option splitter, the command reader and the checks.
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
