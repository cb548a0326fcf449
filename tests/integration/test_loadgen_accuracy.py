"""The load generator's timing against a server whose timing is known (the fixed-delay double:
first chunk 50 ms after the request, then one every 10 ms)."""

from __future__ import annotations

import asyncio
import statistics

import pytest
from doubles.fixed_delay_server import running

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session
from kvops.loadgen.runner import ClientStats, Labels, Runner
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
        await runner.run_group(planned, Labels(), offsets, max_concurrency=streams)
    return records, stats


def test_64_streams_ttft_and_itl_accurate() -> None:
    with running() as (url, _):
        records, stats = asyncio.run(_closed_loop(url, 64, 256, 8))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert stats.max_in_flight == 64
    ttft = statistics.mean(r.ttft_ms for r in records if r.ttft_ms is not None)
    itl = statistics.mean(g for r in records for g in r.itls_ms)
    assert abs(ttft - 50.0) < 2.0, f"mean TTFT {ttft:.2f} ms"
    assert abs(itl - 10.0) < 0.5, f"mean ITL {itl:.2f} ms"
    assert all(r.output_tokens == 8 and r.prompt_tokens == 3 for r in records)


@pytest.mark.timeout(120)
def test_512_streams_accurate_or_says_client_bottleneck() -> None:
    with running() as (url, _):
        records, stats = asyncio.run(_closed_loop(url, 512, 1024, 8))
    ok = [r for r in records if r.ok]
    ttft = statistics.mean(r.ttft_ms for r in ok if r.ttft_ms is not None)
    summary = stats.summary()
    from kvops.loadgen.runner import judge_client

    judged = judge_client(summary, ttft, None)
    assert abs(ttft - 50.0) < 2.0 or judged["bottleneck"], (ttft, judged)
