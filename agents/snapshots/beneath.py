"""Opening a file of a workspace without following a symlink at any level.

An agent's process may swap a folder of its workspace for a link to somewhere else (its own
filesystem's `/etc`, our data folder) between the moment a scan lists a file and the moment it is
read. A plain open of the absolute path would follow that link and hand the outside file to a
checkpoint or a diff page. Every folder on the way is opened here with O_NOFOLLOW, relative to the
one before it; the file itself too, and it must be a regular file (O_NONBLOCK: a FIFO put in its
place does not block the open)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_beneath(root: bytes | str | Path, raw: bytes) -> int:
    """A read-only descriptor of the regular file at `raw` (relative, /-separated) under
    `root`. A link anywhere on the way raises OSError (ELOOP or ENOTDIR); an empty, `.` or `..`
    part, or anything but a regular file at the end, raises OSError(EINVAL)."""
    parts = raw.split(b"/")
    if any(part in (b"", b".", b"..") for part in parts):
        raise OSError(errno.EINVAL, f"not a plain relative path: {raw!r}")
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, DIR_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd = os.open(parts[-1], FILE_FLAGS, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file any more")
    return fd
