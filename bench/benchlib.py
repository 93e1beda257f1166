"""What the benchmarks share for their PostgreSQL + Redis runs: the servers, and a Redis db of
their own (claimed with a key, never the test suite's), cleaned up without FLUSHDB.

SHIFTLOG_BENCH_PG and SHIFTLOG_BENCH_REDIS name the servers (defaults: this machine's).
"""

from __future__ import annotations

import os
import platform
import random
from pathlib import Path

PG_SERVER = os.environ.get("SHIFTLOG_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
REDIS_SERVER = os.environ.get("SHIFTLOG_BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
REDIS_CLAIM = "shiftlog-bench:claim"


def machine() -> str:
    """ "machine: N cores (CPU model), platform": what every benchmark prints first."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"machine: {os.cpu_count()} cores{f' ({cpu})' if cpu else ''}, {platform.platform()}"


def pg_admin(sql: str, timeout: int = 10) -> None:
    """Run one statement on the server's `postgres` database (CREATE / DROP DATABASE)."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=timeout) as c:
        c.execute(sql)


def pg_available() -> tuple[bool, str]:
    """(True, server version) or (False, why not)."""
    try:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3) as c:
            return True, str(c.execute("SHOW server_version").fetchone()[0])
    except Exception as e:  # any failure means "not answering"
        return False, f"PostgreSQL at {PG_SERVER}: {type(e).__name__}: {e}".strip()


def redis_available() -> tuple[bool, str]:
    """(True, server version) or (False, why not)."""
    try:
        import redis

        r = redis.Redis.from_url(f"{REDIS_SERVER}/0", socket_timeout=3)
        return True, str(r.info("server").get("redis_version"))
    except Exception as e:
        return False, f"Redis at {REDIS_SERVER}: {type(e).__name__}: {e}".strip()


def _test_redis_db() -> int | None:
    """The db the test suite uses (tests/postgres_redis.py): never borrowed, even when it is empty."""
    url = os.environ.get("SHIFTLOG_TEST_REDIS", "redis://127.0.0.1:6379/14")
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


def claim_redis_db(token: str) -> int:
    """An empty Redis db (1-15, not the tests' one), claimed with a key holding `token`, so
    another benchmark (or anything that looks for an empty db) leaves it alone."""
    import redis

    dbs = [n for n in range(1, 16) if n != _test_redis_db()]
    random.shuffle(dbs)
    for db in dbs:
        r = redis.Redis.from_url(f"{REDIS_SERVER}/{db}", socket_timeout=3)
        if r.dbsize() == 0 and r.set(REDIS_CLAIM, token, nx=True, ex=3600):
            if r.dbsize() == 1:
                return db
            r.delete(REDIS_CLAIM)  # someone else started using it at the same moment
    raise RuntimeError(f"no empty Redis db among 1-15 on {REDIS_SERVER}; free one and try again")


def release_redis_db(db: int, token: str, huey_name: str) -> list[str]:
    """Delete what the benchmark's processes wrote (channels-redis `asgi*` keys, the huey queue
    named `huey_name`) and the claim; never FLUSHDB. Returns (some of) the keys left."""
    import redis

    r = redis.Redis.from_url(f"{REDIS_SERVER}/{db}", socket_timeout=10)
    if r.get(REDIS_CLAIM) != token.encode():
        return [f"{REDIS_CLAIM} is not ours any more: nothing deleted"]
    for pattern in ("asgi*", f"*{huey_name}*"):
        for key in r.scan_iter(match=pattern, count=500):
            r.delete(key)
    r.delete(REDIS_CLAIM)
    return [k.decode(errors="replace") for k in r.scan_iter(count=100)][:5]
