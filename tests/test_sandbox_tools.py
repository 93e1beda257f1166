"""Tool schemas, input validation, and the workspace tools run against real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from agents.sandbox import (
    HARNESS_TOOLS,
    TOOL_SCHEMAS,
    WORKSPACE_TOOLS,
    ToolInputError,
    ToolResult,
    Workspace,
    execute,
    validate_input,
)

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer

FIVE_MB = 5 * 1024 * 1024


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret")
    return folder


# --- schemas ---------------------------------------------------------------


def test_schemas_cover_every_tool_once() -> None:
    names = [tool["name"] for tool in TOOL_SCHEMAS]
    assert len(names) == len(set(names))
    assert set(names) == WORKSPACE_TOOLS | HARNESS_TOOLS
    assert not WORKSPACE_TOOLS & HARNESS_TOOLS


@pytest.mark.parametrize("tool", TOOL_SCHEMAS, ids=lambda tool: tool["name"])
def test_schema_is_a_valid_messages_api_tool(tool: dict) -> None:
    assert set(tool) == {"name", "description", "input_schema"}
    assert len(tool["description"]) > 80
    schema = tool["input_schema"]
    assert schema["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{tool['name']}.{name} has no description"


# --- validate_input --------------------------------------------------------


def test_valid_input_is_returned() -> None:
    assert validate_input("bash", {"command": "ls", "timeout": 3}) == {
        "command": "ls",
        "timeout": 3,
    }


def test_defaults_from_the_schema_are_filled_in() -> None:
    assert validate_input("handoff", {"summary": "half done"}) == {
        "summary": "half done",
        "done": [],
        "next_steps": [],
        "open_questions": [],
    }
    assert validate_input("save_artifact", {"path": "r.md"})["kind"] == "file"
    assert validate_input("list_files", {}) == {"path": "."}


def test_defaults_are_not_shared_between_calls() -> None:
    first = validate_input("handoff", {"summary": "a"})
    first["done"].append("x")
    assert validate_input("handoff", {"summary": "b"})["done"] == []


def test_unknown_tool_lists_the_known_ones() -> None:
    with pytest.raises(ToolInputError) as info:
        validate_input("rm_rf", {})
    message = str(info.value)
    assert "unknown tool 'rm_rf'" in message
    for tool in TOOL_SCHEMAS:
        assert tool["name"] in message


@pytest.mark.parametrize("bad", [None, "ls", ["ls"], 3])
def test_input_must_be_an_object(bad: object) -> None:
    with pytest.raises(ToolInputError, match="must be a JSON object"):
        validate_input("bash", bad)


@pytest.mark.parametrize(
    ("name", "tool_input", "expected"),
    [
        ("bash", {}, "missing required field 'command'"),
        ("edit_file", {"path": "a", "old_string": "x"}, "missing required field 'new_string'"),
        ("handoff", {}, "missing required field 'summary'"),
        ("bash", {"command": 42}, "field 'command' must be of type string, got integer"),
        ("bash", {"command": "ls", "timeout": "5"}, "field 'timeout' must be of type number"),
        ("bash", {"command": "ls", "timeout": 0}, "field 'timeout' must be greater than 0"),
        ("read_file", {"path": "a", "offset": 1.5}, "field 'offset' must be of type integer"),
        ("read_file", {"path": "a", "limit": 0}, "field 'limit' must be at least 1"),
        ("write_file", {"path": "a", "content": None}, "field 'content' must be of type string"),
        ("handoff", {"summary": "s", "done": "all"}, "field 'done' must be of type array"),
        ("handoff", {"summary": "s", "next_steps": [1]}, "field 'next_steps.0' must be of type"),
        ("finish", {"summary": ""}, "field 'summary' must not be empty"),
        (
            "save_artifact",
            {"path": "a", "kind": "zip"},
            "field 'kind' must be one of: file, report",
        ),
        ("read_file", {"path": "a", "encoding": "latin-1"}, "unexpected field 'encoding'"),
    ],
)
def test_bad_arguments_name_the_field(name: str, tool_input: dict, expected: str) -> None:
    with pytest.raises(ToolInputError) as info:
        validate_input(name, tool_input)
    assert expected in str(info.value)
    assert str(info.value).startswith(f"{name}: ")


def test_huge_content_is_rejected_without_echoing_it() -> None:
    huge = "x" * (FIVE_MB + 1)
    for name, tool_input, field in [
        ("write_file", {"path": "a", "content": huge}, "content"),
        ("edit_file", {"path": "a", "old_string": "x", "new_string": huge}, "new_string"),
    ]:
        with pytest.raises(ToolInputError) as info:
            validate_input(name, tool_input)
        message = str(info.value)
        assert f"field '{field}' is too large" in message
        assert len(message) < 300
    assert validate_input("write_file", {"path": "a", "content": "x" * FIVE_MB})


def test_size_cap_counts_utf8_bytes() -> None:
    with pytest.raises(ToolInputError, match="too large"):
        validate_input("write_file", {"path": "a", "content": "é" * (FIVE_MB // 2 + 1)})


def test_type_error_on_a_huge_value_stays_short() -> None:
    with pytest.raises(ToolInputError) as info:
        validate_input("bash", {"command": ["x" * 100_000]})
    assert len(str(info.value)) < 300


def test_overlong_command_points_to_a_script_file() -> None:
    with pytest.raises(ToolInputError, match="write the script to a file"):
        validate_input("bash", {"command": "echo " + "x" * 200_000})


# --- execute: dispatch -----------------------------------------------------


@pytest.mark.parametrize("name", sorted(HARNESS_TOOLS))
def test_harness_tools_are_not_executed_here(ws: Workspace, name: str) -> None:
    with pytest.raises(ValueError, match="harness tool"):
        execute(ws, name, {"summary": "x", "path": "x"})


def test_bad_input_becomes_an_error_result(ws: Workspace) -> None:
    result = execute(ws, "frobnicate", {})
    assert isinstance(result, ToolResult)
    assert result.is_error
    assert "unknown tool" in result.output
    result = execute(ws, "read_file", "calc.py")
    assert result.is_error
    assert "JSON object" in result.output


# --- bash ------------------------------------------------------------------


def test_bash_success(ws: Workspace) -> None:
    result = execute(ws, "bash", {"command": "echo hello > f.txt && cat f.txt"})
    assert not result.is_error
    assert result.output == "hello\n[exit code 0]"
    assert result.data["exit_code"] == 0
    assert result.data["isolation"] in ("bwrap", "subprocess")
    for key in ("timed_out", "cancelled", "truncated", "duration_ms"):
        assert key in result.data
    assert (ws.path / "f.txt").read_text() == "hello\n"


def test_bash_failure_is_an_error(ws: Workspace) -> None:
    result = execute(ws, "bash", {"command": "echo oops >&2; exit 1"})
    assert result.is_error
    assert result.output == "oops\n[exit code 1]"
    assert result.data["exit_code"] == 1


def test_bash_no_output(ws: Workspace) -> None:
    assert execute(ws, "bash", {"command": "true"}).output == "[exit code 0]"


def test_bash_timeout_is_capped_by_the_runtime(ws: Workspace) -> None:
    result = execute(ws, "bash", {"command": "sleep 30", "timeout": 100}, bash_timeout=0.5)
    assert result.is_error
    assert result.output == "[timed out after 0.5s; process group killed]"
    assert result.data["timed_out"]
    assert result.data["exit_code"] is None


def test_bash_asked_timeout_below_the_cap(ws: Workspace) -> None:
    result = execute(ws, "bash", {"command": "echo hi; sleep 30", "timeout": 0.3})
    assert result.output == "hi\n[timed out after 0.3s; process group killed]"


def test_bash_cancelled(ws: Workspace) -> None:
    result = execute(ws, "bash", {"command": "sleep 30"}, should_stop=lambda: True)
    assert result.output == "[cancelled]"
    assert result.data["cancelled"]
    assert result.is_error


def test_bash_output_is_capped_and_passes_env(ws: Workspace) -> None:
    result = execute(
        ws,
        "bash",
        {"command": 'seq 1 10000; echo "$RUN_ID"'},
        output_limit=500,
        extra_env={"RUN_ID": "r-7"},
    )
    assert result.data["truncated"]
    assert "bytes cut" in result.output
    assert result.output.endswith("r-7\n[exit code 0]")
    assert len(result.output) < 600


# --- read_file -------------------------------------------------------------


def test_read_file_whole(ws: Workspace) -> None:
    (ws.path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    result = execute(ws, "read_file", {"path": "calc.py"})
    assert not result.is_error
    assert result.output == "def add(a, b):\n    return a + b\n"
    assert result.data == {"path": "calc.py", "bytes": 32, "lines": 2, "truncated": False}


def test_read_file_offset_and_limit(ws: Workspace) -> None:
    (ws.path / "n.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    result = execute(ws, "read_file", {"path": "n.txt", "offset": 3, "limit": 2})
    assert result.output == "line 3\nline 4\n[showing lines 3-4 of 10; use offset=5 to read on]"
    result = execute(ws, "read_file", {"path": "n.txt", "offset": 9})
    assert result.output == "line 9\nline 10\n[showing lines 9-10 of 10]"
    result = execute(ws, "read_file", {"path": "n.txt", "offset": 11})
    assert result.is_error
    assert "past the end" in result.output


def test_read_file_is_capped_and_says_so(ws: Workspace) -> None:
    (ws.path / "big.txt").write_text("".join(f"{n:04}\n" for n in range(1000)))
    result = execute(ws, "read_file", {"path": "big.txt"}, output_limit=50)
    assert result.output.startswith("0000\n0001\n")
    assert result.output.endswith(
        "[showing lines 1-10 of 1000; output cut at 50 characters; use offset=11 to read on]"
    )
    assert result.data["truncated"]


def test_read_file_single_huge_line_is_cut(ws: Workspace) -> None:
    (ws.path / "min.js").write_text("x" * 10_000)
    result = execute(ws, "read_file", {"path": "min.js"}, output_limit=100)
    assert result.output.startswith("x" * 100 + "\n[showing lines 1-1 of 1; output cut")
    assert result.data["truncated"]


def test_read_file_empty(ws: Workspace) -> None:
    (ws.path / "empty.txt").write_text("")
    result = execute(ws, "read_file", {"path": "empty.txt"})
    assert not result.is_error
    assert result.output == "[empty.txt is empty]"


def test_read_file_errors(ws: Workspace) -> None:
    (ws.path / "pkg").mkdir()
    (ws.path / "blob.bin").write_bytes(b"ok\xff\xfe\x00")
    missing = execute(ws, "read_file", {"path": "nope.py"})
    assert missing.is_error
    assert missing.output == "nope.py: no such file or directory"
    folder = execute(ws, "read_file", {"path": "pkg"})
    assert folder.is_error
    assert "pkg is a directory" in folder.output
    binary = execute(ws, "read_file", {"path": "blob.bin"})
    assert binary.is_error
    assert "blob.bin is not a UTF-8 text file (byte 0xff at offset 2)" in binary.output
    escape = execute(ws, "read_file", {"path": "../../etc/passwd"})
    assert escape.is_error
    assert "escapes the workspace" in escape.output


def test_read_file_fifo_does_not_hang(ws: Workspace) -> None:
    os.mkfifo(ws.path / "pipe")
    result = execute(ws, "read_file", {"path": "pipe"})
    assert result.is_error
    assert "not a regular file" in result.output


def test_read_file_through_symlink_outside_is_refused(ws: Workspace, outside: Path) -> None:
    (ws.path / "docs").symlink_to(outside)
    result = execute(ws, "read_file", {"path": "docs/secret.txt"})
    assert result.is_error
    assert "symlink" in result.output
    assert "top secret" not in result.output


# --- write_file ------------------------------------------------------------


def test_write_file_creates_parents(ws: Workspace) -> None:
    result = execute(ws, "write_file", {"path": "src/pkg/mod.py", "content": "x = 1\n"})
    assert not result.is_error
    assert result.output == "created src/pkg/mod.py (6 bytes)"
    assert result.data == {"path": "src/pkg/mod.py", "bytes": 6}
    assert (ws.path / "src" / "pkg" / "mod.py").read_text() == "x = 1\n"


def test_write_file_overwrites_and_counts_utf8_bytes(ws: Workspace) -> None:
    (ws.path / "a.txt").write_text("old content")
    result = execute(ws, "write_file", {"path": "a.txt", "content": "héllo"})
    assert result.output == "overwrote a.txt (6 bytes)"
    assert (ws.path / "a.txt").read_text(encoding="utf-8") == "héllo"


def test_write_file_never_follows_a_symlink_out(ws: Workspace, outside: Path) -> None:
    (ws.path / "innocent.txt").symlink_to(outside / "secret.txt")
    (ws.path / "dir").symlink_to(outside)
    for path in ("innocent.txt", "dir/new.txt", str(outside / "new.txt")):
        result = execute(ws, "write_file", {"path": path, "content": "pwned"})
        assert result.is_error, path
    assert (outside / "secret.txt").read_text() == "top secret"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_write_file_through_inside_symlink_writes_the_target(ws: Workspace) -> None:
    (ws.path / "real.txt").write_text("a")
    (ws.path / "alias.txt").symlink_to("real.txt")
    result = execute(ws, "write_file", {"path": "alias.txt", "content": "b"})
    assert not result.is_error
    assert result.data["path"] == "real.txt"
    assert (ws.path / "real.txt").read_text() == "b"
    assert (ws.path / "alias.txt").is_symlink()


def test_write_file_errors(ws: Workspace) -> None:
    (ws.path / "folder").mkdir()
    (ws.path / "file.txt").write_text("x")
    on_dir = execute(ws, "write_file", {"path": "folder", "content": "x"})
    assert on_dir.is_error
    assert "folder is a directory" in on_dir.output
    under_file = execute(ws, "write_file", {"path": "file.txt/child.txt", "content": "x"})
    assert under_file.is_error
    assert under_file.output == (
        "cannot write file.txt/child.txt: a part of that path is a file, not a folder"
    )
    nul = execute(ws, "write_file", {"path": "a\x00b", "content": "x"})
    assert nul.is_error
    assert "NUL" in nul.output


def test_write_file_keeps_a_files_mode_and_leaves_no_temporary_file(ws: Workspace) -> None:
    script = ws.path / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o755)
    result = execute(ws, "write_file", {"path": "run.sh", "content": "#!/bin/sh\necho new\n"})
    assert not result.is_error, result.output
    assert script.read_text() == "#!/bin/sh\necho new\n"
    assert script.stat().st_mode & 0o777 == 0o755
    execute(ws, "write_file", {"path": "new.txt", "content": "n"})
    assert (ws.path / "new.txt").stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(ws.path)) == ["new.txt", "run.sh"]


def test_a_write_the_disk_refuses_leaves_the_old_content_whole(ws: Workspace) -> None:
    """A file-size limit makes the write fail half way, as a full disk would: the file keeps its
    old content (it was not truncated first) and no temporary file is left."""
    (ws.path / "notes.txt").write_text("the old notes\n")
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from agents.sandbox.tools import _write_bytes\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        "    _write_bytes(Path(sys.argv[1]), b'new ' * 100_000)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ws.path / "notes.txt")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        check=True,
    )
    assert done.stdout.startswith("refused"), done.stdout + done.stderr
    assert (ws.path / "notes.txt").read_text() == "the old notes\n"
    assert os.listdir(ws.path) == ["notes.txt"]


# --- edit_file -------------------------------------------------------------


CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


def test_edit_file_replaces_one_exact_match(ws: Workspace) -> None:
    (ws.path / "calc.py").write_text(CALC)
    result = execute(
        ws,
        "edit_file",
        {
            "path": "calc.py",
            "old_string": "def add(a, b):\n    return a - b",
            "new_string": "def add(a, b):\n    return a + b",
        },
    )
    assert not result.is_error, result.output
    assert result.output == "edited calc.py at line 1"
    assert result.data["path"] == "calc.py"
    assert (ws.path / "calc.py").read_text() == CALC.replace("a - b", "a + b", 1)


def test_edit_file_old_string_missing(ws: Workspace) -> None:
    (ws.path / "calc.py").write_text(CALC)
    result = execute(
        ws, "edit_file", {"path": "calc.py", "old_string": "return a * b", "new_string": "x"}
    )
    assert result.is_error
    assert result.output.startswith("old_string not found in calc.py")
    assert (ws.path / "calc.py").read_text() == CALC


def test_edit_file_old_string_not_unique(ws: Workspace) -> None:
    (ws.path / "calc.py").write_text(CALC + "# a - b\n")
    result = execute(
        ws, "edit_file", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}
    )
    assert result.is_error
    assert result.output == (
        "old_string occurs 3 times in calc.py; give more context so it is unique"
    )


def test_edit_file_keeps_crlf_line_endings(ws: Workspace) -> None:
    (ws.path / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = execute(ws, "edit_file", {"path": "win.txt", "old_string": "two", "new_string": "2"})
    assert result.output == "edited win.txt at line 2"
    assert (ws.path / "win.txt").read_bytes() == b"one\r\n2\r\nthree\r\n"


def test_edit_file_delete_with_empty_new_string(ws: Workspace) -> None:
    (ws.path / "a.txt").write_text("keep drop keep")
    execute(ws, "edit_file", {"path": "a.txt", "old_string": " drop", "new_string": ""})
    assert (ws.path / "a.txt").read_text() == "keep keep"


@pytest.mark.parametrize(
    ("tool_input", "expected"),
    [
        ({"path": "a.txt", "old_string": "", "new_string": "x"}, "old_string is empty"),
        ({"path": "a.txt", "old_string": "a", "new_string": "a"}, "are the same"),
        ({"path": "gone.txt", "old_string": "a", "new_string": "b"}, "gone.txt: no such file"),
        ({"path": "../a.txt", "old_string": "a", "new_string": "b"}, "escapes the workspace"),
    ],
)
def test_edit_file_errors(ws: Workspace, tool_input: dict, expected: str) -> None:
    (ws.path / "a.txt").write_text("abc")
    result = execute(ws, "edit_file", tool_input)
    assert result.is_error
    assert expected in result.output
    assert (ws.path / "a.txt").read_text() == "abc"


# --- list_files ------------------------------------------------------------


def test_list_files(ws: Workspace) -> None:
    (ws.path / "src").mkdir()
    (ws.path / "src" / "calc.py").write_text("x = 1\n")
    (ws.path / "README.md").write_text("hi")
    (ws.path / ".git").mkdir()
    (ws.path / ".git" / "config").write_text("[core]")
    everything = execute(ws, "list_files", {})
    assert not everything.is_error
    assert everything.output == "README.md (2 B)\nsrc/calc.py (6 B)"
    assert everything.data["path"] == "."
    sub = execute(ws, "list_files", {"path": "src"})
    assert sub.output == "src/calc.py (6 B)"
    assert sub.data["path"] == "src"


def test_list_files_errors(ws: Workspace) -> None:
    (ws.path / "f.txt").write_text("x")
    not_dir = execute(ws, "list_files", {"path": "f.txt"})
    assert not_dir.is_error
    assert "f.txt is not a directory" in not_dir.output
    escape = execute(ws, "list_files", {"path": "/"})
    assert escape.is_error
    assert "outside the workspace" in escape.output


def test_list_files_output_is_capped(ws: Workspace) -> None:
    (ws.path / ("d" * 200)).mkdir()
    for i in range(50):
        (ws.path / ("d" * 200) / f"{i:03}.txt").write_text("x")
    result = execute(ws, "list_files", {}, output_limit=1000)
    assert result.output.endswith("[output cut at 1000 characters]")
