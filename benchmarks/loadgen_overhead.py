"""Load-generator overhead: how exactly kvops times streams it did not slow down itself.

Against the fixed-delay double (first chunk 50 ms after the request, then one every 10 ms;
several server processes share the port so the server is not the limit), at 64, 256 and 1024
concurrent streams, with one and with several worker processes, it prints:
  - TTFT error = measured mean TTFT - 50 ms, ITL error = measured mean ITL - 10 ms,
  - chunks/s ingested, event-loop lag, and whether kvops calls the client the bottleneck,
  - firehose: the most chunks per second the client ingests when the server sends without pause.
Ratios are printed against the reference measured in the same run (64 streams, 1 process), as
the machine's speed and load change every absolute figure. Target: TTFT error under 1 ms at
256 streams with worker processes on.

  python benchmarks/loadgen_overhead.py [--quick] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from doubles.fixed_delay_server import running

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session
from kvops.loadgen.runner import ClientStats, Labels, LoopLagMonitor, Runner, judge_client
from kvops.loadgen.workers import WorkerPool
from kvops.workload.generate import PlannedRequest

OUTPUT_TOKENS = 16


def _planned(n: int, prefix: str) -> list[PlannedRequest]:
    return [
        PlannedRequest(0, 0, i, CompletionRequest(f"{prefix}{i}", [1, 2, 3], OUTPUT_TOKENS))
        for i in range(n)
    ]


async def _measure(
    url: str, streams: int, workers: int, requests: int
) -> tuple[list[RequestRecord], ClientStats, float]:
    records: list[RequestRecord] = []
    stats = ClientStats()
    endpoint = Endpoint(url, "fixed-delay")
    offsets = [i * 0.0005 for i in range(requests)]
    if workers == 1:
        async with make_session() as session:
            runner = Runner(session, endpoint, records.append, stats=stats)
            await runner.run_group(_planned(streams, "w"), Labels(warmup=True), None, streams)
            records.clear()
            monitor = LoopLagMonitor(stats)
            monitor.start()
            t0 = time.perf_counter()
            await runner.run_group(_planned(requests, "r"), Labels(), offsets, streams)
            wall = time.perf_counter() - t0
            await monitor.stop()
    else:
        pool = WorkerPool(workers, endpoint)
        try:
            await pool.start()
            await pool.run_group(
                _planned(streams, "w"), Labels(warmup=True), lambda r: None, None, streams
            )
            t0 = time.perf_counter()
            await pool.run_group(
                _planned(requests, "r"), Labels(), records.append, offsets, streams, stats
            )
            wall = time.perf_counter() - t0
        finally:
            pool.close()
    return records, stats, wall


def _row(
    label: str, records: list[RequestRecord], stats: ClientStats, wall: float, gap_ms: float
) -> dict[str, float]:
    ok = [r for r in records if r.ok]
    ttft = statistics.mean(r.ttft_ms for r in ok if r.ttft_ms is not None)
    gaps = [g for r in ok for g in r.itls_ms]
    itl = statistics.mean(gaps) if gaps else float("nan")
    chunks = sum(len(r.chunk_offsets_ms) for r in ok)
    judged = judge_client(stats.summary(), ttft, None)
    print(
        f"{label:<28} ok {len(ok):>5}/{len(records):<5} TTFT err {ttft - 50:+7.2f} ms  "
        f"ITL err {itl - gap_ms:+6.2f} ms  {chunks / wall:>9,.0f} chunks/s  loop lag mean "
        f"{judged['loop_lag_mean_ms']:.2f} ms  "
        f"bottleneck: {'YES' if judged['bottleneck'] else 'no'}",
        flush=True,
    )
    return {"ttft_err_ms": ttft - 50, "chunks_s": chunks / wall}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="64 and 256 streams only")
    ap.add_argument("--workers", type=int, default=max(2, min(4, os.cpu_count() or 2)))
    ap.add_argument("--server-processes", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = ap.parse_args()
    levels = (64, 256) if args.quick else (64, 256, 1024)
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"server processes {args.server_processes}; output {OUTPUT_TOKENS} tokens/request"
    )
    results: dict[tuple[int, int], dict[str, float]] = {}
    with running(processes=args.server_processes) as (url, _):
        for streams in levels:
            for workers in (1, args.workers):
                recs, stats, wall = asyncio.run(_measure(url, streams, workers, streams * 3))
                results[(streams, workers)] = _row(
                    f"{streams} streams, {workers} proc", recs, stats, wall, 10.0
                )
    with running("--gap-ms", "0", "--first-ms", "0", processes=args.server_processes) as (url, _):
        for workers in (1, args.workers):
            recs, stats, wall = asyncio.run(_measure(url, 64, workers, 256))
            results[(0, workers)] = _row(
                f"firehose 64 streams, {workers} proc", recs, stats, wall, 0.0
            )
    ref = results[(64, 1)]
    print("\nratios to the reference (64 streams, 1 process) measured in this run:")
    for (streams, workers), r in results.items():
        name = "firehose" if streams == 0 else f"{streams} streams"
        err_ratio = abs(r["ttft_err_ms"]) / max(abs(ref["ttft_err_ms"]), 1e-3)
        rate_ratio = r["chunks_s"] / ref["chunks_s"]
        print(f"  {name:>12}, {workers} proc: |TTFT err| x{err_ratio:5.1f}, ", end="")
        print(f"chunks/s x{rate_ratio:5.2f}")
    target = results.get((256, args.workers))
    if target is not None:
        verdict = "met" if abs(target["ttft_err_ms"]) < 1.0 else "NOT met on this machine"
        print(f"target TTFT error < 1 ms at 256 streams with {args.workers} processes: {verdict}")


if __name__ == "__main__":
    main()
