"""The risk classifier: what a parsed bash command (agents.shell) may do that a person should
know of before it runs: reach the network, delete widely, change permissions or the system,
write outside the workspace, or be unreadable plainly. agents/policy.py asks a person when no
rule decides and the classifier finds a risk."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agents import shell

# --- the risk classifier ----------------------------------------------------------------------
NETWORK = "reaches the network"
DELETES = "deletes widely"
SYSTEM = "changes permissions or the system"
WRITES = "writes outside the workspace"
RISKS = (NETWORK, DELETES, SYSTEM, WRITES)
OPAQUE = "cannot be read plainly"  # risks naming why start with this: "cannot be read plainly: …"

NETWORK_PROGRAMS = frozenset(
    {"curl", "wget", "ssh", "scp", "sftp", "rsync", "nc", "ncat", "netcat", "socat", "telnet"}
    | {"ftp", "aria2c", "http", "https", "xh", "lynx", "w3m"}
)
PACKAGE_MANAGERS = frozenset(
    {"pip", "pipx", "uv", "poetry", "pdm", "npm", "pnpm", "yarn", "bun", "gem", "cargo", "go"}
    | {"apt", "apt-get", "brew", "conda", "mamba", "composer"}
)
NETWORK_SUBCOMMANDS = frozenset(
    {"install", "i", "ci", "add", "get", "download", "publish", "update", "upgrade", "sync"}
    | {"fetch", "require"}
)
GIT_NETWORK = frozenset({"push", "pull", "fetch", "clone", "ls-remote"})
SYSTEM_PROGRAMS = frozenset(
    {"sudo", "su", "doas", "chown", "chgrp", "mount", "umount", "systemctl", "service"}
    | {"useradd", "usermod", "userdel", "groupadd", "groupdel", "passwd", "crontab", "iptables"}
    | {"ip6tables", "nft", "mkfs", "dd", "fdisk", "parted", "shutdown", "reboot", "halt"}
    | {"poweroff", "chroot", "insmod", "modprobe", "rmmod", "sysctl", "setcap", "chattr"}
    | {"visudo", "launchctl", "runuser"}
)
# Programs every operand of which they create, change or remove.
WRITES_EVERY_OPERAND = frozenset(
    {"rm", "rmdir", "unlink", "shred", "mkdir", "touch", "truncate", "ln", "mv", "tee"}
    | {"install", "mkfifo", "mknod", "setfacl", "chattr"}
)
WRITES_LAST_OPERAND = frozenset({"cp", "rsync", "scp"})
WRITES_BUT_FIRST = frozenset({"chmod", "chown", "chgrp"})  # the first is a mode or an owner
# Option values that name a place written to.
WRITING_OPTIONS: dict[str, frozenset[str]] = {
    "cp": frozenset({"-t", "--target-directory"}),
    "mv": frozenset({"-t", "--target-directory"}),
    "ln": frozenset({"-t", "--target-directory"}),
    "install": frozenset({"-t", "--target-directory"}),
    "sort": frozenset({"-o", "--output"}),
    "tar": frozenset({"-C", "-f", "--directory", "--file"}),
    "unzip": frozenset({"-d"}),
    "git": frozenset({"-C", "--git-dir", "--work-tree"}),
}
# Programs whose risk depends on their arguments: an argument only known when it runs (a
# variable, a substitution, xargs input) makes them unreadable.
ARGUMENTS_DECIDE = (
    WRITES_EVERY_OPERAND
    | WRITES_LAST_OPERAND
    | WRITES_BUT_FIRST
    | PACKAGE_MANAGERS
    | frozenset({"find", "git", "sed", "sort", "tar", "unzip", "dd", "python"})
)
# Redirection targets that are not files.
HARMLESS_TARGETS = re.compile(r"/dev/(null|stdout|stderr|tty|zero|fd/\d+)|/proc/self/fd/\d+")
# Wrappers a similar command may be run through: they do not change what runs.
NEUTRAL_WRAPPERS = frozenset(
    {"command", "builtin", "exec", "env", "nice", "nohup", "time", "timeout", "stdbuf"}
    | {"ionice", "setsid", "busybox"}
)


def classify(script: shell.Script) -> list[str]:
    """Names of the risks a parsed command shows (RISKS in order, then why it cannot be read)."""
    found: dict[str, None] = {}
    for command in script.commands:
        for risk in _command_risks(command, script):
            found[risk] = None
    for redirect in script.redirects:
        if redirect.writes:
            for risk in _written(script, redirect.target, redirect.cwd, "a redirection", True):
                found[risk] = None
    named = [r for r in RISKS if r in found]
    unread = [f"{OPAQUE}: {why}" for why in script.opaque]
    unread += [r for r in found if r not in RISKS and r not in unread]
    return named + unread


def classify_bash(command: str, *, workspace: Path | str | None = None) -> list[str]:
    """Names of the risks a shell command shows; empty when it looks contained.

    Without a workspace, every absolute path counts as outside it."""
    return classify(shell.parse(command, workspace=workspace))


def _flat(command: shell.Command) -> list[shell.Word]:
    """Its arguments with braces and sh-or-bash readings spread out, as separate words: a risk
    seen in any reading counts."""
    flat: list[shell.Word] = []
    for word in command.args:
        if word.unknown or len(word.values) == 1:
            flat.append(word)
        else:
            flat.extend(shell.Word(word.source, (v,), "", (g,)) for v, g in word.readings())
    return flat


def _command_risks(command: shell.Command, script: shell.Script) -> list[str]:
    program = command.program or ""
    fam = command.family
    args = _flat(command)
    opts = shell.split_options(fam, args)
    operands = [w.value for w in opts.operands]
    risks: list[str] = []
    if any(w in ("sudo", "doas") for w in command.wrappers):
        risks.append(SYSTEM)
    unknown = [w for w in args if w.unknown]
    if unknown and (program in ARGUMENTS_DECIDE or fam in ARGUMENTS_DECIDE):
        risks.append(
            f"{OPAQUE}: the arguments of {program} are only known when it runs "
            f"({unknown[0].unknown})"
        )
    # the network
    if program in NETWORK_PROGRAMS:
        risks.append(NETWORK)
    if fam in PACKAGE_MANAGERS and any(o in NETWORK_SUBCOMMANDS for o in operands):
        risks.append(NETWORK)
    pip_module = fam == "python" and any(re.fullmatch(r"-m pip\d*", f) for f in opts.flags)
    if pip_module and any(o in NETWORK_SUBCOMMANDS for o in operands):
        risks.append(NETWORK)
    if fam == "git" and any(o in GIT_NETWORK for o in operands):
        risks.append(NETWORK)
    # deleting
    if program == "rm" and opts.flags & {"-r", "-f"}:
        risks.append(DELETES)
    if program == "shred":
        risks.append(DELETES)
    if program == "find" and "-delete" in [w.value for w in args]:
        risks.append(DELETES)
    forced = any(re.fullmatch(r"-f+", f) for f in opts.flags) and "-n" not in opts.flags
    if fam == "git" and "clean" in operands and forced:
        risks.append(DELETES)
    # the system
    if program in SYSTEM_PROGRAMS or fam == "mkfs":
        risks.append(SYSTEM)
    if program == "chmod" and "-R" in opts.flags:
        risks.append(SYSTEM)
    # writing
    for word in _written_words(command, fam, opts, args):
        if not (word.unknown and unknown and program in ARGUMENTS_DECIDE):  # said once above
            risks.extend(_written(script, word, command.cwd, program, program == "tee"))
    return risks


def _written_words(
    command: shell.Command, fam: str, opts: shell.Options, args: list[shell.Word]
) -> list[shell.Word]:
    program = command.program or ""
    operands = list(opts.operands)
    words: list[shell.Word] = []
    if program in WRITES_EVERY_OPERAND:
        words += operands
    elif program in WRITES_LAST_OPERAND:
        words += operands[-1:]
    elif program in WRITES_BUT_FIRST:
        words += operands if any(f.startswith("--reference") for f in opts.flags) else operands[1:]
    elif program == "dd":
        words += [
            shell.Word(w.source, (w.value[3:],)) for w in operands if (w.value or "")[:3] == "of="
        ]
    elif program == "sed" and any(
        f == "--in-place" or (f.startswith("-i") and " " not in f) for f in opts.flags
    ):
        scripted = any(name in ("-e", "--expression", "-f", "--file") for name, _ in opts.values)
        words += operands if scripted else operands[1:]
    elif program == "tar":
        words += operands
    elif program == "find":
        values = [w.value for w in args]
        for i, text in enumerate(values[:-1]):
            if text in ("-fprint", "-fprint0", "-fprintf", "-fls"):
                words.append(args[i + 1])
    writing = WRITING_OPTIONS.get(fam, frozenset())
    words += [word for name, word in opts.values if name in writing]
    return words


def _written(
    script: shell.Script, word: shell.Word, cwd: Any, what: str, devices: bool = False
) -> list[str]:
    """The risk of writing to `word`: none inside the workspace (or, for a redirection or tee,
    /dev/null and the like), else outside or unknown."""
    if word.unknown:
        return [f"{OPAQUE}: {what} writes to {word.source}, only known when it runs"]
    readings = [
        (v, g) for v, g in word.readings() if not (devices and HARMLESS_TARGETS.fullmatch(v))
    ]
    if all(script.place(v, cwd, glob=g) is not None for v, g in readings):
        return []
    return [WRITES]
