#!/usr/bin/env python
"""What the S3 blob store costs, beside plain boto3 moving the same bytes.

    .venv/bin/python bench/s3_store.py                      # 10,000 files, 100 MB
    .venv/bin/python bench/s3_store.py --files 1000 --mb 10 --repeat 10

Starts moto's S3 server on a free loopback port (it dies with this process), makes a bucket, and
generates the workspace bench/checkpoint.py uses (deterministic, nested folders, log-normal
sizes). Then:

  restore      the first checkpoint (snapshot() into the S3 store) is restored into an empty
               folder: Snapshots(store).restore(tree, folder), every blob downloaded and checked
               against its digest. Beside it, plain boto3: get_object of every object the store
               holds for that checkpoint (file blobs and trees), written to files, in a pool of
               the same size. --repeat-restore times each, interleaved; medians.
  one change   a small text file gets one more line (a different one each time), then a
               checkpoint through the workspace's change feed (feed.acquire / feed.active, as
               agents/workspaces.py does): the per-call cost of storing a tool call's effect.
               Beside it, plain boto3: one put_object of that file's new content. --repeat
               times each, interleaved; medians.

Ratios are ours over plain (1.0 = as fast as plain boto3). moto is an in-process Python server on
the same 2 cores, so absolute times say more about moto than about S3; the ratios are the point.
The last line is one JSON object with the figures. The bucket and every temporary folder are
deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import machine  # bench/benchlib.py, beside this script
from checkpoint import generate  # bench/checkpoint.py: the same workspaces

from agents.blobstore.s3 import S3BlobStore
from agents.snapshots import Snapshots, feed
from tests.s3 import CREDENTIALS, MotoServer, empty_and_delete


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def plain_download(client, bucket: str, keys: list[str], folder: Path, workers: int) -> None:
    folder.mkdir()

    def get(i_key: tuple[int, str]) -> None:
        i, key = i_key
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        (folder / str(i)).write_bytes(body)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(get, enumerate(keys)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--mb", type=float, default=100.0, help="the workspace's total size")
    ap.add_argument("--workers", type=int, default=8, help="the download/upload pool's size")
    ap.add_argument("--repeat", type=int, default=20, help="one-change checkpoints to time")
    ap.add_argument("--repeat-restore", type=int, default=3)
    args = ap.parse_args()

    print(machine())
    print(f"workspace: {args.files:,} files, {args.mb:g} MB; pool of {args.workers}")
    base = Path(tempfile.mkdtemp(prefix="shiftlog-s3-bench-"))
    server = MotoServer()
    os.environ.update(server.env())
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    try:
        store = S3BlobStore(f"s3://{bucket}/blobs", workers=args.workers)
        client = store.client
        client.create_bucket(Bucket=bucket)
        snaps = Snapshots(store)
        ws = base / "ws"
        texts = generate(ws, args.files, int(args.mb * 1e6), seed=21)
        size = sum(p.stat().st_size for p in ws.rglob("*") if p.is_file())

        started = time.perf_counter()
        first = snaps.snapshot(ws, cache_path=base / "cache.json")
        first_s = time.perf_counter() - started
        keys = [store.key(d) for d in sorted(snaps.referenced_blobs([first.tree]))]

        ours, plain = [], []
        for i in range(args.repeat_restore):
            target = base / f"restored-{i}"
            t = time.perf_counter()
            res = snaps.restore(first.tree, target)
            ours.append(time.perf_counter() - t)
            assert res.written == first.files, (res.written, first.files)
            shutil.rmtree(target)
            folder = base / f"plain-{i}"
            t = time.perf_counter()
            plain_download(client, bucket, keys, folder, args.workers)
            plain.append(time.perf_counter() - t)
            shutil.rmtree(folder)
        restore_ours, restore_plain = statistics.median(ours), statistics.median(plain)

        # One small change per call, through the change feed, as a worker stores a tool call.
        watching = feed.acquire(ws)
        try:
            snaps.snapshot(ws, cache_path=base / "cache.json", feed=feed.active(ws))
            small = sorted((p for p in texts if p.stat().st_size < 4096), key=str)
            ours, plain, incremental = [], [], 0
            for i in range(args.repeat):
                path = small[i % len(small)]
                with path.open("a") as f:
                    f.write(f"one more line {i}\n")
                t = time.perf_counter()
                res = snaps.snapshot(ws, cache_path=base / "cache.json", feed=feed.active(ws))
                ours.append(time.perf_counter() - t)
                incremental += res.incremental
                data = path.read_bytes()
                t = time.perf_counter()
                client.put_object(Bucket=bucket, Key=f"plain/{uuid.uuid4().hex}", Body=data)
                plain.append(time.perf_counter() - t)
        finally:
            feed.release(watching)
            feed.close_all()
        call_ours, call_plain = statistics.median(ours), statistics.median(plain)
    finally:
        try:
            empty_and_delete(bucket)
        finally:
            server.stop()
            shutil.rmtree(base, ignore_errors=True)
            for k in [*CREDENTIALS, "AWS_ENDPOINT_URL"]:
                os.environ.pop(k, None)

    print()
    print(
        f"first checkpoint into the store: {first_s:.2f} s ({size / 1e6:.0f} MB, {len(keys):,} objects)"
    )
    print(f"{'':32} {'Shiftlog':>12} {'plain boto3':>12} {'ratio':>7}")
    print(
        f"{'restore into an empty folder':32} {restore_ours:>10.2f} s {restore_plain:>10.2f} s "
        f"{restore_ours / restore_plain:>7.2f}"
    )
    print(
        f"{'one small change (per call)':32} {ms(call_ours):>9.1f} ms {ms(call_plain):>9.1f} ms "
        f"{call_ours / call_plain:>7.2f}"
    )
    print(f"({incremental} of {args.repeat} change checkpoints were incremental)")
    print(
        json.dumps(
            {
                "files": args.files,
                "bytes": size,
                "objects": len(keys),
                "workers": args.workers,
                "first_checkpoint_s": round(first_s, 3),
                "restore_s": round(restore_ours, 3),
                "restore_plain_boto3_s": round(restore_plain, 3),
                "restore_ratio": round(restore_ours / restore_plain, 2),
                "change_checkpoint_ms": ms(call_ours),
                "change_plain_put_ms": ms(call_plain),
                "change_ratio": round(call_ours / call_plain, 2),
                "incremental": incremental,
                "repeat": args.repeat,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
