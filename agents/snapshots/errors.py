"""What the snapshot store raises when the blob store cannot give it what a tree promises."""

from __future__ import annotations


class SnapshotError(Exception):
    pass


class MissingBlob(SnapshotError):
    pass


class CorruptBlob(SnapshotError):
    pass
