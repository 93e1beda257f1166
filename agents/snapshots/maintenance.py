"""Store maintenance: which blobs checkpoints reference, checking them, pruning the rest.

Prune and concurrency. snapshot/restore/diff/verify hold the store's shared lock, prune the
exclusive one. A tree found already stored during a checkpoint has its mtime refreshed, and prune
keeps everything reachable from trees newer than its grace period, so a checkpoint whose tree has
not yet been recorded by the caller survives a prune for that long. A store without a lock (S3)
makes a blob a checkpoint relies on young again instead (agents/blobstore/s3.py says why that is
enough); prune reads each doomed blob's age again right before deleting it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from agents.blobstore import BlobCorrupt, BlobStoreBackend
from agents.snapshots.errors import CorruptBlob, SnapshotError
from agents.snapshots.hashing import hash_stream
from agents.snapshots.names import decode_name, display, join_path, to_str
from agents.snapshots.results import PruneResult
from agents.snapshots.trees import TREE_MAGIC, TreeReader, parse_tree


class StoreMaintenance:
    """Looks after the blob store as a whole: what checkpoints reach, verify, prune."""

    def __init__(self, blobs: BlobStoreBackend, trees: TreeReader):
        self.blobs = blobs
        self.trees = trees

    def referenced_blobs(self, trees: Iterable[str]) -> set[str]:
        """Every blob reachable from `trees`, the trees themselves included (missing ones too)."""
        with self.blobs.lock():
            return self._reachable(trees)

    def _reachable(self, trees: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        stack = list(trees)
        while stack:
            digest = stack.pop()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                entries = self.trees.get(digest)
            except (SnapshotError, BlobCorrupt):
                continue
            for e in entries.values():
                if e["t"] == "d":
                    stack.append(e["h"])
                elif e["t"] == "f":
                    seen.add(e["h"])
        return seen

    def verify(self, trees: Iterable[str]) -> list[str]:
        """Problems with the checkpoints `trees`: missing blobs, blobs not matching their digest,
        unreadable trees. Empty when every checkpoint can be restored."""
        problems: list[str] = []
        checked: set[str] = set()
        with self.blobs.lock():
            stack = [(t, t, b"") for t in trees]
            while stack:
                digest, root, where = stack.pop()
                if digest in checked:
                    continue
                checked.add(digest)
                label = f"{display(to_str(where)) or '/'} in checkpoint {root[:12]}"
                try:
                    data = self.blobs.get(digest)
                except FileNotFoundError:
                    problems.append(f"missing tree {digest} ({label})")
                    continue
                except BlobCorrupt:
                    data = b""  # the store checked it (S3): reported just below
                if hashlib.sha256(data).hexdigest() != digest:
                    problems.append(f"corrupt tree {digest}: content does not match ({label})")
                    continue
                try:
                    entries = parse_tree(digest, data)
                except SnapshotError as e:
                    problems.append(f"{e} ({label})")
                    continue
                for key, e in entries.items():
                    path = join_path(where, decode_name(key))
                    if e["t"] == "d":
                        stack.append((e["h"], root, path))
                    elif e["t"] == "f" and e["h"] not in checked:
                        checked.add(e["h"])
                        problem = self._check_blob(e["h"])
                        if problem:
                            shown = display(to_str(path))
                            problems.append(f"{problem} (file {shown} in checkpoint {root[:12]})")
        return problems

    def _check_blob(self, digest: str) -> str | None:
        try:
            with self.blobs.open(digest) as f:
                actual, _ = hash_stream(f)
        except FileNotFoundError:
            return f"missing blob {digest}"
        except BlobCorrupt as e:
            actual = e.actual
        if actual != digest:
            return f"corrupt blob {digest}: content hashes to {actual}"
        return None

    def prune(
        self,
        keep_trees: Iterable[str],
        keep_blobs: Iterable[str] = (),
        *,
        grace_seconds: float = 3600.0,
        dry_run: bool = False,
    ) -> PruneResult:
        """Delete blobs not reachable from `keep_trees` and not in `keep_blobs` (artifacts).

        Blobs newer than `grace_seconds`, and everything reachable from trees that new, are kept:
        they may belong to a checkpoint or artifact whose row is not written yet. Trees go first,
        parents before children, so an interrupted prune still leaves no tree naming a missing
        blob.
        """
        now = time.time()
        with self.blobs.lock(exclusive=True):
            keep = self._reachable(keep_trees) | set(keep_blobs)
            doomed: dict[str, int] = {}
            recent_trees = []
            stored = 0
            for digest, size, mtime in self.blobs.listing():
                stored += 1
                if digest in keep:
                    continue
                if now - mtime < grace_seconds:
                    if self._is_tree(digest):
                        recent_trees.append(digest)
                    keep.add(digest)
                else:
                    doomed[digest] = size
            keep |= self._reachable(recent_trees)
            doomed = {d: size for d, size in doomed.items() if d not in keep}
            order = self._deletion_order(doomed)
            if not dry_run:
                order = self._delete(order, now - grace_seconds)
                doomed = {d: doomed[d] for d in order}
            temp = 0 if dry_run else self.blobs.remove_stray_temp(grace_seconds)
        return PruneResult(
            deleted=len(order),
            bytes_freed=sum(doomed.values()),
            kept=stored - len(order),
            temp_removed=temp,
            dry_run=dry_run,
        )

    def _delete(self, order: list[str], cutoff: float) -> list[str]:
        """Delete the doomed blobs in `order`, but not one made young since it was listed (a
        checkpoint relied on it: see the module docstring), nor anything a tree so spared
        reaches (it comes later in the order). Returns those deleted."""
        spared: set[str] = set()
        deleted = []
        for digest in order:
            if digest in spared:
                continue
            try:
                young = self.blobs.mtime(digest) >= cutoff
            except FileNotFoundError:
                continue
            if young:
                spared |= self._reachable([digest])
                continue
            self.trees.forget(digest)
            if self.blobs.delete(digest):
                deleted.append(digest)
        return deleted

    def _is_tree(self, digest: str) -> bool:
        try:
            return self.blobs.read_head(digest, len(TREE_MAGIC)) == TREE_MAGIC
        except (FileNotFoundError, BlobCorrupt):
            return False

    def _deletion_order(self, doomed: dict[str, int]) -> list[str]:
        trees = [d for d in doomed if self._is_tree(d)]
        children: dict[str, list[str]] = {}
        parents_left = dict.fromkeys(trees, 0)
        for t in trees:
            try:
                entries = self.trees.get(t)
            except SnapshotError:
                entries = {}
            kids = [e["h"] for e in entries.values() if e["t"] == "d" and e["h"] in parents_left]
            children[t] = kids
            for k in kids:
                parents_left[k] += 1
        # Kahn's algorithm: a tree is deleted only once no doomed tree left names it.
        ready = [t for t, n in parents_left.items() if n == 0]
        order = []
        while ready:
            t = ready.pop()
            order.append(t)
            for k in children[t]:
                parents_left[k] -= 1
                if parents_left[k] == 0:
                    ready.append(k)
        tree_set = set(trees)
        return order + [d for d in doomed if d not in tree_set]


def iter_tree_blobs(blobs: BlobStoreBackend) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every tree stored in `blobs` (found by its magic line), parsed; for checks and tests."""
    for digest in blobs.iter_digests():
        try:
            with blobs.open(digest) as f:
                if f.read(len(TREE_MAGIC)) != TREE_MAGIC:
                    continue
                data = TREE_MAGIC + f.read()
        except (FileNotFoundError, BlobCorrupt):
            continue
        try:
            yield digest, parse_tree(digest, data)
        except CorruptBlob:
            continue
