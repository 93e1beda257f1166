"""A folder of the workspace swapped for a link between a scan's listing and its reading.

An agent's background process can do that at any moment. Whatever it points the link at (a
file of the host, our database) must never reach a checkpoint, a diff page or an approval card:
reads go through no link at any level (agents/snapshots/beneath.py), and a live file's content
is shown only if it still hashes to what the scan read."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from agents import workspaces
from agents.blobstore import BlobStore
from agents.snapshots import Snapshots
from agents.snapshots.beneath import open_beneath
from agents.snapshots.diff import Differ
from agents.snapshots.hashing import FileHasher
from tests.helpers import make_run

SECRET = b"TOP SECRET: the host's own file\n"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the workspace, holding a file by the same name as one inside it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "notes.txt").write_bytes(SECRET)
    return folder


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "notes.txt").write_bytes(b"the agent's notes\n")
    (folder / "top.txt").write_bytes(b"top\n")
    return folder


def swap_for_link(folder: Path, target: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(target, target_is_directory=True)


def test_open_beneath_refuses_links_dots_and_what_is_not_a_file(ws: Path, outside: Path):
    fd = open_beneath(ws, b"sub/notes.txt")
    with open(fd, "rb") as f:
        assert f.read() == b"the agent's notes\n"
    (ws / "via").symlink_to(outside, target_is_directory=True)
    (ws / "link.txt").symlink_to(outside / "notes.txt")
    os.mkfifo(ws / "pipe")
    for raw in [b"via/notes.txt", b"link.txt", b"../outside/notes.txt", b"sub/../top.txt",
                b"sub//notes.txt", b"", b"pipe", b"sub", b"missing"]:  # fmt: skip
        with pytest.raises(OSError):
            os.close(open_beneath(ws, raw))


def test_a_checkpoint_never_stores_what_a_folder_swapped_for_a_link_points_at(
    tmp_path: Path, ws: Path, outside: Path, monkeypatch
):
    snaps = Snapshots(BlobStore(tmp_path / "store"))
    listed = FileHasher.hash_pending

    def swapped_after_listing(self, scan):
        swap_for_link(ws / "sub", outside)
        return listed(self, scan)

    monkeypatch.setattr(FileHasher, "hash_pending", swapped_after_listing)
    result = snaps.snapshot(ws)
    assert not snaps.blobs.exists(digest(SECRET))
    stored = {e.path: e for e in snaps.files(result.tree).values()}
    assert all(e.hash != digest(SECRET) for e in stored.values()), stored
    assert snaps.read(result.tree, "top.txt") == b"top\n"


def test_a_diff_with_the_live_workspace_never_shows_what_a_link_swapped_in(
    tmp_path: Path, ws: Path, outside: Path, monkeypatch
):
    snaps = Snapshots(BlobStore(tmp_path / "store"))
    before = snaps.snapshot(ws).tree
    (ws / "sub" / "notes.txt").write_bytes(b"the agent's notes, edited\n")
    (outside / "notes.txt").write_bytes(SECRET)
    text_diff = Differ._text_diff

    def swapped_after_scan(self, change, live, limit):
        if (ws / "sub").is_dir() and not (ws / "sub").is_symlink():
            swap_for_link(ws / "sub", outside)
        return text_diff(self, change, live, limit)

    monkeypatch.setattr(Differ, "_text_diff", swapped_after_scan)
    changes = snaps.diff(before, ws)
    shown = "".join(c.diff or "" for c in changes)
    assert "TOP SECRET" not in shown
    (notes,) = [c for c in changes if c.path == "sub/notes.txt"]
    assert "changed in the workspace while the diff was made" in notes.note


@pytest.mark.django_db
def test_the_approval_cards_view_of_a_workspace_file_goes_through_no_link(outside: Path):
    run = make_run()
    root = run.workspace_path
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "via").symlink_to(outside, target_is_directory=True)
    (root / "secret.txt").symlink_to(outside / "notes.txt")
    assert workspaces.read_live(run, "src/app.py", 1000) == b"print('hi')\n"
    assert workspaces.read_live(run, "/src/app.py", 1000) == b"print('hi')\n"
    assert workspaces.read_live(run, "./src/app.py", 1000) == b"print('hi')\n"
    assert workspaces.read_live(run, "src/../src/app.py", 1000) == b"print('hi')\n"
    assert workspaces.read_live(run, "src/app.py", 5) is None  # over the limit
    for rel in ["via/notes.txt", "secret.txt", "../outside/notes.txt", "src/../secret.txt",
                "src", "missing.txt", "src/app.py\x00"]:  # fmt: skip
        assert workspaces.read_live(run, rel, 1000) is None, rel
