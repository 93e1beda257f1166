"""Pushed, not polled: the API's long polls are woken by a commit in another process
(agents.wakeups), and the SQLite queue's idle consumer thread by an enqueue from another
process (agents.worker.WakingSqliteStorage). The fallback looks are set out of reach, so a wake
that does not come fails the test instead of being covered by a look."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents import wakeups
from agents.worker import WakingSqliteStorage
from tests.helpers import make_run
from tests.procs import process_env

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_a_commit_in_another_process_wakes_a_long_poll(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(wakeups, "RECHECK_SECONDS", 600)
    run = make_run()
    other = make_run()
    writer = textwrap.dedent(
        """
        import sys
        import django
        django.setup()
        from agents import eventlog
        from dashboard.live import hub
        eventlog.append(int(sys.argv[1]), "harness.message", {"text": "hi"}, actor="test")
        hub.pusher.flush()  # with Redis: published before this process exits
        """
    )

    def commit(run_id: int) -> None:
        subprocess.run(
            [sys.executable, "-c", writer, str(run_id)],
            cwd=REPO,
            env=process_env(tmp_path),
            check=True,
            timeout=120,
        )

    async def wait() -> list[bool]:
        woken = []
        async with wakeups.watching(run.pk) as event:
            assert wakeups.waker.ready.wait(30)
            await asyncio.to_thread(commit, other.pk)  # another run's event: not ours
            woken.append(event.is_set())
            await asyncio.to_thread(commit, run.pk)
            await asyncio.wait_for(event.wait(), 60)  # no look comes: only a wake ends this
            woken.append(event.is_set())
        return woken

    assert asyncio.run(wait()) == [False, True]


def test_an_enqueue_from_another_process_wakes_an_idle_consumer_thread(tmp_path) -> None:
    filename = str(tmp_path / "queue.sqlite3")
    storage = WakingSqliteStorage(name="wake-test", filename=filename)
    assert storage.blocking
    storage.READ_TIMEOUT = 0.01
    assert storage.dequeue() is None  # empty: the thread's watch is set up meanwhile
    storage.READ_TIMEOUT = 600  # a wake that does not come would hang here (pytest's timeout)
    enqueue = textwrap.dedent(
        """
        import sys, time
        from agents.worker import WakingSqliteStorage
        time.sleep(0.5)  # the consumer thread is asleep on its watch by now
        WakingSqliteStorage(name="wake-test", filename=sys.argv[1]).enqueue(b"task")
        """
    )
    other = subprocess.Popen([sys.executable, "-c", enqueue, filename], cwd=REPO)
    try:
        assert storage.dequeue() == b"task"
    finally:
        other.wait(60)
    assert other.returncode == 0


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_without_redis_a_commit_is_pushed_by_notify(
    tmp_path, monkeypatch, settings
) -> None:
    """PostgreSQL with no Redis hub: the append NOTIFYs at commit and the waker LISTENs, so a
    long poll is woken without anyone reading the log on a timer."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's LISTEN/NOTIFY (the PostgreSQL + Redis pass)")
    monkeypatch.setattr(wakeups, "RECHECK_SECONDS", 600)
    monkeypatch.setattr(wakeups, "TAIL_SECONDS", 600)
    monkeypatch.setitem(settings.SHIFTLOG, "LIVE_PUSH", False)
    run = make_run()
    env = process_env(tmp_path)
    env.pop("REDIS_URL", None)  # the writer has no hub either: it NOTIFYs
    writer = textwrap.dedent(
        """
        import sys
        import django
        django.setup()
        from agents import eventlog
        eventlog.append(int(sys.argv[1]), "harness.message", {"text": "hi"}, actor="test")
        """
    )

    async def wait() -> bool:
        async with wakeups.watching(run.pk) as event:
            assert wakeups.waker.ready.wait(30)
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", writer, str(run.pk)],
                cwd=REPO,
                env=env,
                check=True,
                timeout=120,
            )
            await asyncio.wait_for(event.wait(), 60)  # no look comes: only a NOTIFY ends this
            return event.is_set()

    assert asyncio.run(wait())
