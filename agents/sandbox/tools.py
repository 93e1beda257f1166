"""The tools an agent can call: their schemas, input checks, and the workspace ones' execution."""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema

from agents.sandbox.bash import run_command
from agents.sandbox.fleet_tools import FLEET_TOOL_SCHEMAS, FLEET_TOOLS
from agents.sandbox.limits import Limits
from agents.sandbox.workspace import ToolInputError, Workspace

if TYPE_CHECKING:
    from agents.sandbox.egress import EgressProxy

MAX_CONTENT_BYTES = 5 * 1024 * 1024  # write_file content, edit_file strings
# A single argv string may not exceed 128 KiB on Linux; longer scripts belong in a file.
MAX_COMMAND_CHARS = 100_000
MAX_READ_BYTES = 64 * 1024 * 1024  # read_file loads the whole file; bigger ones go through bash


@dataclass
class ToolResult:
    """One tool call's outcome: the (already capped) text the model reads, plus extras for the log."""

    output: str
    is_error: bool = False
    data: dict = field(default_factory=dict)


_STRING_LIST = {"type": "array", "items": {"type": "string"}, "default": []}

TOOL_SCHEMAS: list[dict] = [
    {
        "name": "bash",
        "description": (
            "Run a shell command (/bin/sh -c) in the workspace folder and get its combined "
            "stdout and stderr, followed by a last line with the exit code. The working "
            "directory is the workspace root; only the workspace lasts: HOME and /tmp may start "
            "empty at every call, and nothing else carries over between calls (no cd, no "
            "exported variables, and background processes are killed when the command ends), "
            "so chain steps with && in one command. Commands have limits on memory, processes "
            "and CPU time; the last line says when one stopped a command. Standard input is "
            "empty, so never run anything interactive: pass flags such as -y, and avoid pagers "
            "and editors. There may be no network access, or only HTTP(S) through a proxy that "
            "refuses hosts this run may not reach (its message says why and whether approval "
            "was asked for). Long output keeps only its beginning "
            "and end: filter it (grep, head, tail) or redirect it to a file and read parts of "
            "it. Prefer read_file, write_file and edit_file over cat, echo or sed for files."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command to run."},
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": (
                        "Seconds to allow before the command and all its child processes "
                        "are killed. Optional; the default is also the maximum."
                    ),
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "name": "read_file",
        "description": (
            "Read a UTF-8 text file from the workspace. Returns the file's text exactly as "
            "stored (no line numbers added). Very long files are cut and the output says which "
            "lines were shown; use offset and limit to read the rest. For binary files use bash."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the workspace root, e.g. src/app.py.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to return, counting from 1. Default: 1.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Most lines to return. Default: as many as fit.",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "write_file",
        "description": (
            "Create a file in the workspace, or replace an existing file's whole content. "
            "Missing parent folders are created. To change part of an existing file, "
            "edit_file is safer and cheaper."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the workspace root.",
                },
                "content": {
                    "type": "string",
                    "description": "The complete new content of the file (UTF-8 text).",
                },
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    {
        "name": "edit_file",
        "description": (
            "Replace one exact piece of text in a workspace file. old_string must appear in "
            "the file exactly once, character for character, including whitespace and "
            "indentation; include a few surrounding lines to make it unique. Read the file "
            "first so you copy the current text. To delete text, use an empty new_string."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the workspace root.",
                },
                "old_string": {
                    "type": "string",
                    "description": "The exact text to replace; must occur exactly once.",
                },
                "new_string": {
                    "type": "string",
                    "description": "The text to put in its place.",
                },
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": False,
        },
    },
    {
        "name": "list_files",
        "description": (
            "List the files under a workspace folder, recursively, with their sizes, as paths "
            "relative to the workspace root (.git and __pycache__ folders are skipped). Long "
            "listings are cut and say how many entries were left out; list a subfolder to "
            "see more."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Folder relative to the workspace root. Default: the root.",
                    "default": ".",
                },
            },
            "additionalProperties": False,
        },
    },
    {
        "name": "save_artifact",
        "description": (
            "Publish a workspace file as an artifact of this run, so the people overseeing it "
            "can find and download it. Use it for deliverables (a report, a patch, a result "
            "file), not for every file you touch. The file must already exist; saving again "
            "under the same name records a new version."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Path of an existing workspace file, relative to the root.",
                },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Display name for the artifact. Default: the file name.",
                },
                "kind": {
                    "type": "string",
                    "enum": ["file", "report"],
                    "default": "file",
                    "description": (
                        "'report' for a human-readable write-up of findings or results, "
                        "'file' for anything else. Default: 'file'."
                    ),
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "remember",
        "description": (
            "Save something worth knowing later under a short key: a fact about the project, a "
            "command that works, a pitfall (e.g. key 'tests', text 'run make deps before the "
            "tests'). Every later session is told the run's memory when it starts; with project "
            "true, every later run of this run's project is told it too. Saving under a key "
            "that exists replaces its text."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "key": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "A short name for the entry.",
                },
                "text": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 4000,
                    "description": "What to remember, self-contained.",
                },
                "project": {
                    "type": "boolean",
                    "default": False,
                    "description": "Also share it with later runs of the project.",
                },
            },
            "required": ["key", "text"],
            "additionalProperties": False,
        },
    },
    {
        "name": "recall",
        "description": (
            "Search the run's and the project's memory (case-insensitive, by words of the key "
            "or text); '*' lists everything. Use it for entries your first message listed as "
            "left out."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 500,
                    "description": "Words to look for, or '*'.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
    {
        "name": "handoff",
        "description": (
            "End this shift and hand the work over to the next shift, which starts with a "
            "fresh context and knows only the workspace and this note. Call it when you have "
            "made good progress but the task is not finished, or when your context is getting "
            "long. Make the note self-contained: what the task is, what state the work is in, "
            "which files matter, and exactly what to do next."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "summary": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Where the task stands, written for someone starting cold.",
                },
                "done": {
                    **_STRING_LIST,
                    "description": "What has been completed (and checked) so far.",
                },
                "next_steps": {
                    **_STRING_LIST,
                    "description": "Concrete next actions, most important first.",
                },
                "open_questions": {
                    **_STRING_LIST,
                    "description": "Doubts, risks or decisions that still need an answer.",
                },
            },
            "required": ["summary"],
            "additionalProperties": False,
        },
    },
    {
        "name": "finish",
        "description": (
            "Declare the task complete and stop. Only call it when the work is done and "
            "checked (for example, tests pass); if anything is left, use handoff instead."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "summary": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What was done, where the results are, and how it was checked.",
                },
            },
            "required": ["summary"],
            "additionalProperties": False,
        },
    },
]

