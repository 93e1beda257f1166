"""What one scan of a workspace carries from phase to phase: listing and stat-ing (walk.py),
reading files (hashing.py), building folder records and trees (build.py), storing (scan.py)."""

from __future__ import annotations

import os

from agents.snapshots.cache import FolderRecord


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
        self.new: dict[str, FolderRecord] = {}
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
        self.freshen: list[str] = []
        self.root = ""
        self.files = self.dirs = self.links = self.bytes_total = 0
        self.hashed = self.blobs_added = self.bytes_added = 0
