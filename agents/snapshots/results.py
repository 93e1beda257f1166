"""What Snapshots' methods return: plain dataclasses, paths as described in names.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.snapshots.names import to_bytes


@dataclass
class SnapshotResult:
    tree: str
    files: int
    bytes_total: int
    blobs_added: int
    bytes_added: int
    hashed_files: int
    seconds: float
    dirs: int = 0
    links: int = 0
    skipped: list[str] = field(default_factory=list)
    # Whether a trusted change feed let it look only at the folders reported changed, and how
    # many folders it listed.
    incremental: bool = False
    listed_dirs: int = 0
    # Whether it used another process's feed (journal.py) rather than one of this process.
    borrowed: bool = False


@dataclass
class RestoreResult:
    written: int
    removed: int
    unchanged: int
    links: int
    dirs_created: int
    modes_set: int
    seconds: float
    dry_run: bool = False
    actions: list[tuple[str, str]] = field(default_factory=list)
    incremental: bool = False


@dataclass(frozen=True)
class Entry:
    path: str
    type: str
    hash: str | None = None
    mode: int | None = None
    size: int | None = None
    target: str | None = None

    @property
    def raw_path(self) -> bytes:
        return to_bytes(self.path)


@dataclass
class Change:
    path: str
    status: str  # added | removed | changed | type_changed | mode_changed
    old_type: str | None = None
    new_type: str | None = None
    old_hash: str | None = None
    new_hash: str | None = None
    old_mode: int | None = None
    new_mode: int | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_target: str | None = None
    new_target: str | None = None
    binary: bool | None = None
    diff: str | None = None
    note: str | None = None


@dataclass
class PruneResult:
    deleted: int
    bytes_freed: int
    kept: int
    temp_removed: int
    dry_run: bool = False
