"""Listing a workspace for a checkpoint (see scan.py): folders opened by descriptor, one stat
per entry; files whose stat differs from their record are queued (scan.pending) to be read.

`walk` lists every folder; `walk_changed` only those a ScanPlan names (from a change feed),
reaching them through their ancestors' cached records; every other folder is `pinned`: its
cached record is taken as it is, without a system call."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from agents.snapshots.cache import FolderRecord, join_key
from agents.snapshots.names import encode_name, to_str
from agents.snapshots.scan_state import PendingFile, ScannedFolder, ScanPlan, ScanState

# O_NOFOLLOW: a folder replaced by a link since it was listed is never entered.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk(fd: int, path: bytes, dkey: str, scan: ScanState) -> ScannedFolder:
    """List folder `fd` (at absolute `path`, key `dkey`) and its sub-folders, reusing what
    the cached records still vouch for; files to read go to `scan.pending`."""
    d, subs = _list(fd, path, dkey, scan)
    for i in subs:
        child = _enter(d, fd, i, scan, walk)
        if child is not None:
            d.children.append((i, child))
    return d


def walk_changed(fd: int, path: bytes, dkey: str, scan: ScanState, plan: ScanPlan) -> ScannedFolder:
    """Like walk, for the folders `plan` names only: a folder to list is listed (its new or
    replaced sub-folders walked whole), a folder only on the way to one keeps its record, and
    any sub-folder nothing was reported under is pinned."""
    if dkey in plan.deep:
        return walk(fd, path, dkey, scan)
    old = scan.old.get(dkey)
    if old is None or dkey in plan.listed:
        d, subs = _list(fd, path, dkey, scan)
        if old is not None:
            before = {old.names[j]: old.sig[j][4] for j in old.subdirs}
            now = {d.names[i]: d.sig[i][4] for i in subs}
            # Sub-folders gone, or replaced by another folder (a new inode): drop their records.
            for name, ino in before.items():
                if now.get(name) != ino:
                    scan.gone.add(join_key(dkey, encode_name(os.fsencode(name))))
    else:
        d = ScannedFolder(path, dkey, old)
        d.fast = True
        d.names, d.keys, d.sig, d.vals = old.names, old.keys, old.sig, old.vals
        subs = old.subdirs
    for i in subs:
        key = join_key(dkey, d.keys[i])
        rec = scan.old.get(key)
        if rec is None or key in scan.gone:
            child = _enter(d, fd, i, scan, walk)  # new, or replaced: walked whole
        elif key in plan.visit:
            child = _enter(d, fd, i, scan, lambda *a: walk_changed(*a, plan))
        else:
            child = pinned(path + b"/" + os.fsencode(d.names[i]), key, rec)
        if child is not None:
            d.children.append((i, child))
    return d


def pinned(path: bytes, key: str, rec: FolderRecord) -> ScannedFolder:
    """A folder taken as its cached record says, subtree and all (build.py leaves it alone)."""
    d = ScannedFolder(path, key, rec)
    d.fast = d.pinned = True
    # Its entries stay in `rec` (nothing reads a pinned folder's own lists): a record read
    # lazily (journal.py) is then never parsed for a folder the scan only passes by.
    d.rec = rec
    return d


def _enter(d: ScannedFolder, fd: int, i: int, scan: ScanState, how) -> ScannedFolder | None:
    """Open sub-folder `i` of `d` and scan it with `how`; None (and the entry left out) when it
    is gone or no longer a folder."""
    name = d.names[i]
    sub = open_dir(fd, name)
    if sub is None:
        if d.fast:
            d.fast = False
            d.vals = list(d.vals)
        d.vals[i] = None
        d.stale.append(i)
        return None
    try:
        return how(sub, d.path + b"/" + os.fsencode(name), join_key(d.key, d.keys[i]), scan)
    finally:
        os.close(sub)


def _list(fd: int, path: bytes, dkey: str, scan: ScanState) -> tuple[ScannedFolder, list[int]]:
    """List and stat folder `fd` against its record; returns it and its sub-folders' indexes."""
    # The hot loop of a checkpoint: one stat per entry and, for a folder whose names and
    # stats all equal its record, nothing else per entry.
    scan.listed += 1
    with os.scandir(fd) as it:
        items = list(it)
    names = [e.name for e in items]
    try:
        sts = [e.stat(follow_symlinks=False) for e in items]
    except FileNotFoundError:
        sts = None
    old = scan.old.get(dkey)
    d = ScannedFolder(path, dkey, old)
    if sts is None:
        # Something vanished while listing: keep what is still there.
        kept = []
        for e in items:
            with contextlib.suppress(FileNotFoundError):
                kept.append((e.name, e.stat(follow_symlinks=False)))
        names = [n for n, _ in kept]
        sts = [s for _, s in kept]
    sig = [(s.st_mode, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for s in sts]
    if old is not None and not old.stale and old.sig == sig and old.names == names:
        d.fast = True
        d.names, d.keys, d.sig, d.vals = old.names, old.keys, old.sig, old.vals
        subs = old.subdirs
    else:
        subs = _compare(d, fd, names, sts, sig, scan)
    return d, subs


def _compare(
    d: ScannedFolder,
    fd: int,
    names: list[str],
    sts: list[os.stat_result],
    sig: list[tuple[int, int, int, int, int]],
    scan: ScanState,
) -> list[int]:
    """Fill a changed folder entry by entry, reusing what its record still vouches for;
    returns the indexes of its sub-folders."""
    old = d.old
    index: dict[str, int] = {}
    old_stale: tuple[int, ...] = ()
    if old is not None:
        index = {n: j for j, n in enumerate(old.names)}
        old_stale = old.stale
    d.names, d.sig = names, sig
    keys, vals, stale = d.keys, d.vals, d.stale
    subs = []
    for i, name in enumerate(names):
        raw = os.fsencode(name)
        keys.append(encode_name(raw))
        s = sig[i]
        j = index.get(name)
        same = j is not None and old.sig[j] == s and j not in old_stale
        fmt = stat.S_IFMT(s[0])
        if fmt == stat.S_IFREG:
            if same:
                vals.append(old.vals[j])
            else:
                vals.append(None)
                scan.pending.append(PendingFile(d, i, d.path + b"/" + raw, sts[i]))
        elif fmt == stat.S_IFDIR:
            vals.append(None)  # its tree digest, once built
            subs.append(i)
        elif fmt == stat.S_IFLNK:
            if same:
                vals.append(old.vals[j])
                continue
            try:
                target = os.readlink(raw, dir_fd=fd)
            except (FileNotFoundError, OSError):
                vals.append(None)
                stale.append(i)
                continue
            vals.append(encode_name(target))
            # A link replaced within one timestamp tick could keep its stat: like files,
            # trust the target only once its timestamps are in the past.
            if max(s[2], s[3]) >= scan.trusted_before:
                stale.append(i)
        else:
            vals.append(None)
            stale.append(i)
            scan.skipped.append(to_str((d.path + b"/" + raw)[scan.strip :]))
    return subs


def open_dir(fd: int, name: str) -> int | None:
    """A descriptor for sub-folder `name` of `fd`, or None when it is gone or no longer a folder."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link since it was listed
            return None
        raise
