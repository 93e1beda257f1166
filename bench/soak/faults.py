"""Faults at random moments drawn from the seed: what happens to a deployment in its worst week."""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field

from .cluster import LEASE_SECONDS, Cluster

KINDS = {
    # kind: weight
    "kill_worker": 4,
    "stop_worker": 2,  # SIGSTOP for longer than the lease, then SIGCONT: a zombie
    "kill_web": 2,
    "restart_redis": 2,
    "drop_pg": 2,  # pg_terminate_backend on every connection of the soak's database
    "disk_full": 1,
}


@dataclass
class Fault:
    kind: str
    at: float  # time.time() when it struck
    until: float = 0.0  # when it was over (the process back, the disk freed)
    detail: str = ""


@dataclass
class Faults:
    cluster: Cluster
    rng: random.Random
    mean_gap: float
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    log: list[Fault] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def run(self, seconds: float) -> None:
        """Strike until `seconds` have passed (or stop() is called); then stay until released.

        This thread must outlive the processes it restarted: PR_SET_PDEATHSIG, which makes them
        die with the soak, fires when the *thread* that started them ends."""
        try:
            self._strike(seconds)
        finally:
            self.done.set()
            self.release.wait()

    def _strike(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        kinds = list(self.kinds)
        weights = [KINDS[k] for k in kinds]
        while not self.stopping.is_set():
            gap = self.rng.expovariate(1 / self.mean_gap)
            if time.monotonic() + gap >= end or self.stopping.wait(gap):
                return
            kind = self.rng.choices(kinds, weights)[0]
            fault = Fault(kind, time.time())
            try:
                getattr(self, kind)(fault)
            except Exception as e:
                fault.detail = f"could not: {type(e).__name__}: {e}"
            fault.until = fault.until or time.time()
            self.log.append(fault)

    def stop(self) -> None:
        self.stopping.set()

    def _worker(self):
        return self.rng.choice(self.cluster.workers)

    def kill_worker(self, fault: Fault) -> None:
        w = self._worker()
        w.kill_group()
        self.kills += 1
        fault.detail = w.name
        time.sleep(self.rng.uniform(0.2, 2.0))
        w.start()
        self.restarts += 1

    def stop_worker(self, fault: Fault) -> None:
        w = self._worker()
        w.signal(signal.SIGSTOP)
        fault.detail = w.name
        time.sleep(LEASE_SECONDS + self.rng.uniform(2, 5))
        w.signal(signal.SIGCONT)

    def kill_web(self, fault: Fault) -> None:
        web = self.cluster.web
        web.kill_group()
        self.kills += 1
        time.sleep(self.rng.uniform(0.2, 1.5))
        web.start()
        self.cluster.wait_port(self.cluster.web_port, "daphne")
        self.restarts += 1

    def restart_redis(self, fault: Fault) -> None:
        self.cluster.restart_redis(self.rng.uniform(0.5, 3.0))
        self.restarts += 1

    def drop_pg(self, fault: Fault) -> None:
        fault.detail = f"{self.cluster.drop_pg_connections()} connections"

    def disk_full(self, fault: Fault) -> None:
        ballast = self.cluster.fill_disk()
        if ballast is None:
            fault.detail = "simulated: no filesystem of its own here"
            return
        fault.detail = self.cluster.disk
        time.sleep(self.rng.uniform(2, 6))
        ballast.unlink(missing_ok=True)
