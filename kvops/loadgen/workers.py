"""Spreading one release group over worker processes when one core cannot keep up.

Why processes: a single asyncio loop ingesting thousands of chunks per second delays its own
timestamps (visible as event-loop lag). Each worker runs its own loop and HTTP session; the
parent splits a group round-robin, names one release instant (perf_counter is CLOCK_MONOTONIC,
shared by all processes on Linux), and relays each record to `on_record` the moment a worker
reports it, so the JSONL file is still written as requests complete. Workers are started with
`spawn` (no inherited event loop or sockets) and stopped at `close()`.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from kvops.loadgen.client import Endpoint, make_session
from kvops.loadgen.runner import ClientStats, Labels, LoopLagMonitor, Runner, WireRequest
from kvops.workload.record import RequestRecord

RELEASE_LEAD_S = 0.05  # time for every worker to receive its share before the release


def _worker_main(
    jobs: mp.Queue[Any], results: mp.Queue[Any], stop: MpEvent, endpoint: Endpoint,
    timeout_s: float, stall_timeout_s: float | None, grace_s: float,
) -> None:  # fmt: skip
    asyncio.run(_worker_loop(jobs, results, stop, endpoint, timeout_s, stall_timeout_s, grace_s))


async def _worker_loop(
    jobs: mp.Queue[Any], results: mp.Queue[Any], stop: MpEvent, endpoint: Endpoint,
    timeout_s: float, stall_timeout_s: float | None, grace_s: float,
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    async with make_session() as session:
        results.put(("ready",))
        while True:
            job = await loop.run_in_executor(None, jobs.get)
            if job is None:
                return
            job_id, planned, labels, offsets, cap, start_at = job
            stats = ClientStats()
            runner = Runner(
                session, endpoint, lambda r: results.put(("rec", asdict(r))),
                timeout_s=timeout_s, stall_timeout_s=stall_timeout_s, grace_s=grace_s,
                stats=stats,
            )  # fmt: skip

            async def watch_stop(runner: Runner = runner) -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                runner.stop.set()

            watcher = asyncio.create_task(watch_stop())
            monitor = LoopLagMonitor(stats)
            monitor.start()
            try:
                await runner.run_group(planned, labels, offsets, cap, start_at=start_at)
            finally:
                await monitor.stop()
                watcher.cancel()
            results.put(("done", job_id, asdict(stats)))


class WorkerPool:
    """`n` worker processes sending to one endpoint."""

    def __init__(
        self,
        n: int,
        endpoint: Endpoint,
        *,
        timeout_s: float = 600.0,
        stall_timeout_s: float | None = 60.0,
        grace_s: float = 5.0,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.stop_event = ctx.Event()
        self._results: mp.Queue[Any] = ctx.Queue()
        self._jobs: list[mp.Queue[Any]] = [ctx.Queue() for _ in range(n)]
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(
                    q,
                    self._results,
                    self.stop_event,
                    endpoint,
                    timeout_s,
                    stall_timeout_s,
                    grace_s,
                ),
                daemon=True,
            )
            for q in self._jobs
        ]
        for p in self._procs:
            p.start()
        self._job = 0

    async def start(self, timeout_s: float = 120.0) -> None:
        """Wait until every worker has imported kvops and opened its session, so the first
        release is not late by a process start-up."""
        loop = asyncio.get_running_loop()
        ready = 0
        deadline = time.monotonic() + timeout_s
        while ready < self.n:
            msg = await loop.run_in_executor(None, self._get)
            if msg is not None and msg[0] == "ready":
                ready += 1
            elif time.monotonic() > deadline or not all(p.is_alive() for p in self._procs):
                raise RuntimeError("load-generator worker processes did not start")

    async def run_group(
        self,
        planned: Sequence[WireRequest],
        labels: Labels,
        on_record: Callable[[RequestRecord], None],
        offsets_s: Sequence[float] | None = None,
        max_concurrency: int | None = None,
        stats: ClientStats | None = None,
    ) -> list[RequestRecord]:
        """Like `Runner.run_group`, across the workers; a concurrency cap is split evenly."""
        self._job += 1
        start_at = time.perf_counter() + RELEASE_LEAD_S
        busy = 0
        for w, q in enumerate(self._jobs):
            share = list(planned[w :: self.n])
            if not share:
                continue
            offs = list(offsets_s[w :: self.n]) if offsets_s else None
            cap = max(1, max_concurrency // self.n) if max_concurrency else None
            q.put((self._job, share, labels, offs, cap, start_at))
            busy += 1
        loop = asyncio.get_running_loop()
        records: list[RequestRecord] = []
        in_flight_peaks: list[int] = []
        while busy:
            msg = await loop.run_in_executor(None, self._get)
            if msg is None:
                if not any(p.is_alive() for p in self._procs):
                    raise RuntimeError("all load-generator worker processes exited")
                continue
            if msg[0] == "rec":
                rec = RequestRecord.from_dict(msg[1])
                records.append(rec)
                on_record(rec)
            elif msg[0] == "done":
                busy -= 1
                worker_stats = ClientStats(**msg[2])
                in_flight_peaks.append(worker_stats.max_in_flight)
                if stats is not None:
                    stats.merge(worker_stats)
        if stats is not None:
            stats.workers = self.n
            # workers peak independently; their sum bounds the total in flight
            stats.max_in_flight = max(stats.max_in_flight, sum(in_flight_peaks))
        return records

    def _get(self) -> Any:
        try:
            return self._results.get(timeout=0.5)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.stop_event.set()
        for q in self._jobs:
            q.put(None)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()
