"""Backup and restore: one tar file with a consistent copy of the database and the blob store.

A backup is taken while the product runs. Its order is what makes it consistent:

1. The blob store's shared lock is taken first and held to the end, so no prune deletes a blob
   while the backup is being made. Writers take the same lock shared, so they carry on.
2. The database is copied as one snapshot: SQLite through its online backup API, PostgreSQL
   through `pg_dump`, which reads in one repeatable-read transaction.
3. The blobs are copied after it. Every row in the snapshot that names a blob was committed
   after that blob was written (checkpoint trees and artifacts are stored before their rows), so
   every blob the snapshot needs is in the store by now; newer blobs come along too, unused.
4. Workspaces are copied last, as they are at that moment: a run's work since its last
   checkpoint is as of the copy (rewinding to a checkpoint is exact either way).

The file is written beside `--out` under a temporary name and renamed when complete, so a failed
backup leaves nothing that looks like a backup. Restore wants an empty installation (no runs, no
blobs, no workspaces), checks every blob's digest as it unpacks it, applies newer migrations, and
verifies the store.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from agents import blobstore
from agents.blobstore import BlobStore, _is_digest
from agents.models import Run

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
KEY_FILES = ("secret_key", "webhook_secret")


class BackupError(Exception):
    """A backup or restore that could not be done; nothing was changed."""


@dataclass
class Summary:
    vendor: str
    runs: int
    blobs: int
    blob_bytes: int
    workspace_files: int
    bytes: int
    seconds: float

    def line(self) -> str:
        return (
            f"{self.runs} run(s), {self.blobs} blob(s) ({self.blob_bytes:,} bytes), "
            f"{self.workspace_files} workspace file(s) from {self.vendor}; "
            f"{self.bytes:,} bytes in {self.seconds:.1f} s"
        )


# --- backup ----------------------------------------------------------------------------------
def _folder_store() -> BlobStore:
    store = blobstore.configured()
    if not isinstance(store, BlobStore):
        raise BackupError(
            "backup copies the folder blob store; with an S3 store back up the bucket with its "
            f"own tools ({store.describe()})"
        )
    return store


def backup(out: Path, *, workspaces: bool = True) -> Summary:
    """Write a backup to `out` (a file; its folder must exist)."""
    out = Path(out)
    if out.is_dir():
        raise BackupError(f"{out} is a folder: give a file name")
    if not out.parent.is_dir():
        raise BackupError(f"no folder {out.parent}")
    started = time.monotonic()
    store = _folder_store()
    store.root.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    try:
        with store.lock(), tarfile.open(partial, "w") as tar:
            vendor, runs = _add_database(tar)
            blobs, blob_bytes, damaged = _add_blobs(tar, store)
            files = _add_workspaces(tar) if workspaces else 0
            _add_keys(tar)
            manifest = {
                "format": FORMAT,
                "vendor": vendor,
                "created_at": timezone.now().isoformat(),
                "runs": runs,
                "blobs": blobs,
                "damaged_blobs": damaged,
                "workspaces": workspaces,
            }
            _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=2).encode())
        os.replace(partial, out)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return Summary(
        vendor,
        runs,
        blobs,
        blob_bytes,
        files,
        out.stat().st_size,
        time.monotonic() - started,
    )


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_database(tar: tarfile.TarFile) -> tuple[str, int]:
    """The database as one snapshot; returns (vendor, runs in the snapshot)."""
    with tempfile.TemporaryDirectory(prefix="shiftlog-backup-") as tmp:
        if connection.vendor == "sqlite":
            copy = Path(tmp) / "db.sqlite3"
            source = sqlite3.connect(settings.DATABASES["default"]["NAME"], timeout=20)
            target = sqlite3.connect(copy)
            try:
                source.backup(target)
                runs = target.execute("SELECT COUNT(*) FROM agents_run").fetchone()[0]
            finally:
                target.close()
                source.close()
            tar.add(copy, "database/db.sqlite3")
            return "sqlite", runs
        if connection.vendor == "postgresql":
            dump = Path(tmp) / "db.pgdump"
            _pg("pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--file={dump}")
            tar.add(dump, "database/db.pgdump")
            # pg_dump's snapshot is its own; this count is the one the manifest can give.
            return "postgresql", Run.objects.count()
    raise BackupError(f"backups support SQLite and PostgreSQL, not {connection.vendor}")


def _pg(program: str, *args: str) -> None:
    db = settings.DATABASES["default"]
    env = {**os.environ}
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    command = [program, f"--dbname={db['NAME']}"]
    for flag, key in (("--host", "HOST"), ("--port", "PORT"), ("--username", "USER")):
        if db.get(key):
            command.append(f"{flag}={db[key]}")
    try:
        done = subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=3600
        )
    except FileNotFoundError:
        raise BackupError(f"{program} is not installed (Debian: postgresql-client)") from None
    if done.returncode != 0:
        raise BackupError(f"{program} failed: {done.stderr.strip()[-2000:]}")


class _Hashing:
    """A file read through once, hashed as it goes (a blob is checked as it is copied)."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data


