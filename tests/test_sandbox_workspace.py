"""Workspace path confinement and listing, on real folders and symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sandbox import PathEscape, ToolInputError, Workspace

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret")
    return folder


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


def test_creates_missing_folder_and_stores_resolved_path(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "ws"
    ws = Workspace(str(target))
    assert target.is_dir()
    assert ws.path == target.resolve()
    assert ws.path.is_absolute()


def test_workspace_behind_a_symlink_is_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    ws = Workspace(tmp_path / "alias")
    assert ws.path == real.resolve()
    assert ws.resolve("x.txt") == real.resolve() / "x.txt"


def test_resolves_relative_paths_inside(ws: Workspace) -> None:
    assert ws.resolve("a.txt") == ws.path / "a.txt"
    assert ws.resolve("new/dir/file.py") == ws.path / "new" / "dir" / "file.py"
    assert ws.resolve(".") == ws.path
    assert ws.resolve("./a/../b.txt") == ws.path / "b.txt"


def test_absolute_path_inside_is_allowed(ws: Workspace) -> None:
    assert ws.resolve(str(ws.path / "a.txt")) == ws.path / "a.txt"


@pytest.mark.parametrize("rel", ["..", "../x.txt", "a/../../x.txt", "a/b/../../../../etc/passwd"])
def test_dotdot_escape_is_rejected(ws: Workspace, rel: str) -> None:
    with pytest.raises(PathEscape, match="escapes the workspace"):
        ws.resolve(rel)


def test_absolute_path_outside_is_rejected(ws: Workspace, outside: Path) -> None:
    with pytest.raises(PathEscape, match="outside the workspace"):
        ws.resolve("/etc/passwd")
    with pytest.raises(PathEscape, match="outside the workspace"):
        ws.resolve(str(outside / "secret.txt"))


def test_sibling_with_common_prefix_is_outside(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    (tmp_path / "ws2").mkdir()
    with pytest.raises(PathEscape):
        ws.resolve(str(tmp_path / "ws2" / "f"))


def test_symlink_at_a_middle_component_leading_outside(ws: Workspace, outside: Path) -> None:
    (ws.path / "sub").mkdir()
    (ws.path / "sub" / "link").symlink_to(outside)
    with pytest.raises(PathEscape, match="symlink"):
        ws.resolve("sub/link/secret.txt")
    with pytest.raises(PathEscape, match="symlink"):
        ws.resolve("sub/link/not-there-yet/new.txt")


def test_symlink_as_last_component_leading_outside(ws: Workspace, outside: Path) -> None:
    (ws.path / "secret").symlink_to(outside / "secret.txt")
    (ws.path / "dangling").symlink_to(outside / "missing.txt")
    with pytest.raises(PathEscape, match="symlink"):
        ws.resolve("secret")
    with pytest.raises(PathEscape, match="symlink"):
        ws.resolve("dangling")


def test_symlink_that_stays_inside_is_fine(ws: Workspace) -> None:
    (ws.path / "real").mkdir()
    (ws.path / "real" / "f.txt").write_text("hi")
    (ws.path / "alias").symlink_to("real")
    (ws.path / "real" / "up").symlink_to("..")
    assert ws.resolve("alias/f.txt") == ws.path / "real" / "f.txt"
    assert ws.resolve("real/up/real/f.txt") == ws.path / "real" / "f.txt"


def test_symlink_loop_is_a_clear_error(ws: Workspace) -> None:
    (ws.path / "loop").symlink_to("loop")
    with pytest.raises(ToolInputError, match="loop"):
        ws.resolve("loop/x")


@pytest.mark.parametrize("rel", ["", "   "])
def test_empty_path_is_rejected(ws: Workspace, rel: str) -> None:
    with pytest.raises(ToolInputError, match="empty"):
        ws.resolve(rel)


def test_nul_byte_is_rejected(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="NUL"):
        ws.resolve("a\x00b")


def test_non_string_path_is_rejected(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="string"):
        ws.resolve(42)  # type: ignore[arg-type]


def test_path_escape_is_a_tool_input_error() -> None:
    assert issubclass(PathEscape, ToolInputError)


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace with links pointing both inside and outside, for the property test."""
    root = tmp_path_factory.mktemp("maze")
    (root / "outside").mkdir()
    ws = Workspace(root / "ws")
    (ws.path / "a" / "b").mkdir(parents=True)
    (ws.path / "in").symlink_to("a/b")
    (ws.path / "a" / "out").symlink_to(root / "outside")
    (ws.path / "a" / "b" / "up2").symlink_to("../..")
    return ws


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "in", "out", "up2", "..", ".", "x"]), min_size=1))
def test_any_path_resolves_inside_or_is_rejected(maze: Workspace, parts: list[str]) -> None:
    rel = "/".join(parts)
    try:
        real = maze.resolve(rel)
    except PathEscape:
        real_target = Path(os.path.realpath(maze.path / rel))
        assert maze.path != real_target and maze.path not in real_target.parents
    else:
        assert real == maze.path or maze.path in real.parents
        assert real == Path(os.path.realpath(maze.path / rel))


def test_listing_is_sorted_relative_with_sizes_and_skips_noise(ws: Workspace) -> None:
    (ws.path / "src" / "__pycache__").mkdir(parents=True)
    (ws.path / "src" / "__pycache__" / "x.pyc").write_bytes(b"x")
    (ws.path / ".git").mkdir()
    (ws.path / ".git" / "HEAD").write_text("ref")
    (ws.path / ".shiftlog").mkdir()
    (ws.path / ".shiftlog" / "state.json").write_text("{}")
    (ws.path / "src" / "calc.py").write_text("x" * 2048)
    (ws.path / "README.md").write_text("hello")
    (ws.path / "empty").mkdir()
    (ws.path / "link").symlink_to("README.md")

    lines = ws.listing().splitlines()
    assert lines == [
        "README.md (5 B)",
        "empty/ (empty)",
        "link -> README.md",
        "src/calc.py (2.0 KB)",
    ]


def test_listing_states_how_many_were_cut(ws: Workspace) -> None:
    for i in range(12):
        (ws.path / f"f{i:02}.txt").write_text("x")
    lines = ws.listing(limit=5).splitlines()
    assert lines[:5] == [f"f{i:02}.txt (1 B)" for i in range(5)]
    assert lines[5] == "... and 7 more"


def test_listing_of_a_subfolder(ws: Workspace) -> None:
    (ws.path / "a" / "b").mkdir(parents=True)
    (ws.path / "a" / "b" / "c.txt").write_text("abc")
    (ws.path / "top.txt").write_text("t")
    assert ws.listing(path="a") == "a/b/c.txt (3 B)"
    with pytest.raises(ToolInputError, match="not a directory"):
        ws.listing(path="top.txt")
    with pytest.raises(PathEscape):
        ws.listing(path="..")


def test_listing_of_empty_workspace(ws: Workspace) -> None:
    assert ws.listing() == "(no files in the workspace)"


def test_is_empty(ws: Workspace) -> None:
    assert ws.is_empty()
    (ws.path / ".shiftlog").mkdir()
    assert ws.is_empty()
    (ws.path / "notes.txt").write_text("x")
    assert not ws.is_empty()
