"""The load generator's timing against a server whose timing is known (the fixed-delay double:
first chunk 50 ms after the request, then one every 10 ms).

kvops must be accurate, or say plainly that the client was the bottleneck; it must never be
silently wrong. When the host is overloaded by other work and kvops flags its own lag, the
64-stream accuracy check is skipped with the measured figures (it cannot be judged there)."""

from __future__ import annotations

import asyncio
import os
import statistics

import pytest
from doubles.fixed_delay_server import running

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session
from kvops.loadgen.runner import ClientStats, Labels, LoopLagMonitor, Runner, judge_client
from kvops.workload.generate import PlannedRequest


async def _closed_loop(
    url: str, streams: int, requests: int, output_tokens: int
) -> tuple[list[RequestRecord], ClientStats]:
    """`requests` requests, at most `streams` in flight: a steady `streams`-way concurrency."""
    records: list[RequestRecord] = []
    stats = ClientStats()
    async with make_session() as session:
        runner = Runner(session, Endpoint(url, "fixed-delay"), records.append, stats=stats)
        warm = [
            PlannedRequest(0, 0, i, CompletionRequest(f"w{i}", [1, 2, 3], 2))
            for i in range(streams)
        ]
        await runner.run_group(warm, Labels(warmup=True))  # open the connections first
        records.clear()
        planned = [
            PlannedRequest(0, 0, i, CompletionRequest(f"r{i}", [1, 2, 3], output_tokens))
            for i in range(requests)
        ]
        offsets = [i * 0.002 for i in range(requests)]  # ramp in; then the cap holds `streams`
        monitor = LoopLagMonitor(stats)
        monitor.start()
        await runner.run_group(planned, Labels(), offsets, max_concurrency=streams)
        await monitor.stop()
    return records, stats


def _measure_64_streams() -> tuple[float, float, dict[str, object]]:
    with running(processes=2) as (url, _):  # two server processes: the double is not the limit
        records, stats = asyncio.run(_closed_loop(url, 64, 256, 8))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert stats.max_in_flight == 64
    assert all(r.output_tokens == 8 and r.prompt_tokens == 3 for r in records)
    ttft = statistics.mean(r.ttft_ms for r in records if r.ttft_ms is not None)
    itl = statistics.mean(g for r in records for g in r.itls_ms)
    return ttft, itl, judge_client(stats.summary(), ttft, None)


def test_64_streams_ttft_and_itl_accurate() -> None:
    """Up to three measurements: a systematic timing error fails all three, while a burst of
    CPU contention from the tests before this one (the load average trails by a minute) does
    not decide the verdict on its own."""
    for _attempt in range(3):
        ttft, itl, judged = _measure_64_streams()
        if abs(ttft - 50.0) < 2.0 and abs(itl - 10.0) < 0.5:
            return
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if judged["bottleneck"] and load > cpus:
        pytest.skip(
            f"host overloaded (load {load:.1f} on {cpus} CPUs): TTFT {ttft:.1f} ms, ITL "
            f"{itl:.2f} ms, flagged by kvops: {judged['bottleneck_reason']}"
        )
    assert abs(ttft - 50.0) < 2.0, f"mean TTFT {ttft:.2f} ms ({judged})"
    assert abs(itl - 10.0) < 0.5, f"mean ITL {itl:.2f} ms"


@pytest.mark.timeout(120)
def test_512_streams_accurate_or_says_client_bottleneck() -> None:
    with running(processes=2) as (url, _):
        records, stats = asyncio.run(_closed_loop(url, 512, 1024, 8))
    ok = [r for r in records if r.ok]
    ttft = statistics.mean(r.ttft_ms for r in ok if r.ttft_ms is not None)
    judged = judge_client(stats.summary(), ttft, None)
    assert abs(ttft - 50.0) < 2.0 or judged["bottleneck"], (ttft, judged)
