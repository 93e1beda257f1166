"""Checkpoint export: the workspace as a .tar.gz and a patch the real `git apply` accepts, and the
CLI's export_checkpoint."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tracemalloc
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agents import checkpoints, export, workspaces
from agents.blobstore import BlobStore
from agents.snapshots import Snapshots
from tests.helpers import make_run

pytestmark = pytest.mark.django_db

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


# --- helpers ----------------------------------------------------------------------------------
def git(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, check=check, timeout=60
    )


def put(ws: Path, files: dict) -> None:
    """Write `files` ({raw or str path: bytes content | ("link", target) | ("dir",) | None to
    remove}) into the workspace; a tuple ("x", content) is an executable file."""
    root = os.fsencode(ws)
    for name, spec in files.items():
        path = os.path.join(root, os.fsencode(name))
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        if spec is None:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(spec, tuple) and spec[0] == "link":
            os.symlink(os.fsencode(spec[1]), path)
        elif isinstance(spec, tuple) and spec[0] == "dir":
            os.makedirs(path)
        elif isinstance(spec, tuple) and spec[0] == "mode":
            with open(path, "wb") as f:
                f.write(spec[2])
            os.chmod(path, spec[1])
        else:
            executable = isinstance(spec, tuple)
            with open(path, "wb") as f:
                f.write(spec[1] if executable else spec)
            os.chmod(path, 0o755 if executable else 0o644)


def files_of(folder: Path) -> dict[bytes, tuple]:
    """What a git patch carries of a folder: files (content, owner's x bit) and symlinks."""
    out: dict[bytes, tuple] = {}
    root = os.fsencode(folder)
    for top, dirs, names in os.walk(root):
        if top == root and b".git" in dirs:
            dirs.remove(b".git")
        for name in names + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("l", os.readlink(full))
            else:
                with open(full, "rb") as f:
                    out[rel] = ("f", f.read(), bool(os.lstat(full).st_mode & 0o100))
    return out


def checkpoint(run, files: dict | None = None):
    if files:
        put(run.workspace_path, files)
    return checkpoints.create(run.pk, kind="manual", actor="test")


def restored(cp, folder: Path) -> Path:
    workspaces.store().restore(cp.tree, folder)
    return folder


def assert_git_applies(a, b, tmp_path: Path) -> bytes:
    """`git apply` turns a's files into exactly b's (b None: the live workspace), and -R back."""
    repo = restored(a, tmp_path / "repo")
    git("init", "-q", cwd=repo)
    want_a = files_of(repo)
    want_b = files_of(a.run.workspace_path if b is None else restored(b, tmp_path / "b"))
    data = export.patch(a, b)
    data.decode("utf-8")  # valid UTF-8 whatever the files hold
    patch_file = tmp_path / "change.patch"
    patch_file.write_bytes(data)
    done = git("apply", str(patch_file), cwd=repo, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace") + data.decode()[:4000]
    assert files_of(repo) == want_b
    back = git("apply", "-R", str(patch_file), cwd=repo, check=False)
    assert back.returncode == 0, back.stderr.decode(errors="replace")
    assert files_of(repo) == want_a
    return data


@pytest.fixture
def run(tmp_path):
    return make_run()


# --- the patch --------------------------------------------------------------------------------
def test_text_changes_apply_both_ways(run, tmp_path):
    a = checkpoint(
        run,
        {
            "keep.txt": b"one\ntwo\nthree\nfour\nfive\nsix\nseven\n",
            "gone.txt": b"bye\n",
            "no-newline.txt": b"first\nlast",
            "breaks.txt": b"a\rb\x0cc\x1dd\xe2\x80\xa8e\nf\n",
            "empty-gone": b"",
            "deep/er/file.py": b"x = 1\n",
        },
    )
    b = checkpoint(
        run,
        {
            "keep.txt": b"one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\n",
            "gone.txt": None,
            "no-newline.txt": b"first\nlast, changed",
            "breaks.txt": b"a\rb\x0cC\x1dd\xe2\x80\xa8e\nf\n",
            "empty-gone": None,
            "empty-new": b"",
            "new.md": b"# hello\n",
            "deep/er/file.py": None,
        },
    )
    data = assert_git_applies(a, b, tmp_path).decode()
    assert "\\ No newline at end of file" in data
    assert "GIT binary patch" not in data
    # Lines break on \n only: \r, form feed and U+2028 stay inside one line, as in git.
    assert "-a\rb\x0cc\x1dd\u2028e\n+a\rb\x0cC\x1dd\u2028e\n" in data
    assert data.startswith("Shiftlog patch: run ")
    assert "\nindex " + "0" * 40 + ".." in data  # full index lines


def test_binary_files_and_a_big_text_file_are_binary_patches(run, tmp_path):
    big = b"".join(b"line %d\n" % i for i in range(200_000))  # > 1 MiB: binary, as git's limit
    assert len(big) > export.TEXT_DIFF_MAX_INPUT
    a = checkpoint(
        run,
        {
            "img.bin": bytes(range(256)) * 3,
            "nul.txt": b"text\0with nul\n",
            "latin1.txt": "café\n".encode("latin-1"),
            "big.log": big,
            "random.dat": os.urandom(300_000),
        },
    )
    b = checkpoint(
        run,
        {
            "img.bin": bytes(range(255, -1, -1)) * 3,
            "nul.txt": None,
            "latin1.txt": "cafés\n".encode("latin-1"),
            "big.log": big + b"one more\n",
            "random.dat": os.urandom(200_000),
            "new.bin": b"\x00\x01\x02",
        },
    )
    data = assert_git_applies(a, b, tmp_path).decode()
    assert data.count("GIT binary patch") == 6
    assert "literal 0\n" in data  # the deleted file's forward hunk


def test_symlinks_type_changes_and_modes(run, tmp_path):
    a = checkpoint(
        run,
        {
            "link": ("link", "target.txt"),
            "dangling": ("link", "../outside/nowhere"),
            "target.txt": b"t\n",
            "becomes-link": b"file\n",
            "becomes-dir": b"file\n",
            "dir-becomes-file/inner.txt": b"inner\n",
            "link-becomes-file": ("link", "target.txt"),
            "dir-becomes-link/inner.txt": b"inner\n",
            "link-becomes-dir": ("link", "target.txt"),
            "run.sh": b"echo hi\n",
            "tool": ("x", b"#!/bin/sh\n"),
            "secret": ("mode", 0o600, b"s\n"),
        },
    )
    b = checkpoint(
        run,
        {
            "link": ("link", "elsewhere.txt"),
            "dangling": None,
            "new-link": ("link", "target.txt"),
            "becomes-link": ("link", "target.txt"),
            "becomes-dir": None,
            "becomes-dir/child.txt": b"child\n",
            "dir-becomes-file": b"now a file\n",
            "link-becomes-file": b"was a link\n",
            "dir-becomes-link": ("link", "target.txt"),
            "link-becomes-dir": None,
            "link-becomes-dir/inner.txt": b"inner\n",
            "run.sh": ("x", b"echo hi\n"),
            "tool": b"#!/bin/sh\n",
            "secret": ("mode", 0o640, b"s\n"),
        },
    )
    data = assert_git_applies(a, b, tmp_path).decode()
    assert "new file mode 120000" in data and "deleted file mode 120000" in data
    assert "old mode 100644\nnew mode 100755" in data
    # The 0600 -> 0640 change is not carried: it is listed before the first diff.
    head = data[: data.index("diff --git")]
    assert "secret 0600 -> 0640" in head
    assert "diff --git a/secret" not in data


def test_odd_names_are_quoted_as_git_quotes_them(run, tmp_path):
    names = [
        "with space.txt",
        'quote".txt',
        "back\\slash.txt",
        "tab\there.txt",
        "new\nline.txt",
        "ünïcödé.txt",
        b"latin-\xe9.txt",
        " leading and trailing ",
        "dir with space/file",
    ]
    a = checkpoint(run, {n: b"old\n" for n in names})
    b = checkpoint(run, {n: b"new\n" for n in names} | {"another one.txt": b"x\n"})
    data = assert_git_applies(a, b, tmp_path).decode()
    assert 'diff --git "a/tab\\there.txt" "b/tab\\there.txt"' in data
    assert '"a/latin-\\351.txt"' in data
    assert "--- a/with space.txt\t\n" in data  # git's tab after a name with a space


def test_every_byte_value_is_quoted_as_git_ls_files_does(run, tmp_path):
    names = [b"x" + bytes([i]) + b"y" for i in range(1, 256) if i != ord("/")]
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    put(repo, dict.fromkeys(names, b""))
    listed = git("ls-files", "--others", cwd=repo).stdout.decode("ascii").splitlines()
    assert sorted(listed) == sorted(export.git_quote(n) for n in names)
    # And a patch creating them all applies.
    a = checkpoint(run, {"base": b"base\n"})
    b = checkpoint(run, {n: n + b"\n" for n in names})
    assert_git_applies(a, b, tmp_path / "apply")


def test_what_git_cannot_carry_is_listed_and_dot_git_left_out(run, tmp_path):
    put(
        run.workspace_path,
        {
            "was-empty": ("dir",),
            "folder/file": b"f\n",
            ".git/config": b"[core]\n",
            "sub/.GIT/HEAD": b"ref\n",
        },
    )
    os.chmod(run.workspace_path / "folder", 0o700)
    a = checkpoint(run)
    put(
        run.workspace_path,
        {
            "was-empty": None,
            "now-empty": ("dir",),
            ".git/config": b"[core]\nbare = true\n",
            ".git/new": b"x\n",
            "sub/.GIT/HEAD": None,
            "file.txt": b"kept\n",
        },
    )
    os.chmod(run.workspace_path / "folder", 0o750)
    b = checkpoint(run)
    data = export.patch(a, b).decode()
    head = data[: data.index("diff --git")]
    assert "now-empty (empty, added)" in head
    assert "was-empty (empty, removed)" in head
    assert "folder 0700 -> 0750" in head
    assert "Changes inside .git folders, left out: 3" in head
    assert ".git" not in data[data.index("diff --git") :]
    repo = restored(a, tmp_path / "repo")
    shutil.rmtree(repo / ".git")
    shutil.rmtree(repo / "sub")
    (tmp_path / "p").write_bytes(data.encode())
    git("init", "-q", cwd=repo)
    git("apply", str(tmp_path / "p"), cwd=repo)
    assert (repo / "file.txt").read_bytes() == b"kept\n"


def test_no_changes_says_so(run):
    a = checkpoint(run, {"a.txt": b"same\n"})
    assert (
        export.patch(a, a)
        .decode()
        .endswith("No file changes: `git apply` finds no patch in it (it says so).\n\n")
    )


def test_a_patch_against_the_live_workspace_and_across_runs(run, tmp_path):
    a = checkpoint(run, {"a.txt": b"1\n", "bin": b"\0\1", "d/x": b"x\n"})
    put(
        run.workspace_path, {"a.txt": b"2\n", "bin": b"\0\2", "d/y": b"y\n", "l": ("link", "a.txt")}
    )
    assert_git_applies(a, None, tmp_path / "live")
    assert export.patch_name(a, None).endswith("-to-live")
    # A fork's checkpoint against its origin's.
    fork = checkpoints.fork(run.pk, a.pk, actor="test")
    put(fork.workspace_path, {"a.txt": b"forked\n"})
    f = checkpoint(fork)
    assert_git_applies(a, f, tmp_path / "fork")
    assert export.patch_name(a, f) == f"{export.tar_name(a)}-to-{export.tar_name(f)}"


def test_a_folder_swapped_for_a_symlink_mid_export_is_an_error(run, tmp_path):
    a = checkpoint(run, {"d/x.txt": b"old\n", "e/y.txt": b"old\n"})
    put(run.workspace_path, {"d/x.txt": b"new\n", "e/y.txt": b"new\n"})
    # The same content behind a symlink: following it would pass the hash check.
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, {"y.txt": b"new\n"})
    chunks = export.patch_chunks(a, None)
    first = next(chunks)  # the notes: the diff is made, files not yet read
    assert first.startswith(b"Shiftlog patch:")
    shutil.rmtree(run.workspace_path / "e")
    os.symlink(elsewhere, run.workspace_path / "e")
    with pytest.raises(export.ExportError, match="symlink"):
        b"".join(chunks)


def test_a_live_file_changed_mid_export_is_an_error(run):
    a = checkpoint(run, {"x.txt": b"old\n"})
    put(run.workspace_path, {"x.txt": b"new\n"})
    chunks = export.patch_chunks(a, None)
    (run.workspace_path / "x.txt").write_bytes(b"newer\n")
    with pytest.raises(export.ExportError, match="changed"):
        b"".join(chunks)


def test_missing_blobs_and_workspaces_fail_before_the_first_byte(run):
    a = checkpoint(run, {"x.txt": b"old\n"})
    # Contents of their own: the store is shared by the session's tests, and this one damages it.
    b = checkpoint(run, {"x.txt": os.urandom(16)})
    BlobStore().path(b.tree).rename(BlobStore().root / "hidden")
    with pytest.raises(export.ExportError, match="cannot be"):
        export.patch_chunks(a, b)
    with pytest.raises(export.ExportError, match="cannot be read"):
        export.tar_chunks(b)
    (BlobStore().root / "hidden").rename(BlobStore().path(b.tree))
    digest = workspaces.store().files(b.tree)["x.txt"].hash
    BlobStore().path(digest).unlink()
    with pytest.raises(export.ExportError, match="not in the store"):
        export.patch_chunks(a, b)
    with pytest.raises(export.ExportError, match="not in the store"):
        export.tar_chunks(b)
    shutil.rmtree(run.workspace_path)
    with pytest.raises(export.ExportError, match="workspace is not there"):
        export.patch_chunks(a, None)


# --- the tar ----------------------------------------------------------------------------------
def test_the_tar_extracts_to_exactly_the_checkpoints_tree(run, tmp_path):
    cp = checkpoint(
        run,
        {
            "src/app.py": b"print(1)\n",
            "tool": ("x", b"#!/bin/sh\n"),
            "secret": ("mode", 0o600, b"s"),
            "empty-dir": ("dir",),
            "link": ("link", "src/app.py"),
            "escape": ("link", "/etc/passwd"),
            b"bad-\xff-name": b"bytes\n",
            "n" * 150 + "/deep": b"long name\n",
            "big.bin": os.urandom(3 << 20),
        },
    )
    os.chmod(run.workspace_path / "empty-dir", 0o700)
    cp = checkpoint(run)
    shutil.rmtree(run.workspace_path)  # read from the store only
    out = io.BytesIO()
    written = export.workspace_tar(cp, out)
    assert written == len(out.getvalue())
    assert out.getvalue() == b"".join(export.tar_chunks(cp))  # byte-identical each time
    name = export.tar_name(cp)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:gz") as tar:
        members = tar.getmembers()
        assert members[0].name == name and members[0].isdir()
        assert {(m.uid, m.gid) for m in members} == {(0, 0)}
        assert {m.mtime for m in members} == {int(cp.created_at.timestamp())}
        tar.extractall(tmp_path / "out", filter="fully_trusted")
    extracted = tmp_path / "out" / name
    again = Snapshots(BlobStore(tmp_path / "store")).snapshot(extracted)
    assert again.tree == cp.tree


def test_a_corrupt_blob_breaks_the_tar_off(run):
    b = os.urandom(100)  # its own blob: the session's tests share the store
    cp = checkpoint(run, {"a.txt": b"a" * 100, "b.txt": b})
    digest = workspaces.store().files(cp.tree)["b.txt"].hash
    BlobStore().path(digest).write_bytes(bytes(100))
    chunks = export.tar_chunks(cp)
    with pytest.raises(export.ExportError, match="corrupt"):
        b"".join(chunks)


def big_file(path: Path, mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def peak_mib(chunks) -> tuple[int, float]:
    tracemalloc.start()
    try:
        total = sum(len(c) for c in chunks)
        return total, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_memory_stays_small_for_big_files(run):
    # tracemalloc slows pure-Python base85 down a lot: the patch is measured on a smaller file.
    big_file(run.workspace_path / "big.bin", 32)
    big_file(run.workspace_path / "patched.bin", 3)
    a = checkpoint(run)
    with open(run.workspace_path / "patched.bin", "r+b") as f:
        f.write(b"changed")
    b = checkpoint(run)
    total, peak = peak_mib(export.tar_chunks(a))
    print(f"\ntar of 35 MiB in two files: {total:,} bytes out, peak {peak:.2f} MiB")
    assert peak < 2
    total, peak = peak_mib(export.patch_chunks(a, b))
    print(f"patch of a 3 MiB binary file changed: {total:,} bytes out, peak {peak:.2f} MiB")
    assert peak < 2


# --- the CLI ----------------------------------------------------------------------------------
def cli(*args: str) -> str:
    out = StringIO()
    call_command("export_checkpoint", *args, stdout=out)
    return out.getvalue()


def cli_failing(*args: str) -> str:
    with pytest.raises(CommandError) as info:
        call_command("export_checkpoint", *args, stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == 2
    return str(info.value)


def test_cli_writes_a_tar_to_a_file_or_into_a_folder(run, tmp_path):
    cp = checkpoint(run, {"a.txt": b"a\n"})
    target = tmp_path / "x.tar.gz"
    cli(str(run.pk), str(cp.number), "--out", str(target))
    assert target.read_bytes() == b"".join(export.tar_chunks(cp))
    cli(str(run.pk), str(cp.number), "--out", str(tmp_path))
    assert (tmp_path / f"{export.tar_name(cp)}.tar.gz").read_bytes() == target.read_bytes()


def test_cli_writes_a_patch(run, tmp_path):
    a = checkpoint(run, {"a.txt": b"a\n"})
    b = checkpoint(run, {"a.txt": b"b\n"})
    target = tmp_path / "c.patch"
    cli(str(run.pk), str(b.number), "--patch-from", str(a.number), "--out", str(target))
    assert target.read_bytes() == export.patch(a, b)
    put(run.workspace_path, {"a.txt": b"live\n"})
    cli(str(run.pk), "live", "--patch-from", str(a.number), "--out", str(tmp_path))
    assert (tmp_path / f"{export.patch_name(a, None)}.patch").read_bytes() == export.patch(a, None)


def test_cli_errors_exit_2_and_leave_no_file(run, tmp_path):
    a = checkpoint(run, {"a.txt": os.urandom(16)})  # its own blob: corrupted below
    assert "no checkpoint" in cli_failing(
        str(run.pk), "999999", "--out", str(tmp_path / "t.tar.gz")
    )
    assert "whole number" in cli_failing(str(run.pk), "nope", "--out", str(tmp_path / "t.tar.gz"))
    assert "--out" in cli_failing(str(run.pk), str(a.number))
    assert "live" in cli_failing(str(run.pk), "live", "--out", str(tmp_path / "t.tar.gz"))
    assert "live" in cli_failing(str(run.pk), str(a.number), "--patch-from", "live")
    assert "cannot write" in cli_failing(
        str(run.pk), str(a.number), "--out", str(tmp_path / "no" / "t.tar.gz")
    )
    digest = workspaces.store().files(a.tree)["a.txt"].hash
    BlobStore().path(digest).write_bytes(b"corrupt")
    assert "corrupt" in cli_failing(str(run.pk), str(a.number), "--out", str(tmp_path / "t.tar.gz"))
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
    shutil.rmtree(run.workspace_path)
    assert "workspace" in cli_failing(str(run.pk), "live", "--patch-from", str(a.number))


def test_cli_writes_to_standard_output(run, capsysbinary):
    a = checkpoint(run, {"a.txt": b"a\n", "b.bin": b"\0"})
    call_command("export_checkpoint", str(run.pk), str(a.number), "--out", "-")
    assert capsysbinary.readouterr().out == b"".join(export.tar_chunks(a))
    put(run.workspace_path, {"a.txt": b"changed\n"})
    assert cli(str(run.pk), "live", "--patch-from", str(a.number)).encode() == export.patch(a, None)