def _add_blobs(tar: tarfile.TarFile, store: BlobStore) -> tuple[int, int, list[str]]:
    """Every blob, each checked as it is copied: (count, bytes, damaged digests). A damaged one
    (its content no longer hashes to its name) is still copied but listed in the manifest, and
    restore leaves it out: verify_store then names any row that needed it."""
    count = size = 0
    damaged: list[str] = []
    for digest in store.iter_digests():
        path = store.path(digest)
        try:
            info = tar.gettarinfo(path, f"blobs/{digest[:2]}/{digest[2:]}")
            with open(path, "rb") as f:
                reader = _Hashing(f)
                tar.addfile(info, reader)
        except FileNotFoundError:
            continue  # deleted since it was listed: no snapshot row can name it
        if reader.sha.hexdigest() != digest:
            damaged.append(digest)
            log.warning("blob %s is damaged in the store: copied, marked damaged", digest)
        count += 1
        size += info.size
    return count, size, damaged


def _add_workspaces(tar: tarfile.TarFile) -> int:
    root = Path(settings.SHIFTLOG["WORKSPACE_ROOT"])
    if not root.is_dir():
        return 0
    files = 0
    for folder in sorted(root.iterdir()):
        if not folder.name.startswith("run-") or not folder.is_dir() or folder.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in [*dirnames, *sorted(filenames)]:
                path = Path(dirpath) / name
                try:
                    info = tar.gettarinfo(path, f"workspaces/{path.relative_to(root)}")
                except (FileNotFoundError, PermissionError):
                    continue  # gone or unreadable since listed: the copy is as of its moment
                if info.isreg():
                    try:
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    except (FileNotFoundError, PermissionError):
                        continue
                    files += 1
                elif info.isdir() or info.issym():
                    tar.addfile(info)
                # sockets, fifos and devices are left out
    return files


def _add_keys(tar: tarfile.TarFile) -> None:
    for name in KEY_FILES:
        path = Path(settings.DATA_DIR) / name
        if path.is_file():
            tar.add(path, f"keys/{name}")


# --- restore ---------------------------------------------------------------------------------
def restore(source: Path) -> Summary:
    """Unpack a backup into this installation, which must hold no runs, blobs or workspaces."""
    source = Path(source)
    started = time.monotonic()
    if not source.is_file():
        raise BackupError(f"no backup file {source}")
    try:
        tar = tarfile.open(source, "r")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, OSError) as e:
        raise BackupError(f"{source} is not a Shiftlog backup: {e}") from None
    with tar:
        manifest = _manifest(tar)
        _check_vendor(manifest)
        _check_empty()
        members = _checked_members(tar)
        _restore_database(tar, members, manifest["vendor"])
        blobs, blob_bytes = _restore_blobs(tar, members, set(manifest.get("damaged_blobs", [])))
        files = _restore_tree(tar, members, "workspaces/", settings.SHIFTLOG["WORKSPACE_ROOT"])
        _restore_tree(tar, members, "keys/", settings.DATA_DIR)
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0, interactive=False)
    return Summary(
        manifest["vendor"],
        Run.objects.count(),
        blobs,
        blob_bytes,
        files,
        source.stat().st_size,
        time.monotonic() - started,
    )


