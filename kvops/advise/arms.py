"""One arm of the experiment, replayed through the simulator's model in virtual time.

Requests are fed to the engine as virtual time reaches them (the way `kvops sim serve` feeds
arrivals), and each finished request is folded into running sums at once, so memory stays
bounded by the requests in flight, not by the trace. Metrics follow `vllm bench serve`'s
definitions (vllm/benchmarks/serve.py): TTFT from arrival to the first token, ITL the gaps
between successive tokens, total token throughput = (prompt + output tokens) / duration, the
duration running from the first arrival to the last completion.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from kvops.advise.workload import PromptBuilder, TraceRequest, Workload
from kvops.sim.model import Engine, EngineSettings, build_engine
from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile
from kvops.sim.records import Request, SimRequestRecord

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Profiles:
    model: ModelProfile
    gpu: GpuProfile
    storage: StorageProfile


@dataclass
class ArmResult:
    """What one arm did over the whole workload (virtual seconds, tokens)."""

    name: str
    num_gpu_blocks: int = 0
    completed: int = 0
    rejected: list[str] = field(default_factory=list)
    first_arrival_s: float = 0.0
    last_finish_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    gpu_hit_tokens: int = 0
    offload_hit_tokens: int = 0
    preemptions: int = 0
    itl_sum_s: float = 0.0
    e2e_sum_s: float = 0.0
    itl_count: int = 0
    ttft_s: list[float] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)  # of the requests in `ttft_s`
    # Spans of earlier, separately replayed windows (see `merge`), added to the current one.
    earlier_spans_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.earlier_spans_s + max(0.0, self.last_finish_s - self.first_arrival_s)

    @property
    def total_token_throughput_tok_s(self) -> float:
        d = self.duration_s
        return (self.prompt_tokens + self.output_tokens) / d if d > 0 else 0.0

    @property
    def mean_ttft_ms(self) -> float:
        return 1e3 * float(np.mean(self.ttft_s)) if self.ttft_s else 0.0

    def ttft_percentile_ms(self, q: float) -> float:
        return 1e3 * float(np.percentile(self.ttft_s, q)) if self.ttft_s else 0.0

    @property
    def mean_itl_ms(self) -> float:
        return 1e3 * self.itl_sum_s / self.itl_count if self.itl_count else 0.0

    @property
    def gpu_hit_rate(self) -> float:
        return self.gpu_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def total_hit_rate(self) -> float:
        """Prompt tokens served from any cache (GPU prefix cache plus offload tier)."""
        hits = self.gpu_hit_tokens + self.offload_hit_tokens
        return hits / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, rec: SimRequestRecord) -> None:
        self.completed += 1
        self.prompt_tokens += rec.prompt_tokens
        self.output_tokens += len(rec.token_times_s)
        self.gpu_hit_tokens += rec.gpu_hit_tokens
        self.offload_hit_tokens += rec.offload_hit_tokens
        self.preemptions += rec.num_preemptions
        times = rec.token_times_s
        if rec.first_token_s is not None:
            self.ttft_s.append(rec.first_token_s - rec.arrival_s)
            self.arrivals_s.append(rec.arrival_s)
        if len(times) > 1:
            self.itl_sum_s += times[-1] - times[0]
            self.itl_count += len(times) - 1
        if rec.finish_s is not None:
            self.e2e_sum_s += rec.finish_s - rec.arrival_s
            self.last_finish_s = max(self.last_finish_s, rec.finish_s)

    @property
    def mean_e2e_s(self) -> float:
        return self.e2e_sum_s / self.completed if self.completed else 0.0

    @property
    def mean_concurrency(self) -> float:
        """Requests in flight on average (Little's law: total time in system / duration)."""
        d = self.duration_s
        return self.e2e_sum_s / d if d > 0 else 0.0

    def summary(self) -> dict[str, float | int]:
        return {
            "completed": self.completed,
            "rejected": len(self.rejected),
            "num_gpu_blocks": self.num_gpu_blocks,
            "duration_s": self.duration_s,
            "total_token_throughput_tok_s": self.total_token_throughput_tok_s,
            "mean_ttft_ms": self.mean_ttft_ms,
            "p50_ttft_ms": self.ttft_percentile_ms(50),
            "p99_ttft_ms": self.ttft_percentile_ms(99),
            "mean_itl_ms": self.mean_itl_ms,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "gpu_hit_tokens": self.gpu_hit_tokens,
            "offload_hit_tokens": self.offload_hit_tokens,
            "gpu_hit_rate": self.gpu_hit_rate,
            "total_hit_rate": self.total_hit_rate,
            "preemptions": self.preemptions,
        }


def window_span_s(part: ArmResult) -> float:
    """What one window adds to the duration of the whole trace it was cut from: its arrivals'
    span (tiled: one mean gap added) plus how much longer its last arrivals waited for a first
    token than its first ones (a growing queue, when the engine falls behind; negative when it
    drains). A window's own last finish would add a tail the whole trace has only once."""
    c = len(part.arrivals_s)
    if c < 2:
        return 0.0
    order = np.argsort(part.arrivals_s, kind="stable")
    arrivals = np.asarray(part.arrivals_s)[order]
    ttft = np.asarray(part.ttft_s)[order]
    q = max(1, c // 10)
    growth_s = float(np.mean(ttft[-q:]) - np.mean(ttft[:q]))
    return float(arrivals[-1] - arrivals[0]) * c / (c - 1) + growth_s


def merge(name: str, parts: list[ArmResult], tail_share: float = 1.0) -> ArmResult:
    """Windows replayed apart, as one result: sums of tokens and times. The duration is the
    sum of the windows' spans (`window_span_s`) plus `tail_share` of one tail (the mean time in
    system; the windows' share of the whole trace, whose last finish trails its last arrival
    once)."""
    out = ArmResult(name, num_gpu_blocks=parts[0].num_gpu_blocks if parts else 0)
    for p in parts:
        out.completed += p.completed
        out.rejected += p.rejected
        out.prompt_tokens += p.prompt_tokens
        out.output_tokens += p.output_tokens
        out.gpu_hit_tokens += p.gpu_hit_tokens
        out.offload_hit_tokens += p.offload_hit_tokens
        out.preemptions += p.preemptions
        out.itl_sum_s += p.itl_sum_s
        out.e2e_sum_s += p.e2e_sum_s
        out.itl_count += p.itl_count
        out.ttft_s += p.ttft_s
        out.arrivals_s += p.arrivals_s
        out.earlier_spans_s += window_span_s(p)
    out.earlier_spans_s += tail_share * out.mean_e2e_s
    return out


def run_arm(
    name: str,
    workload: Workload,
    builder: PromptBuilder,
    profiles: Profiles,
    settings: EngineSettings,
    progress: Progress | None = None,
    warmup: int = 0,
    preload_chunks: list[int] | None = None,
) -> ArmResult:
    """Replay every group of the workload through one engine; EngineError if the engine cannot
    be built (e.g. no KV memory left).

    A session's later turns (`workload.followups`) join in closed loop: each arrives its delay
    after the previous turn finished (and not before its own trace time, when it has one).

    For a window cut out of a longer trace: the first `warmup` requests are replayed but not
    counted (they bring the GPU prefix cache and the queue to the state the window starts in),
    and `preload_chunks` are on the offload tier's persistent level from the start (what
    requests before the warm-up stored; GDS never evicts)."""
    engine = build_engine(profiles.model, profiles.gpu, profiles.storage, settings)
    if preload_chunks and engine.offload is not None:
        engine.offload.preload(preload_chunks)
    result = ArmResult(name, num_gpu_blocks=engine.cache.num_blocks)
    warm = {str(r.line) for r in islice(workload.requests(), warmup)}
    turns = _Turns(workload, engine, builder, result, warm)
    first = True
    seen = 0
    for group in workload.groups:
        base_s = engine.now_s if group.closed else 0.0
        reqs = group.requests
        if first and seen + len(reqs) > warmup:
            result.first_arrival_s = base_s + reqs[max(0, warmup - seen)].arrival_s
            first = False
        seen += len(reqs)
        i, n = 0, len(reqs)
        while True:
            if not engine.has_work():
                if i == n and not turns.due:
                    break
                if turns.due and (i == n or turns.due[0][0] < base_s + reqs[i].arrival_s):
                    turns.release(None)
                else:
                    i = _add(engine, reqs, i, base_s, builder, result, limit_s=None, warm=warm)
                continue
            limit_s = engine.next_step_start_s()
            i = _add(engine, reqs, i, base_s, builder, result, limit_s, warm)
            turns.release(limit_s)
            step = engine.step()
            if step is None or not step.finished:
                continue
            turns.follow(step.finished)
            counted = [rec for rec in step.finished if rec.request_id not in warm]
            for rec in counted:
                result.add(rec)
            if progress is not None and counted:
                progress(len(counted))
    if progress is not None and result.rejected:
        progress(len(result.rejected))
    return result


@dataclass
class _Turns:
    """A session's later turns, each due its delay after the previous one finished."""

    workload: Workload
    engine: Engine
    builder: PromptBuilder
    result: ArmResult
    warm: set[str]
    due: list[tuple[float, int, TraceRequest]] = field(default_factory=list)

    def follow(self, finished: list[SimRequestRecord]) -> None:
        for rec in finished:
            self._queue(int(rec.request_id), rec.finish_s or self.engine.now_s)

    def _queue(self, line: int, done_s: float) -> None:
        nxt = self.workload.followups.get(line)
        if nxt is not None:
            due_s = max(done_s + (nxt.delay_s or 0.0), nxt.arrival_s)
            heapq.heappush(self.due, (due_s, nxt.line, nxt))

    def release(self, limit_s: float | None) -> None:
        """Add the turns due by `limit_s` (None: the earliest one)."""
        while self.due and (limit_s is None or self.due[0][0] <= limit_s):
            due_s, _, req = heapq.heappop(self.due)
            if not _add_one(self.engine, req, due_s, self.builder, self.result, self.warm):
                # refused: the session goes on (its next turn follows at once, and is judged
                # on its own)
                self._queue(req.line, due_s)
            if limit_s is None:
                return


def _add(
    engine: Engine,
    reqs: list[TraceRequest],
    i: int,
    base_s: float,
    builder: PromptBuilder,
    result: ArmResult,
    limit_s: float | None,
    warm: set[str] | None = None,
) -> int:
    """Add requests from index i whose arrival is at or before `limit_s` (at least one when
    `limit_s` is None); returns the next index. Requests the engine refuses are recorded."""
    n = len(reqs)
    while i < n and (limit_s is None or base_s + reqs[i].arrival_s <= limit_s):
        req = reqs[i]
        i += 1
        _add_one(engine, req, base_s + req.arrival_s, builder, result, warm)
        if limit_s is None:
            break
    return i


def _add_one(
    engine: Engine,
    req: TraceRequest,
    arrival_s: float,
    builder: PromptBuilder,
    result: ArmResult,
    warm: set[str] | None,
) -> bool:
    """Hand one request to the engine at `arrival_s`; False (and recorded) when refused."""
    counted = not warm or str(req.line) not in warm
    if req.prompt_len + req.output_tokens > engine.max_model_len:
        # Refused before its tokens are built: a bogus length must not allocate them.
        if counted:
            result.rejected.append(
                f"line {req.line}: {req.prompt_len} prompt + {req.output_tokens} output "
                f"tokens exceed the model's maximum context length ({engine.max_model_len})"
            )
        return False
    model_req = Request(str(req.line), arrival_s, builder.tokens(req), req.output_tokens)
    try:
        engine.add_request(model_req)
    except ValueError as exc:
        if counted:
            result.rejected.append(f"line {req.line}: {exc}")
        return False
    return True
