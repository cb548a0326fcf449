"""The load generator's timing against a server whose timing is known (the fixed-delay double:
first chunk 50 ms after the request, then one every 10 ms).

kvops must be accurate, or say plainly that the client was the bottleneck; it must never be
silently wrong. "Accurate" is judged against what the double really did, not against its
nominal 50/10 ms: the double logs the CLOCK_MONOTONIC instant it wrote each chunk (the clock
behind `time.perf_counter`, shared by every process on the host), so a double whose sleeps
fire late on a busy 2-core host moves the truth, and only the client's own error is judged.
The double's nominal figures are still checked loosely, so a test cannot pass against a
server that did not keep its timing at all."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ci_rule import too_busy
from doubles.fixed_delay_server import read_timing_log, running
from measuring import ahead_of_the_lab_groups

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session
from kvops.loadgen.runner import (
    ClientStats,
    Labels,
    LoopLagMonitor,
    Runner,
    WireRequest,
    judge_client,
)

PROMPT_ID_BASE = 1000  # measured prompts are [1, 2, 1000 + i]: each one names its request


async def _block_the_loop(block_s: float, every_s: float) -> None:
    """A client whose own work holds its event loop (`time.sleep` is CPU it does not yield)."""
    while True:
        time.sleep(block_s)
        await asyncio.sleep(every_s)


async def _closed_loop(
    url: str, streams: int, requests: int, output_tokens: int, busy_client: bool = False
) -> tuple[list[RequestRecord], ClientStats]:
    """`requests` requests, at most `streams` in flight: a steady `streams`-way concurrency.
    With `busy_client` the client's loop is blocked 30 ms in every ~35 ms while it measures."""
    records: list[RequestRecord] = []
    stats = ClientStats()
    async with make_session() as session:
        runner = Runner(session, Endpoint(url, "fixed-delay"), records.append, stats=stats)
        warm = [WireRequest(0, 0, CompletionRequest(f"w{i}", [1, 2, 3], 2)) for i in range(streams)]
        await runner.run_group(warm, Labels(warmup=True))  # open the connections first
        records.clear()
        planned = [
            WireRequest(0, 0, CompletionRequest(f"r{i}", [1, 2, PROMPT_ID_BASE + i], output_tokens))
            for i in range(requests)
        ]
        offsets = [i * 0.002 for i in range(requests)]  # ramp in; then the cap holds `streams`
        monitor = LoopLagMonitor(stats)
        monitor.start()
        blocker = asyncio.create_task(_block_the_loop(0.030, 0.005)) if busy_client else None
        await runner.run_group(planned, Labels(), offsets, max_concurrency=streams)
        if blocker is not None:
            blocker.cancel()
            await asyncio.gather(blocker, return_exceptions=True)
        await monitor.stop()
    return records, stats


@dataclass
class Timing:
    """Means over every measured request: what kvops reported, and what the double did."""

    ttft_ms: float
    true_ttft_ms: float
    itl_ms: float
    true_itl_ms: float

    @property
    def ttft_error_ms(self) -> float:
        return self.ttft_ms - self.true_ttft_ms

    @property
    def itl_error_ms(self) -> float:
        return self.itl_ms - self.true_itl_ms


def _timing(records: list[RequestRecord], log_dir: Path) -> Timing:
    """Pairs each record with the double's log line for its prompt."""
    keys = [int(r.request_id.rpartition("r")[2]) + PROMPT_ID_BASE for r in records]
    written = read_timing_log(log_dir, set(keys))
    ttfts, true_ttfts, itls, true_itls = [], [], [], []
    for i, (r, key) in enumerate(zip(records, keys, strict=True)):
        chunks_s = written[key]
        assert r.ttft_ms is not None and len(chunks_s) == len(r.chunk_offsets_ms), (i, r)
        ttfts.append(r.ttft_ms)
        true_ttfts.append((chunks_s[0] - r.send_perf_s) * 1e3)
        itls.extend(r.itls_ms)
        true_itls.extend((b - a) * 1e3 for a, b in itertools.pairwise(chunks_s))
    return Timing(
        statistics.mean(ttfts),
        statistics.mean(true_ttfts),
        statistics.mean(itls),
        statistics.mean(true_itls),
    )


