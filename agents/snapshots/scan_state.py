"""What one scan of a workspace carries from phase to phase: listing and stat-ing (walk.py),
reading files (hashing.py), building folder records and trees (build.py), storing (scan.py)."""

from __future__ import annotations

import os

from agents.snapshots.cache import FolderRecord, Records


class ScannedFolder:
    """A folder during a scan. `fast`: its names and stats equal its cached record `old`, so
    (once its sub-folders' digests are known to be unchanged too) that record is reused as is."""

    __slots__ = (
        "children",
        "data",
        "fast",
        "fresh",
        "key",
        "keys",
        "names",
        "old",
        "path",
        "pinned",
        "rec",
        "sig",
        "stale",
        "vals",
    )

    def __init__(self, path: bytes, key: str, old: FolderRecord | None):
        self.path = path
        self.key = key  # the folder's key in the StatCache
        self.old = old
        self.fast = False
        self.pinned = False  # taken from its record without being listed (walk.pinned)
        self.names: list[str] = []
        self.keys: list[str] = []
        self.sig: list[tuple[int, int, int, int, int]] = []
        self.vals: list[str | None] = []
        self.stale: list[int] = []
        self.fresh: set[int] = set()  # entries read (and stored) by this scan
        self.children: list[tuple[int, ScannedFolder]] = []
        # The record after the scan (`old` itself when unchanged).
        self.rec: FolderRecord | None = None
        self.data: bytes | None = None  # the tree blob, when it was built by this scan


class PendingFile:
    """A file to read: entry `i` of folder `d`, at absolute `path`, `st` its stat when listed."""

    __slots__ = ("d", "i", "path", "st")

    def __init__(self, d: ScannedFolder, i: int, path: bytes, st: os.stat_result):
        self.d = d
        self.i = i
        self.path = path
        self.st = st


class RescanFolder(Exception):
    """A cached digest's blob is missing and the file no longer has that content."""

    def __init__(self, key: str):
        self.key = key


class ScanPlan:
    """Which folders an incremental scan looks at (StatCache keys): `listed` ones are listed and
    stat-ed again, `deep` ones walked whole, `visit` holds those and their ancestors; every
    other folder keeps its cached record without a system call. Made from a trusted change
    feed's Changes plus every folder whose record has entries not to be trusted as they are."""

    __slots__ = ("deep", "listed", "visit")

    def __init__(self, listed: set[str], deep: set[str], old: dict[str, FolderRecord]):
        stale_keys = getattr(old, "stale_keys", None)  # lazy.LazyDirs, cache.Records: kept
        stale = stale_keys() if stale_keys else {k for k, rec in old.items() if rec.stale}
        self.listed = listed | stale
        self.deep = deep
        visit: set[str] = set()
        for key in self.listed | deep:
            while key not in visit:
                visit.add(key)
                if not key:
                    break
                key = key.rpartition("/")[0]
        self.visit = visit


class ScanState:
    def __init__(
        self,
        old: dict[str, FolderRecord],
        trusted_before: int,
        live_paths: bool,
        strip: int,
        keep_trees: bool,
    ):
        self.old = old
        self.new: dict[str, FolderRecord] = Records()
        self.trusted_before = trusted_before
        self.strip = strip
        self.pending: list[PendingFile] = []
        self.skipped: list[str] = []
        self.live_paths = live_paths  # diffs read live files: remember where each digest was
        self.keep_trees = keep_trees  # restore and diff look at the live trees: keep them by digest
        self.trees: dict[str, FolderRecord] = {}  # digest -> record, for every folder seen
        self.counts: dict[str, int] = {}  # tree digest -> files under it
        self.live: dict[str, bytes] = {}  # file digest -> a path with that content
        self.new_trees: list[bytes] = []  # tree blobs to write, children first
        self.batch = None  # the checkpoint's blobstore.Batch (None: only hash)
        # Folders an incremental scan found gone or replaced (their records, and those below,
        # are dropped from `new`).
        self.gone: set[str] = set()
        self.listed = 0  # folders listed and stat-ed
        self.incremental = False
        self.freshen: list[str] = []
        self.root = ""
        self.files = self.dirs = self.links = self.bytes_total = 0
        self.hashed = self.blobs_added = self.bytes_added = 0