def _manifest(tar: tarfile.TarFile) -> dict:
    try:
        member = tar.getmember(MANIFEST)
        manifest = json.loads(tar.extractfile(member).read())
    except (KeyError, AttributeError, ValueError, tarfile.TarError):
        raise BackupError("not a Shiftlog backup: it has no readable manifest.json") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(
            f"backup format {manifest.get('format')!r} is not one this version reads ({FORMAT})"
        )
    return manifest


def _check_vendor(manifest: dict) -> None:
    if manifest.get("vendor") != connection.vendor:
        raise BackupError(
            f"this backup is of a {manifest.get('vendor')} database and this installation uses "
            f"{connection.vendor}: restore it where the same database is configured"
        )


def _check_empty() -> None:
    from django.db.utils import DatabaseError  # noqa: PLC0415

    try:
        runs = Run.objects.exists()
    except DatabaseError:
        runs = False  # no tables yet: as empty as it gets
    if runs:
        raise BackupError("this installation already has runs: restore into an empty one")
    store = _folder_store()
    if store.root.is_dir() and next(iter(store.iter_digests()), None):
        raise BackupError(f"the blob store {store.root} is not empty")
    workspaces = Path(settings.SHIFTLOG["WORKSPACE_ROOT"])
    if workspaces.is_dir() and any(workspaces.iterdir()):
        raise BackupError(f"the workspace folder {workspaces} is not empty")


def _checked_members(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    members: dict[str, tarfile.TarInfo] = {}
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not parts:
            raise BackupError(f"unsafe name in backup: {m.name!r}")
        if parts[0] == "blobs" and not (
            m.isreg() and len(parts) == 3 and _is_digest(parts[1] + parts[2])
        ):
            raise BackupError(f"unexpected entry in the backup's blobs: {m.name!r}")
        members[m.name] = m
    return members


def _restore_database(tar: tarfile.TarFile, members: dict, vendor: str) -> None:
    name = "database/db.sqlite3" if vendor == "sqlite" else "database/db.pgdump"
    if name not in members:
        raise BackupError(f"the backup has no {name}")
    with tempfile.TemporaryDirectory(prefix="shiftlog-restore-") as tmp:
        copy = Path(tmp) / Path(name).name
        with tar.extractfile(members[name]) as f, open(copy, "wb") as out:
            shutil.copyfileobj(f, out)
        if vendor == "sqlite":
            _restore_sqlite(copy)
        else:
            _pg("pg_restore", "--clean", "--if-exists", "--no-owner", "--no-privileges", str(copy))


def _restore_sqlite(copy: Path) -> None:
    check = sqlite3.connect(copy)
    try:
        ok = check.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as e:
        raise BackupError(f"the backup's database is damaged: {e}") from None
    finally:
        check.close()
    if ok != "ok":
        raise BackupError(f"the backup's database is damaged: {ok}")
    connections.close_all()
    # Through SQLite's backup API, not a file copy: the target may be open in WAL mode.
    target = sqlite3.connect(settings.DATABASES["default"]["NAME"], timeout=20)
    source = sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def _restore_blobs(tar: tarfile.TarFile, members: dict, damaged: set[str]) -> tuple[int, int]:
    store = _folder_store()
    store.root.mkdir(parents=True, exist_ok=True)
    count = size = 0
    for name, m in members.items():
        if not name.startswith("blobs/"):
            continue
        expected = name[len("blobs/") :].replace("/", "")
        if expected in damaged:
            log.warning(
                "blob %s was damaged in the store it was backed up from: left out", expected
            )
            continue
        with tar.extractfile(m) as f:
            digest, length, _ = store.add_file(f)
        if digest != expected:
            store.delete(digest)
            raise BackupError(
                f"blob {expected} in the backup is damaged (its content hashes to {digest})"
            )
        count += 1
        size += length
    store.sync()
    return count, size


def _restore_tree(tar: tarfile.TarFile, members: dict, prefix: str, root) -> int:
    root = Path(root)
    chosen = [m for name, m in members.items() if name.startswith(prefix) and name != prefix]
    if not chosen:
        return 0
    root.mkdir(parents=True, exist_ok=True)
    files = 0
    for m in chosen:
        m = m.replace(name=m.name[len(prefix) :], deep=False)
        # The "tar" filter refuses absolute names and anything landing outside `root` (also
        # through a symlink the workspace holds); links themselves are kept as the run had them.
        tar.extract(m, root, filter="tar")
        files += m.isreg()
    return files