TOOL_SCHEMAS += FLEET_TOOL_SCHEMAS
WORKSPACE_TOOLS = frozenset({"bash", "read_file", "write_file", "edit_file", "list_files"})
HARNESS_TOOLS = (
    frozenset({"save_artifact", "handoff", "finish", "remember", "recall"}) | FLEET_TOOLS
)

_SCHEMAS = {tool["name"]: tool["input_schema"] for tool in TOOL_SCHEMAS}
TOOL_NAMES = frozenset(_SCHEMAS)
_VALIDATORS = {name: jsonschema.Draft202012Validator(schema) for name, schema in _SCHEMAS.items()}
_JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}
_SIZE_CAPPED = {
    "bash": {"command": MAX_COMMAND_CHARS},
    "write_file": {"content": MAX_CONTENT_BYTES},
    "edit_file": {"old_string": MAX_CONTENT_BYTES, "new_string": MAX_CONTENT_BYTES},
}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _describe(error: jsonschema.ValidationError, name: str) -> str:
    """One readable sentence for a schema error. Never echoes a (possibly huge) value."""
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        return f"{name}: missing required field '{missing[0]}'"
    if error.validator == "additionalProperties":
        allowed = error.schema.get("properties", {})
        extra = sorted(key for key in error.instance if key not in allowed)
        return f"{name}: unexpected field '{extra[0]}' (allowed: {', '.join(allowed)})"
    where = "field '" + ".".join(str(part) for part in error.absolute_path) + "'"
    if error.validator == "type":
        return f"{name}: {where} must be of type {error.validator_value}, got {_json_type(error.instance)}"
    if error.validator == "enum":
        options = ", ".join(str(option) for option in error.validator_value)
        return f"{name}: {where} must be one of: {options}"
    if error.validator == "minLength":
        return f"{name}: {where} must not be empty"
    if error.validator in ("minimum", "exclusiveMinimum"):
        relation = "at least" if error.validator == "minimum" else "greater than"
        return f"{name}: {where} must be {relation} {error.validator_value}"
    message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
    return f"{name}: {where}: {message}"


def validate_input(name: str, tool_input: object) -> dict:
    """Check a tool call's input against its schema; return it with schema defaults filled in.

    Raises ToolInputError with a message meant for the model.
    """
    if name not in _SCHEMAS:
        known = ", ".join(tool["name"] for tool in TOOL_SCHEMAS)
        raise ToolInputError(f"unknown tool {name!r}; known tools: {known}")
    if not isinstance(tool_input, dict):
        raise ToolInputError(
            f"input for {name} must be a JSON object, got {_json_type(tool_input)}"
        )

    errors = sorted(_VALIDATORS[name].iter_errors(tool_input), key=lambda e: list(e.path))
    if errors:
        raise ToolInputError(_describe(errors[0], name))

    for key, cap in _SIZE_CAPPED.get(name, {}).items():
        value = tool_input.get(key, "")
        size = len(value) if key == "command" else len(value.encode("utf-8", "replace"))
        if size > cap:
            unit = "characters" if key == "command" else "bytes"
            hint = (
                "write the script to a file with write_file and run that"
                if key == "command"
                else "split it into smaller pieces"
            )
            raise ToolInputError(
                f"{name}: field '{key}' is too large ({size} {unit}, limit {cap}); {hint}"
            )

    result = dict(tool_input)
    for key, spec in _SCHEMAS[name]["properties"].items():
        if key not in result and "default" in spec:
            result[key] = copy.deepcopy(spec["default"])
    return result


