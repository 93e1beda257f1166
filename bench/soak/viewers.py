"""WebSocket viewers kept connected through everything: each watches one run's page socket at a
time, reconnects (with `?after=` the last seq it holds, as the page's own script does) whenever
the socket drops, and records every event seq it is sent, in the order it came."""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field

SEQ_RE = re.compile(r'data-seq="(\d+)"')


@dataclass
class Watch:
    run_id: int
    seqs: list[int] = field(default_factory=list)
    reconnects: int = 0

    def describe(self, last_seq: int) -> str:
        """What went wrong, in seqs: missing, doubled, out of order."""
        expected = set(range(1, last_seq + 1))
        missing = sorted(expected - set(self.seqs))[:10]
        seen, doubled = set(), []
        for q in self.seqs:
            if q in seen:
                doubled.append(q)
            seen.add(q)
        disorder = [b for a, b in zip(self.seqs, self.seqs[1:], strict=False) if b <= a][:10]
        return (
            f"missing {missing}, doubled {doubled[:10]}, out of order {disorder}, "
            f"{self.reconnects} reconnect(s)"
        )

    def problems(self, last_seq: int) -> int:
        """Events missing, doubled or out of order, against the log's 1..last_seq. Events after
        it (appended once the run was over, while the viewer was still there) are no problem."""
        missing = len(set(range(1, last_seq + 1)) - set(self.seqs))
        doubled = len(self.seqs) - len(set(self.seqs))
        disorder = sum(1 for a, b in zip(self.seqs, self.seqs[1:], strict=False) if b <= a)
        return missing + doubled + disorder


class Viewers:
    def __init__(self, port: int, cookie: str, count: int):
        self.port, self.cookie, self.count = port, cookie, count
        self.finished_runs: dict[int, int] = {}  # run id -> last seq, set when the run is over
        self.candidates: list[int] = []  # runs a free viewer may take, newest last
        self.watches: list[Watch] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 30) -> None:
        self.stopping = True
        self.thread.join(timeout)

    def _main(self) -> None:
        asyncio.run(self._all())

    async def _all(self) -> None:
        await asyncio.gather(*(self._viewer(i) for i in range(self.count)))

    async def _viewer(self, index: int) -> None:
        taken: set[int] = set()
        while not self.stopping:
            free = [r for r in self.candidates if r not in taken and r not in self.finished_runs]
            if not free:
                await asyncio.sleep(0.2)
                continue
            run_id = free[-1 - (index % len(free))] if len(free) > index else free[-1]
            taken.add(run_id)
            watch = Watch(run_id)
            self.watches.append(watch)
            await self._watch(watch)

    async def _watch(self, watch: Watch) -> None:
        from websockets.asyncio.client import connect

        while True:
            done = self.finished_runs.get(watch.run_id)
            last = watch.seqs[-1] if watch.seqs else 0
            if done is not None and last >= done:
                return
            if self.stopping and done is None:
                return
            url = f"ws://127.0.0.1:{self.port}/ws/live/runs/{watch.run_id}/?after={last}"
            if watch.seqs or watch.reconnects:
                url += "&reconnect=1"
            try:
                async with connect(
                    url,
                    additional_headers={"Cookie": f"sessionid={self.cookie}"},
                    origin=f"http://127.0.0.1:{self.port}",
                    open_timeout=5,
                    max_size=None,
                ) as ws:
                    while True:
                        try:
                            text = await asyncio.wait_for(ws.recv(), timeout=1.0)
                        except TimeoutError:
                            done = self.finished_runs.get(watch.run_id)
                            last = watch.seqs[-1] if watch.seqs else 0
                            if (done is not None and last >= done) or self.stopping:
                                break
                            continue
                        seen: list[int] = []
                        for s in SEQ_RE.findall(text if isinstance(text, str) else ""):
                            if int(s) not in seen:
                                seen.append(int(s))
                        watch.seqs.extend(seen)
            except Exception:
                watch.reconnects += 1
                await asyncio.sleep(0.3)
