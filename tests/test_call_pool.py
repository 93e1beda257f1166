"""The worker's threads for model calls (agents/runtime/call_pool.py): a burst of blocking calls
runs at once, up to the limit, however many calls finished before it, and submitting never waits
for a thread to start (the standard library's pool does, under its lock: with the GIL busy, 300
slices queued seconds behind each other's thread starts)."""

from __future__ import annotations

import threading
import time

import pytest

from agents.runtime.call_pool import CallPool

pytestmark = pytest.mark.no_services


def burst(submit, n: int, barrier_timeout: float = 10.0) -> list:
    """n calls that each return only once all n are running at the same time."""
    barrier = threading.Barrier(n, timeout=barrier_timeout)

    def call(i: int):
        barrier.wait()
        return i

    return [submit(lambda i=i: call(i)) for i in range(n)]


def warm(submit, rounds: int = 3, n: int = 20) -> None:
    """What a busy worker has behind it: waves of calls, each wave finished before the next."""
    for _ in range(rounds):
        futures = [submit(lambda: time.sleep(0.01)) for _ in range(n)]
        for f in futures:
            f.result(timeout=10)


def test_a_burst_runs_at_once_however_many_calls_finished_before():
    pool = CallPool(200, "test-burst")
    warm(pool.submit)
    futures = burst(pool.submit, 150)
    assert sorted(f.result(timeout=20) for f in futures) == list(range(150))
    threads, _ = pool.size()
    assert 150 <= threads <= 200, threads
    # The next burst reuses the threads that wait for work: none is started for it.
    futures = burst(pool.submit, 150)
    assert sorted(f.result(timeout=20) for f in futures) == list(range(150))
    assert pool.size()[0] == threads


def test_submitting_never_waits_for_a_thread_to_start_even_with_the_gil_busy():
    """Threads busy in Python (the GIL held in turns) while 300 callers submit at once: every
    call is running within a few seconds (the standard pool, which starts each thread under
    its lock and waits for it to run, took 11 s on the machine this was found on)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    for t in spinners:
        t.start()
    try:
        pool = CallPool(512, "test-busy")
        barrier = threading.Barrier(300, timeout=10)
        futures = []
        lock = threading.Lock()
        go = threading.Barrier(300)

        def caller() -> None:
            go.wait()
            future = pool.submit(barrier.wait)
            with lock:
                futures.append(future)

        callers = [threading.Thread(target=caller) for _ in range(300)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        results = [f.exception(timeout=30) for f in futures]
    finally:
        stop.set()
        for t in spinners:
            t.join()
    assert results == [None] * 300  # the barrier held: all 300 calls ran at the same time


def test_past_the_limit_calls_wait_their_turn_and_all_finish():
    pool = CallPool(4, "test-limit")
    running = 0
    most = 0
    lock = threading.Lock()

    def call(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return i * 2

    futures = [pool.submit(lambda i=i: call(i)) for i in range(40)]
    assert [f.result(timeout=20) for f in futures] == [i * 2 for i in range(40)]
    assert most == 4
    assert pool.size()[0] == 4


def test_an_exception_reaches_the_caller_and_the_thread_goes_on():
    pool = CallPool(1, "test-error")

    def boom():
        raise ValueError("the model said no")

    failed = pool.submit(boom)
    with pytest.raises(ValueError, match="the model said no"):
        failed.result(timeout=5)
    assert pool.submit(lambda: "next").result(timeout=5) == "next"


def test_a_cancelled_call_never_runs():
    pool = CallPool(1, "test-cancel")
    gate = threading.Event()
    first = pool.submit(gate.wait)
    ran = []
    second = pool.submit(lambda: ran.append(1))
    assert second.cancel()
    gate.set()
    assert first.result(timeout=5) is True
    assert pool.submit(lambda: "after").result(timeout=5) == "after"
    assert ran == []


def test_threads_idle_past_their_time_end_and_come_back_when_needed():
    pool = CallPool(8, "test-idle", idle_seconds=0.2)
    futures = burst(pool.submit, 8)
    assert [f.result(timeout=10) for f in futures] == list(range(8))
    deadline = time.monotonic() + 10
    while pool.size()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.size() == (0, 0)
    futures = burst(pool.submit, 8)
    assert [f.result(timeout=10) for f in futures] == list(range(8))


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError):
        CallPool(0, "none")
