"""Building a scanned workspace's folder records and tree digests, children first.

A folder whose names, stats and sub-folder digests are all unchanged keeps its cached record (and
tree digest) as is; any other gets its tree built (trees.tree_bytes) and hashed, and a rebuilt
record equal to the cached one is replaced by it, so the cache log gets no line for that folder.
For restore and diff it also notes every folder's record by tree digest and, for diff, a live
path for each file digest. Nothing is stored here: scan.py decides what to write.
"""

from __future__ import annotations

import hashlib
import os
import stat

from agents.snapshots.cache import FolderRecord
from agents.snapshots.scan_state import ScannedFolder, ScanState
from agents.snapshots.trees import entries_of, tree_bytes


def build(d: ScannedFolder, scan: ScanState) -> None:
    """Digest of folder `d` and its new record, children first. A pinned folder keeps its record
    (an incremental scan starts `scan.new` from the cached records, so its subtree's are there)."""
    if d.pinned:
        return
    for _, child in d.children:
        build(child, scan)
    old = d.old
    if d.fast and all(child.rec.tree == old.vals[i] for i, child in d.children):
        rec = old
    else:
        vals = list(d.vals) if d.fast else d.vals
        below = [0, 0, len(d.children), 0]
        for i, child in d.children:
            vals[i] = child.rec.tree
            for n, x in enumerate(child.rec.totals):
                below[n] += x
        entries = entries_of(d.keys, d.sig, vals)
        files = links = size = 0
        for e in entries.values():
            t = e["t"]
            if t == "f":
                files += 1
                size += e["s"]
            elif t == "l":
                links += 1
        totals = (below[0] + files, below[1] + size, below[2], below[3] + links)
        d.data = tree_bytes(entries)
        digest = hashlib.sha256(d.data).hexdigest()
        rec = FolderRecord(
            d.names, d.keys, d.sig, vals, tuple(sorted(set(d.stale))), digest, totals, entries
        )
        if (
            old is not None
            and rec.tree == old.tree
            and rec.stale == old.stale
            and rec.sig == old.sig
            and rec.keys == old.keys
            and rec.vals == old.vals
        ):
            rec = old
    d.rec = rec
    scan.new[d.key] = rec
    if scan.keep_trees:
        scan.trees[rec.tree] = rec
        scan.counts[rec.tree] = rec.totals[0]
    if scan.live_paths:
        for i, s in enumerate(rec.sig):
            if stat.S_ISREG(s[0]) and rec.vals[i] is not None and i not in d.fresh:
                scan.live.setdefault(rec.vals[i], d.path + b"/" + os.fsencode(rec.names[i]))
