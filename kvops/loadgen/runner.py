"""Releasing a group of requests on schedule and watching the client's own health.

Why measure the client: a load generator that falls behind reports its own slowness as server
latency. Every record carries its dispatch lag (scheduled release -> actual send) and the
in-flight count at send, and a monitor samples event-loop lag (how late a 5 ms timer fires);
`ClientStats.summary()` turns those into a plain "the client was / was not the bottleneck".
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from kvops.loadgen.client import CompletionRequest, Endpoint, send_request
from kvops.workload.generate import PlannedRequest
from kvops.workload.record import RequestRecord
from kvops.workload.replay import ReplaySession

LOOP_TICK_S = 0.005
# Thresholds past which client timing error could exceed ~1 ms (documented in the report).
LOOP_LAG_P99_LIMIT_MS = 20.0
LOOP_LAG_MEAN_LIMIT_MS = 1.0
DISPATCH_LAG_MEAN_LIMIT_MS = 10.0
# The share of the smallest TTFT measured past which the client's own delay to its timestamps
# is called out: 2% is 1 ms of a 50 ms TTFT, about the error vLLM's own bench client adds on
# an idle host, and small beside the relative differences an A/B verdict is read from.
CLIENT_ADDED_SHARE_LIMIT = 0.02


@dataclass
class WireRequest:
    """A planned request as the runner sends it: its place in the workload (iteration, batch)
    and the HTTP request built from it; `endpoint`, when set, is the instance it goes to (an
    arm of several instances: kvops.abtest.routing), else the runner's own. The body is the
    same for every instance of an arm (same model and API), so it is encoded once."""

    iteration: int
    batch: int
    request: CompletionRequest
    endpoint: Endpoint | None = None


def wire_requests(planned: Sequence[PlannedRequest], endpoint: Endpoint) -> list[WireRequest]:
    """Build and encode the wire requests of a plan before any clock starts, as vLLM's bench
    does: encoding a long prompt must count neither as serving time nor as client lag (the
    bodies travel encoded to worker processes too)."""
    out = []
    for p in planned:
        sample = p.request
        request = CompletionRequest(
            request_id=sample.request_id,
            prompt=sample.prompt,
            output_tokens=sample.output_tokens,
            prefix_id=sample.prefix_id,
            intended_prompt_tokens=sample.intended_prompt_tokens,
        )
        request.body(endpoint)
        out.append(WireRequest(p.iteration, p.batch, request))
    return out


@dataclass
class WireTurn:
    """A session's turn as sent: `delay_s` after the previous turn's answer, not before `at_s`
    after the replay's start (`kvops.workload.replay.ReplayTurn`)."""

    wire: WireRequest
    delay_s: float | None = None
    at_s: float | None = None


@dataclass
class WireSession:
    start_s: float
    turns: list[WireTurn]


def wire_sessions(sessions: Sequence[ReplaySession], endpoint: Endpoint) -> list[WireSession]:
    """`wire_requests` for a trace replay's sessions: every body encoded before the clock."""
    return [
        WireSession(
            s.start_s,
            [
                WireTurn(wire, t.delay_s, t.at_s)
                for t, wire in zip(
                    s.turns, wire_requests([t.planned for t in s.turns], endpoint), strict=True
                )
            ],
        )
        for s in sessions
    ]


@dataclass
class Labels:
    """Where a request sits in the experiment; copied into each record."""

    arm: str = ""
    scenario: str = ""
    trial: int = 0
    attempt: str = ""
    warmup: bool = False


@dataclass
class ClientStats:
    dispatch_lags_ms: list[float] = field(default_factory=list)
    loop_lags_ms: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    workers: int = 1

    def merge(self, other: ClientStats) -> None:
        self.dispatch_lags_ms += other.dispatch_lags_ms
        self.loop_lags_ms += other.loop_lags_ms
        self.max_in_flight = max(self.max_in_flight, other.max_in_flight)

    def summary(self) -> dict[str, object]:
        d = np.asarray(self.dispatch_lags_ms or [0.0])
        loop = np.asarray(self.loop_lags_ms or [0.0])
        out: dict[str, object] = {
            "dispatch_lag_mean_ms": float(d.mean()),
            "dispatch_lag_p99_ms": float(np.percentile(d, 99)),
            "dispatch_lag_max_ms": float(d.max()),
            "loop_lag_mean_ms": float(loop.mean()),
            "loop_lag_p99_ms": float(np.percentile(loop, 99)),
            "max_in_flight": self.max_in_flight,
            "workers": self.workers,
        }
        return judge_client(out)


