"""A workspace folder as a .tar.gz for `PUT /runs/{id}/workspace`."""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import IO

# Archives up to this size stay in memory; larger ones spill to a temporary file.
SPOOL_BYTES = 8 * 1024 * 1024


class WorkspaceArchiveError(ValueError):
    """The folder holds something the API would refuse: a link leaving it, a device, a socket."""


def _inside(root: Path, target: Path) -> bool:
    try:
        target.relative_to(root)
    except ValueError:
        return False
    return True


def build_archive(folder: str | os.PathLike[str]) -> tuple[IO[bytes], int]:
    """Tar and gzip everything under `folder` (`.git` included, names relative to it) into a
    spooled temporary file; return it rewound, and its size.

    Symlinks are stored as links (never followed) and must point inside the folder; hard links
    are stored as plain files. A symlink leaving the folder, a device, a FIFO or a socket raises
    `WorkspaceArchiveError` naming it, before anything is sent.
    """
    root = Path(folder).resolve()
    if not root.is_dir():
        raise WorkspaceArchiveError(f"{folder} is not a folder")
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (returned open)
    try:
        with tarfile.open(fileobj=spool, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
                dirnames.sort()
                here = Path(dirpath)
                for name in sorted(dirnames) + sorted(filenames):
                    _add(tar, root, here / name)
        size = spool.tell()
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool, size


def _add(tar: tarfile.TarFile, root: Path, path: Path) -> None:
    arcname = path.relative_to(root).as_posix()
    st = path.lstat()
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        # An absolute target would point elsewhere once unpacked in the run's workspace.
        lexical = Path(os.path.normpath(path.parent / target))
        if os.path.isabs(target) or not _inside(root, lexical) or not _inside(root, path.resolve()):
            raise WorkspaceArchiveError(f"{arcname} is a symlink leaving the folder ({target})")
        info.type = tarfile.SYMTYPE
        info.linkname = target
        tar.addfile(info)
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        with path.open("rb") as f:
            info.size = os.fstat(f.fileno()).st_size
            tar.addfile(info, f)
    else:
        raise WorkspaceArchiveError(f"{arcname} is not a file, folder or symlink")
