"""Three-way merges of a child's change into a parent's workspace (agents/fleets/merging.py), on real
snapshot trees: clean text merges, conflicts of every kind, modes, deletions, and a symlink of
the parent's that leads outside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents import sandbox
from agents.blobstore import BlobStore
from agents.fleets import merging
from agents.snapshots import Snapshots


@pytest.fixture
def store(tmp_path) -> Snapshots:
    return Snapshots(BlobStore(tmp_path / "blobs"))


def tree(store: Snapshots, root: Path, files: dict[str, str | bytes]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return store.snapshot(root).tree


def setup(store, tmp_path, base, theirs, ours):
    b = tree(store, tmp_path / "base", base)
    t = tree(store, tmp_path / "theirs", theirs)
    ws = tmp_path / "ours"
    tree(store, ws, ours)
    return b, t, sandbox.Workspace(ws)


TEXT = "".join(f"line {i}\n" for i in range(10))


def test_changes_to_different_lines_merge_cleanly(store, tmp_path):
    b, t, ws = setup(
        store,
        tmp_path,
        {"a.txt": TEXT},
        {"a.txt": TEXT.replace("line 8", "THEIRS 8"), "new.txt": "new"},
        {"a.txt": TEXT.replace("line 1", "OURS 1")},
    )
    p = merging.plan(store, b, t, ws)
    assert p.clean and sorted(p.files) == ["a.txt", "new.txt"]
    merging.apply(ws, p)
    merged = (ws.path / "a.txt").read_text()
    assert "OURS 1" in merged and "THEIRS 8" in merged
    assert (ws.path / "new.txt").read_text() == "new"
    assert not list(ws.path.glob(".shiftlog-merge-*"))


@pytest.mark.parametrize(
    ("theirs", "ours", "kind"),
    [
        ({"a.txt": TEXT.replace("line 4", "T")}, {"a.txt": TEXT.replace("line 4", "O")}, "text"),
        ({"a.txt": b"\0theirs"}, {"a.txt": b"\0ours"}, "whole file"),
        ({}, {"a.txt": TEXT.replace("line 4", "O")}, "whole file"),  # deleted vs changed
        ({"a.txt": TEXT.replace("line 4", "T")}, {}, "whole file"),  # changed vs deleted
    ],
)
def test_conflicts_apply_nothing(store, tmp_path, theirs, ours, kind):
    b, t, ws = setup(store, tmp_path, {"a.txt": TEXT}, {**theirs, "other.txt": "x"}, ours)
    before = {p.name: p.read_bytes() for p in ws.path.iterdir()}
    p = merging.plan(store, b, t, ws)
    assert [c["path"] for c in p.conflicts] == ["a.txt"] and p.conflicts[0]["kind"] == kind
    assert {p.name: p.read_bytes() for p in ws.path.iterdir()} == before


def test_a_deletion_and_a_mode_change_of_theirs_apply_when_ours_did_not_touch_them(store, tmp_path):
    b = tree(store, tmp_path / "base", {"gone.txt": "g", "run.sh": "echo\n"})
    theirs = tmp_path / "theirs"
    tree(store, theirs, {"run.sh": "echo\n"})
    os.chmod(theirs / "run.sh", 0o755)
    t = store.snapshot(theirs).tree
    ws = tmp_path / "ours"
    tree(store, ws, {"gone.txt": "g", "run.sh": "echo\n"})
    p = merging.plan(store, b, t, sandbox.Workspace(ws))
    assert p.clean
    merging.apply(sandbox.Workspace(ws), p)
    assert not (ws / "gone.txt").exists()
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_person_resolution_settles_a_conflict(store, tmp_path):
    b, t, ws = setup(
        store,
        tmp_path,
        {"a.txt": TEXT},
        {"a.txt": TEXT.replace("line 4", "T")},
        {"a.txt": TEXT.replace("line 4", "O")},
    )
    for resolution, expect in [
        ({"choose": "theirs"}, "T\n"),
        ({"choose": "ours"}, "O\n"),
        ({"files": {"a.txt": "settled\n"}}, "settled\n"),
    ]:
        p = merging.plan(store, b, t, ws, resolution=resolution)
        assert p.clean
        assert expect in p.writes["a.txt"][1].decode()


def test_a_parent_symlink_leading_outside_is_a_conflict_not_a_write_outside(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    b, t, ws = setup(store, tmp_path, {}, {"pkg/x.txt": "theirs"}, {})
    os.symlink(outside, ws.path / "pkg")
    p = merging.plan(store, b, t, ws)
    assert p.conflicts and p.conflicts[0]["kind"] == "unsafe path"
    assert not list(outside.iterdir())


def test_a_subfolder_childs_paths_land_under_its_folder(store, tmp_path):
    b, t, ws = setup(store, tmp_path, {"m.py": "a"}, {"m.py": "b"}, {"pkg/m.py": "a", "m.py": "a"})
    p = merging.plan(store, b, t, ws, folder="pkg")
    merging.apply(ws, p)
    assert (ws.path / "pkg/m.py").read_text() == "b" and (ws.path / "m.py").read_text() == "a"