def _measure(
    streams: int, requests: int, log_dir: Path, busy_client: bool = False
) -> tuple[Timing, dict[str, object]]:
    log_dir.mkdir()
    # two server processes: the double is not the limit
    with (
        ahead_of_the_lab_groups(),
        running("--timing-log", str(log_dir), processes=2) as (url, _),
    ):
        records, stats = asyncio.run(_closed_loop(url, streams, requests, 8, busy_client))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert stats.max_in_flight == streams
    assert all(r.output_tokens == 8 and r.prompt_tokens == 3 for r in records)
    timing = _timing(records, log_dir)
    return timing, judge_client(stats.summary(), timing.ttft_ms, None)


# a measurement the client flagged as its own bottleneck: how many are retried, after what pause
FLAGGED_TRIES = 6
FLAGGED_PAUSE_S = 5.0


def _accurate(timing: Timing) -> bool:
    return abs(timing.ttft_error_ms) < 2.0 and abs(timing.itl_error_ms) < 0.5


@pytest.mark.timing
def test_64_streams_ttft_and_itl_accurate(tmp_path: Path) -> None:
    """Accuracy is judged only on measurements kvops did not flag (a flagged one says itself
    that its timing is not to be trusted). Up to three judged measurements: a systematic timing
    error fails every unflagged one, while a burst of CPU contention from the tests before this
    one (the load average trails by a minute) does not decide the verdict on its own. A flagged
    measurement is retried after a pause, up to FLAGGED_TRIES of them (the lab groups of `make
    test` load this machine in bursts); if the client was the bottleneck every time, the machine
    is too busy to judge: skip, or in CI fail and rerun once (tests/conftest.py)."""
    judged_runs: list[tuple[Timing, dict[str, object]]] = []
    flagged = 0
    while len(judged_runs) < 3 and flagged < FLAGGED_TRIES:
        timing, judged = _measure(64, 256, tmp_path / f"try{len(judged_runs) + flagged}")
        if judged["bottleneck"]:
            flagged += 1
            time.sleep(FLAGGED_PAUSE_S)
            continue
        judged_runs.append((timing, judged))
        if _accurate(timing):
            break
    if not judged_runs:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
        too_busy(
            f"the client was the bottleneck in all {flagged} runs (load {load:.1f} on {cpus} "
            f"CPUs): {judged['bottleneck_reason']}"
        )
    timing, judged = judged_runs[-1]
    assert abs(timing.ttft_error_ms) < 2.0, f"unflagged yet wrong: {timing} ({judged})"
    assert abs(timing.itl_error_ms) < 0.5, f"unflagged yet wrong: {timing} ({judged})"
    # the double kept roughly to its nominal timing: the comparison above was a real one
    assert abs(timing.true_ttft_ms - 50.0) < 10.0 and abs(timing.true_itl_ms - 10.0) < 2.0, timing


@pytest.mark.timeout(120)
def test_512_streams_accurate_unless_flagged(tmp_path: Path) -> None:
    """At 512 streams on a small host the client may really be the limit: then it must say so
    (the flag itself is tested below); when it does not, its timing must be right."""
    timing, judged = _measure(512, 1024, tmp_path / "log")
    if not judged["bottleneck"]:
        assert _accurate(timing), f"unflagged yet wrong: {timing} ({judged})"
    else:
        assert "lag" in str(judged["bottleneck_reason"]), judged


def test_a_busy_client_flags_itself_and_its_error_is_real(tmp_path: Path) -> None:
    """The flag is raised when the client's own work delays its timestamps, and the error it
    warns about is there: TTFT measured late against the instants the double wrote."""
    timing, judged = _measure(16, 64, tmp_path / "log", busy_client=True)
    assert judged["bottleneck"] is True, (timing, judged)
    assert "event-loop lag" in str(judged["bottleneck_reason"]), judged
    assert float(judged["loop_lag_p99_ms"]) >= 20.0, judged  # type: ignore[arg-type]
    assert timing.ttft_error_ms > 2.0, timing  # the flag warned of a real error