def execute(
    workspace: Workspace,
    name: str,
    tool_input: object,
    *,
    should_stop: Callable[[], bool] | None = None,
    bash_timeout: float = 120.0,
    output_limit: int = 30_000,
    extra_env: dict[str, str] | None = None,
    isolation: str | None = None,
    limits: Limits | None = None,
    toolchain: Sequence[str] | None = None,
    egress: EgressProxy | None = None,
    validated: bool = False,
) -> ToolResult:
    """Run one workspace tool. Bad input and file errors come back as is_error results.
    `validated`: the input is validate_input's own result (the runtime's gate made it), so it
    is not checked a second time.

    limits, toolchain and egress go to run_command for bash (see there)."""
    if name in HARNESS_TOOLS:
        raise ValueError(f"{name} is a harness tool; the runtime executes it, not the sandbox")
    try:
        args = tool_input if validated else validate_input(name, tool_input)
        if name == "bash":
            return _bash(
                workspace,
                args,
                should_stop,
                bash_timeout,
                output_limit,
                extra_env,
                isolation,
                limits=limits,
                toolchain=toolchain,
                egress=egress,
            )
        if name == "read_file":
            return _read_file(workspace, args, output_limit)
        if name == "write_file":
            return _write_file(workspace, args)
        if name == "edit_file":
            return _edit_file(workspace, args)
        if name == "list_files":
            listing = workspace.listing(path=args["path"])
            folder = workspace.relative(workspace.resolve(args["path"]))
            return ToolResult(_cap(listing, output_limit), data={"path": folder})
        raise AssertionError(f"no executor for workspace tool {name}")
    except ToolInputError as e:
        return ToolResult(str(e), is_error=True, data={"error": type(e).__name__})
    except OSError as e:
        path = tool_input.get("path", "") if isinstance(tool_input, dict) else ""
        return ToolResult(
            _os_error_message(e, path), is_error=True, data={"error": type(e).__name__}
        )


def _bash(
    workspace: Workspace,
    args: dict,
    should_stop: Callable[[], bool] | None,
    bash_timeout: float,
    output_limit: int,
    extra_env: dict[str, str] | None,
    isolation: str | None = None,
    *,
    limits: Limits | None = None,
    toolchain: Sequence[str] | None = None,
    egress: EgressProxy | None = None,
) -> ToolResult:
    timeout = min(args.get("timeout", bash_timeout), bash_timeout)
    result = run_command(
        args["command"],
        workspace=workspace,
        timeout=timeout,
        output_limit=output_limit,
        should_stop=should_stop,
        extra_env=extra_env,
        isolation=isolation,
        limits=limits,
        toolchain=toolchain,
        egress=egress,
    )
    if result.timed_out:
        status = f"[timed out after {timeout:g}s; process group killed]"
    elif result.cancelled:
        status = "[cancelled]"
    elif result.exit_code is None:
        status = "[stopped]"  # by a limit: the note says which
    else:
        status = f"[exit code {result.exit_code}]"
    if result.note:
        status = f"{status[:-1]}; {result.note}]"
    text = result.output
    if text and not text.endswith("\n"):
        text += "\n"
    return ToolResult(
        output=f"{text}{status}",
        is_error=result.exit_code != 0,
        data={
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "cancelled": result.cancelled,
            "truncated": result.truncated,
            "duration_ms": round(result.duration_ms, 1),
            "isolation": result.isolation,
            "limits": result.limits,
            "exceeded": result.exceeded,
        },
    )


def _read_text(path: Path, shown_as: str) -> str:
    """A file's text, with line endings untouched so an edit writes them back the same."""
    info = path.stat()
    if stat.S_ISDIR(info.st_mode):
        raise ToolInputError(f"{shown_as} is a directory; use list_files to see what is in it")
    if not stat.S_ISREG(info.st_mode):
        # A FIFO or device would block or never end.
        raise ToolInputError(f"{shown_as} is not a regular file")
    size = info.st_size
    if size > MAX_READ_BYTES:
        raise ToolInputError(
            f"{shown_as} is {size} bytes, too big to read whole; use bash (head, sed -n, grep)"
        )
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ToolInputError(
            f"{shown_as} is not a UTF-8 text file (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}); inspect it with bash, e.g. `file {shown_as}` or `xxd {shown_as} | head`"
        ) from e