def judge_client(
    summary: dict[str, object],
    mean_ttft_ms: float | None = None,
    mean_e2el_ms: float | None = None,
    smallest_ttft_ms: float | None = None,
) -> dict[str, object]:
    """Adds `bottleneck` and `bottleneck_reason`. The client is a bottleneck when its own delays
    are large in absolute terms AND against what is measured: event-loop lag shifts every
    timestamp (its mean is judged against 1% of mean TTFT, its p99 against 10%), dispatch lag
    delays load (judged against 5% of mean E2EL).

    It also says when the client added more than CLIENT_ADDED_SHARE_LIMIT of the smallest TTFT
    it measured (`smallest_ttft_ms`: the smallest mean TTFT of an arm). What the client adds
    to a TTFT is estimated by its event-loop lag mean: the send is stamped when the request is
    written (kvops.loadgen.client), so the client's steps before the write are dispatch lag,
    not TTFT; what remains is how late the loop gets to the first chunk once it has arrived,
    which is what a timer's lateness measures. The smallest TTFT is where a fixed client delay
    is the largest share, and so shrinks a relative difference the most."""
    reasons = []
    loop_p99 = float(summary["loop_lag_p99_ms"])  # type: ignore[arg-type]
    loop_mean = float(summary["loop_lag_mean_ms"])  # type: ignore[arg-type]
    dispatch = float(summary["dispatch_lag_mean_ms"])  # type: ignore[arg-type]
    ttft_share = loop_mean / mean_ttft_ms if mean_ttft_ms else None
    if loop_mean > LOOP_LAG_MEAN_LIMIT_MS and (ttft_share is None or ttft_share > 0.01):
        reasons.append(f"event-loop lag mean {loop_mean:.2f} ms (> {LOOP_LAG_MEAN_LIMIT_MS:g} ms)")
    p99_limit = max(LOOP_LAG_P99_LIMIT_MS, 0.1 * mean_ttft_ms if mean_ttft_ms else 0.0)
    if loop_p99 > p99_limit:
        reasons.append(f"event-loop lag p99 {loop_p99:.1f} ms (> {p99_limit:.0f} ms)")
    dispatch_share = dispatch / mean_e2el_ms if mean_e2el_ms else None
    if dispatch > DISPATCH_LAG_MEAN_LIMIT_MS and (dispatch_share is None or dispatch_share > 0.05):
        reasons.append(f"dispatch lag mean {dispatch:.1f} ms (> {DISPATCH_LAG_MEAN_LIMIT_MS:g} ms)")
    added = client_added_reason(loop_mean, smallest_ttft_ms)
    if added is not None:
        reasons.append(added)
    return {
        **summary,
        "ttft_error_share": ttft_share,
        "bottleneck": bool(reasons),
        "bottleneck_reason": "; ".join(reasons) or None,
    }


def client_added_reason(added_ms: float, smallest_ttft_ms: float | None) -> str | None:
    """The sentence saying the client added more than CLIENT_ADDED_SHARE_LIMIT of the smallest
    TTFT measured, with the measured share; None when it did not (or no TTFT was measured)."""
    if not smallest_ttft_ms or smallest_ttft_ms <= 0:
        return None
    share = added_ms / smallest_ttft_ms
    if share <= CLIENT_ADDED_SHARE_LIMIT:
        return None
    return (
        f"the client added about {added_ms:.2f} ms to each TTFT (event-loop lag mean), "
        f"{share:.1%} of the smallest TTFT measured ({smallest_ttft_ms:.1f} ms; "
        f"> {CLIENT_ADDED_SHARE_LIMIT:.0%})"
    )