def _read_file(workspace: Workspace, args: dict, output_limit: int) -> ToolResult:
    path = workspace.resolve(args["path"])
    rel = workspace.relative(path)
    text = _read_text(path, rel)
    lines = text.splitlines(keepends=True)
    total = len(lines)
    data = {"path": rel, "bytes": len(text.encode("utf-8")), "lines": total}
    if total == 0:
        return ToolResult(f"[{rel} is empty]", data=data)

    first = args.get("offset", 1)
    if first > total:
        raise ToolInputError(f"offset {first} is past the end of {rel}, which has {total} lines")
    wanted = lines[first - 1 : first - 1 + args["limit"]] if "limit" in args else lines[first - 1 :]

    shown: list[str] = []
    used = 0
    cut = False
    for line in wanted:
        if used + len(line) > output_limit:
            cut = True
            if shown:
                break
            line = line[:output_limit] + "\n"  # a single line longer than the whole budget
        shown.append(line)
        used += len(line)
    last = first + len(shown) - 1
    body = "".join(shown)
    if cut or first > 1 or last < total:
        if not body.endswith("\n"):
            body += "\n"
        note = f"[showing lines {first}-{last} of {total}"
        if cut:
            note += f"; output cut at {output_limit} characters"
        if last < total:
            note += f"; use offset={last + 1} to read on"
        body += note + "]"
    data["truncated"] = cut
    return ToolResult(body, data=data)


def _write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a new, unnamed file in the same folder,
    given its name only once written, by a rename over the old one. A full disk or a worker
    killed mid-write leaves the old content (and no stray file), never a truncated one; a
    symlink swapped in at `path` since resolve() is replaced, never written through. A file that
    was there keeps its permission bits."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        mode = 0o644
    else:
        if not stat.S_ISREG(st.st_mode):
            raise ToolInputError(f"{path.name} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
    folder = path.parent
    try:
        fd = os.open(folder, os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600)
        named = None
    except OSError:  # a filesystem without O_TMPFILE: a named temporary file
        fd, named = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    tmp = named or os.path.join(folder, f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fchmod(file.fileno(), mode)
            if named is None:
                _name_unnamed(file.fileno(), folder, os.path.basename(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _name_unnamed(fd: int, folder: Path, name: str) -> None:
    """Give the O_TMPFILE file `fd` a name in `folder`. (A dst_dir_fd makes os.link use linkat
    with AT_SYMLINK_FOLLOW, which links the file /proc's magic link stands for, not the link.)"""
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(dir_fd)


def _write_file(workspace: Workspace, args: dict) -> ToolResult:
    path = workspace.resolve(args["path"])
    rel = workspace.relative(path)
    if path.is_dir():
        raise ToolInputError(f"{rel} is a directory; give a file path")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ToolInputError(
            f"cannot write {rel}: a part of that path is a file, not a folder"
        ) from e
    data = args["content"].encode("utf-8", "replace")
    _write_bytes(path, data)
    verb = "overwrote" if existed else "created"
    return ToolResult(f"{verb} {rel} ({len(data)} bytes)", data={"path": rel, "bytes": len(data)})


def _edit_file(workspace: Workspace, args: dict) -> ToolResult:
    path = workspace.resolve(args["path"])
    rel = workspace.relative(path)
    old, new = args["old_string"], args["new_string"]
    if not old:
        raise ToolInputError(
            "old_string is empty; to create or replace a whole file use write_file"
        )
    if old == new:
        raise ToolInputError("old_string and new_string are the same; nothing to change")
    text = _read_text(path, rel)
    count = text.count(old)
    if count == 0:
        raise ToolInputError(
            f"old_string not found in {rel}; read the file again and copy the text exactly, "
            "including whitespace and indentation"
        )
    if count > 1:
        raise ToolInputError(
            f"old_string occurs {count} times in {rel}; give more context so it is unique"
        )
    start = text.index(old)
    line = text.count("\n", 0, start) + 1
    updated = text[:start] + new + text[start + len(old) :]
    data = updated.encode("utf-8", "replace")
    _write_bytes(path, data)
    return ToolResult(f"edited {rel} at line {line}", data={"path": rel, "bytes": len(data)})


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output cut at {limit} characters]"


def _os_error_message(error: OSError, path: str) -> str:
    where = path or error.filename or "file"
    if isinstance(error, FileNotFoundError):
        return f"{where}: no such file or directory"
    if isinstance(error, IsADirectoryError):
        return f"{where} is a directory; use list_files to see what is in it"
    if isinstance(error, NotADirectoryError):
        return f"{where}: a part of this path is a file, not a folder"
    if isinstance(error, PermissionError):
        return f"{where}: permission denied"
    return f"{where}: {error.strerror or error}"