class LoopLagMonitor:
    """Samples how late a short timer fires: a busy client loop delays chunk timestamps too."""

    def __init__(self, stats: ClientStats) -> None:
        self.stats = stats
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LOOP_TICK_S)
            self.stats.loop_lags_ms.append(max(0.0, (time.perf_counter() - t - LOOP_TICK_S) * 1e3))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _freeze_the_plan() -> bool:
    """Moves every object alive now (the plan: token-id prompts are lists of hundreds of ints
    each, thousands of them for a wide group) out of the cyclic garbage collector's reach while
    the group runs (`gc.freeze`, https://docs.python.org/3/library/gc.html#gc.freeze). Without
    it, each full collection walks all of them in the middle of the measurement: a pause of
    tens of ms at 256 streams on a small host, and every stream's next timestamp is that late.
    Reference counting still frees them; the group's end gives them back (`_thaw`). Returns
    whether it froze (not when a group already running in this process did)."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def _thaw(frozen: bool) -> None:
    if frozen:
        gc.unfreeze()


@dataclass
class Runner:
    """Sends planned requests to one endpoint and hands each record to `on_record` at once."""

    session: aiohttp.ClientSession
    endpoint: Endpoint
    on_record: Callable[[RequestRecord], None]
    timeout_s: float = 600.0
    stall_timeout_s: float | None = 60.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    grace_s: float = 5.0
    stats: ClientStats = field(default_factory=ClientStats)
    in_flight: int = 0

    def _record(self, p: WireRequest, labels: Labels, scheduled: float) -> RequestRecord:
        return RequestRecord(
            request_id=f"{labels.attempt}{labels.scenario}/{labels.arm}/{p.request.request_id}",
            arm=labels.arm,
            scenario=labels.scenario,
            trial=labels.trial,
            iteration=p.iteration,
            batch=p.batch,
            attempt=labels.attempt,
            warmup=labels.warmup,
            scheduled_perf_s=scheduled,
        )

    async def _one(self, p: WireRequest, rec: RequestRecord) -> RequestRecord:
        self.in_flight += 1
        rec.in_flight_at_send = self.in_flight
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.in_flight)
        try:
            await send_request(
                self.session,
                self.endpoint if p.endpoint is None else p.endpoint,
                p.request,
                timeout_s=self.timeout_s,
                stall_timeout_s=self.stall_timeout_s,
                record=rec,
            )
        finally:
            self.in_flight -= 1
            if rec.dispatch_lag_ms is not None:
                self.stats.dispatch_lags_ms.append(rec.dispatch_lag_ms)
            self.on_record(rec)
        return rec

    async def run_group(
        self,
        planned: Sequence[WireRequest],
        labels: Labels,
        offsets_s: Sequence[float] | None = None,
        max_concurrency: int | None = None,
        start_at: float | None = None,
    ) -> list[RequestRecord]:
        """Release `planned` together (or at `offsets_s` after the start) and wait for all.

        The start is now, or `start_at` (a perf_counter instant: worker processes share one
        release moment). When `stop` is set, nothing more is released; streams in flight get
        `grace_s` to finish, then are cancelled and recorded as such."""
        if self.stop.is_set():
            return []
        for p in planned:
            p.request.body(self.endpoint)  # encode before the clock starts
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        start = time.perf_counter() if start_at is None else start_at
        records: list[RequestRecord] = []
        frozen = _freeze_the_plan()

        async def release(i: int, p: WireRequest) -> None:
            due = start + (offsets_s[i] if offsets_s else 0.0)
            if not await self._wait_until(due):
                return  # stopped before this request was due
            if sem is not None:
                async with sem:
                    if self.stop.is_set():
                        return
                    # waiting for a free slot is the workload's own cap (vLLM's client queue
                    # time), not client lag: dispatch lag counts from the slot's release
                    acquired = time.perf_counter()
                    rec = self._record(p, labels, acquired)
                    rec.client_queue_ms = max(0.0, (acquired - due) * 1e3)
                    records.append(rec)
                    await self._one(p, rec)
                return
            rec = self._record(p, labels, due)
            records.append(rec)
            await self._one(p, rec)

        tasks = [asyncio.create_task(release(i, p)) for i, p in enumerate(planned)]
        try:
            await self._finish(tasks)
        finally:
            _thaw(frozen)
        return records

    async def run_sessions(
        self, sessions: Sequence[WireSession], labels: Labels, start_at: float | None = None
    ) -> list[RequestRecord]:
        """Replay conversations in closed loop: a session's first turn is released at its
        start after the replay's, each later turn its `delay_s` after the previous turn's
        answer completed (and not before its `at_s`), as AIPerf paces a trace's sessions
        (https://github.com/ai-dynamo/aiperf/blob/main/docs/benchmark-modes/trace-replay.md);
        sessions run side by side. A failed turn does not end its session (the next prompt
        does not depend on the answer). Dispatch lag counts from the moment a turn was due;
        `stop` and the grace period act as in `run_group`."""
        if self.stop.is_set():
            return []
        for session in sessions:
            for turn in session.turns:
                turn.wire.request.body(self.endpoint)  # encode before the clock starts
        start = time.perf_counter() if start_at is None else start_at
        records: list[RequestRecord] = []
        frozen = _freeze_the_plan()

        async def converse(session: WireSession) -> None:
            done: float | None = None
            for turn in session.turns:
                due = start + session.start_s if done is None else done + (turn.delay_s or 0.0)
                if turn.at_s is not None:
                    due = max(due, start + turn.at_s)
                if not await self._wait_until(due):
                    return
                rec = self._record(turn.wire, labels, due)
                records.append(rec)
                await self._one(turn.wire, rec)
                done = rec.end_perf_s or time.perf_counter()  # the answer's last byte

        try:
            await self._finish([asyncio.create_task(converse(s)) for s in sessions])
        finally:
            _thaw(frozen)
        return records

    async def _wait_until(self, due: float) -> bool:
        """Sleep until `due` (a perf_counter instant); False when `stop` came first."""
        delay = due - time.perf_counter()
        if delay > 0:
            try:
                await asyncio.wait_for(self.stop.wait(), delay)
                return False
            except TimeoutError:
                pass
        return not self.stop.is_set()

    async def _finish(self, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for every task; once `stop` is set, give streams in flight `grace_s`, then
        cancel them (each is recorded as cancelled)."""
        all_done = asyncio.gather(*tasks, return_exceptions=True)
        stop_wait = asyncio.create_task(self.stop.wait())
        waiters: list[asyncio.Future[Any]] = [all_done, stop_wait]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not all_done.done():
            await asyncio.wait([all_done], timeout=self.grace_s)
            for t in tasks:
                t.cancel()
            await asyncio.gather(all_done, return_exceptions=True)
        stop_wait.cancel()
