"""A long trace replayed as a seeded sample of windows instead of end to end.

Replaying is the cost of `kvops advise` (about 1-2 ms of CPU per request per arm), so a
100,000-request trace cannot be replayed whole by every arm. What a request sees depends on the
trace before it only through two states, and both can be rebuilt from the trace's reuse
structure (the units of each prompt and where each unit was first seen, `request_units`):
- the GPU prefix cache: LRU over blocks, so at a window's start it holds the most recently used
  distinct blocks, up to its capacity (the LRU stack-distance argument: Mattson et al., "Evaluation
  techniques for storage hierarchies", IBM Systems Journal 9(2), 1970). Each window is preceded
  by a warm-up, replayed but not counted, that reaches back until the distinct tokens it touches
  exceed the GPU KV capacity (and at least `MIN_WARMUP` requests, for the queue);
- the offload tier: GDS never evicts, so at the warm-up's start it holds every full chunk of
  every earlier prompt; the chunks the warm-up and the window will look up are preloaded.
Windows are drawn by stratified random sampling (one per equal slice of the trace, at a seeded
random offset in it), so every part of the trace's day is represented. The spread of the
windows' own deltas gives the sampling interval the report states.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvops.advise.arms import ArmResult, Profiles, merge, run_arm
from kvops.advise.workload import Group, PromptBuilder, TraceRequest, Workload
from kvops.sim.engine import EngineSettings
from kvops.sim.hashing import PromptHasher

MIN_WARMUP = 32  # requests: enough for the engine's queue to fill as in the full replay
MAX_WARMUP_WINDOWS = 4  # a warm-up at most this many windows long (the report says if capped)
# Student's t, two-sided 95%, by degrees of freedom (NIST/SEMATECH e-Handbook, table 1.3.6.7.2,
# https://www.itl.nist.gov/div898/handbook/eda/section3/eda3672.htm); 1.96 beyond.
_T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        20: 2.086, 30: 2.042}  # fmt: skip

Units = list[tuple[TraceRequest, list[int], int]]
Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class Window:
    warmup_start: int  # index of the first warm-up request in the trace
    start: int  # index of the first counted request
    stop: int  # one past the last counted request
    warmup_capped: bool  # the warm-up stopped at its length limit, short of the GPU capacity


@dataclass(frozen=True)
class WindowPlan:
    windows: list[Window]
    window_requests: int
    total_requests: int
    seed: int

    @property
    def counted_requests(self) -> int:
        return sum(w.stop - w.start for w in self.windows)

    @property
    def replayed_requests(self) -> int:
        return sum(w.stop - w.warmup_start for w in self.windows)


def t95(df: int) -> float:
    if df <= 0:
        return math.inf
    known = [k for k in _T95 if k <= df]
    return _T95[max(known)] if df <= 30 else 1.96


def plan_windows(
    units: Units,
    num_windows: int,
    window_requests: int,
    capacity_tokens: int,
    seed: int = 0,
) -> WindowPlan:
    """`num_windows` windows of `window_requests` counted requests, one per equal slice of the
    trace at a seeded random offset, each with the warm-up its GPU cache state needs."""
    n = len(units)
    rng = np.random.default_rng(seed)
    size = n // num_windows
    windows = []
    for k in range(num_windows):
        lo = k * size
        start = lo + int(rng.integers(0, max(1, size - window_requests + 1)))
        stop = min(n, start + window_requests)
        warm, capped = _warmup_start(units, start, capacity_tokens, window_requests)
        windows.append(Window(warm, start, stop, capped))
    return WindowPlan(windows, window_requests, n, seed)


def _warmup_start(
    units: Units, start: int, capacity_tokens: int, window_requests: int
) -> tuple[int, bool]:
    """Walk back from `start` until the distinct tokens touched exceed the GPU capacity."""
    limit = max(MIN_WARMUP, MAX_WARMUP_WINDOWS * window_requests)
    seen: set[int] = set()
    footprint = 0
    i = start
    while i > 0:
        if start - i >= MIN_WARMUP and footprint >= capacity_tokens:
            return i, False
        if start - i >= limit:
            return i, True
        i -= 1
        req, keys, unit = units[i]
        repeated = sum(1 for k in keys if k in seen)
        footprint += req.prompt_len + req.output_tokens - repeated * unit
        seen.update(keys)
    return 0, False


def first_seen(units: Units) -> dict[int, int]:
    """Each unit key's first request index."""
    out: dict[int, int] = {}
    for i, (_, keys, _) in enumerate(units):
        for k in keys:
            out.setdefault(k, i)
    return out


def stored_before(
    units: Units,
    window: Window,
    seen_at: dict[int, int],
    builder: PromptBuilder,
    block_size: int,
    chunk_size: int,
) -> list[int]:
    """The offload chunk hashes (as the engine keys them) of the warm-up's and the window's
    prompts that a request before the warm-up had already stored."""
    hasher = PromptHasher(block_size, chunk_size)
    chunks: dict[int, None] = {}
    for req, keys, unit in units[window.warmup_start : window.stop]:
        lead = 0
        for k in keys:
            if seen_at[k] >= window.warmup_start:
                break
            lead += 1
        n_chunks = lead * unit // chunk_size
        if n_chunks:
            chunks.update(dict.fromkeys(hasher(builder.tokens(req))[1][:n_chunks]))
    return list(chunks)


class WindowReplay:
    """Replays chosen windows of one trace per arm; results are kept per window."""

    def __init__(
        self,
        workload: Workload,
        units: Units,
        plan: WindowPlan,
        builder: PromptBuilder,
        block_size: int,
        chunk_size: int,
    ) -> None:
        self.workload = workload
        self.plan = plan
        self.builder = builder
        seen_at = first_seen(units)
        self._requests = [u[0] for u in units]
        self._preload = [
            stored_before(units, w, seen_at, builder, block_size, chunk_size) for w in plan.windows
        ]

    def window_workload(self, window: Window) -> Workload:
        reqs = self._requests[window.warmup_start : window.stop]
        w = self.workload
        return Workload(w.source, w.kind, [Group(reqs)], w.hash_block_tokens)

    def run(
        self,
        name: str,
        profiles: Profiles,
        settings: EngineSettings,
        which: list[int],
        progress: Progress = None,
    ) -> list[ArmResult]:
        """One result per window index in `which` (counted requests only)."""
        out = []
        for k in which:
            window = self.plan.windows[k]
            preload = self._preload[k] if settings.offload else None
            workload = self.window_workload(window)
            warmup = window.start - window.warmup_start
            result = run_arm(
                name, workload, self.builder, profiles, settings, progress, warmup, preload
            )
            out.append(result)
        return out


def sampling_half_width_pct(
    base: list[ArmResult], off: list[ArmResult], metric: str, delta: Callable[..., float]
) -> float:
    """95% half-width of the offload-vs-baseline delta (percentage points) from the spread of
    the windows' own deltas: t x standard error of their mean."""
    pcts = [
        delta(merge("b", [b], 0.0).summary()[metric], merge("o", [o], 0.0).summary()[metric])
        for b, o in zip(base, off, strict=True)
    ]
    if len(pcts) < 2:
        return math.inf
    return t95(len(pcts) - 1) * float(np.std(pcts, ddof=1)) / math.sqrt(len(pcts))


def spread_indices(count: int, of: int) -> list[int]:
    """`count` window indices spread evenly over `of` (first and last included)."""
    if count >= of:
        return list(range(of))
    return sorted({round(float(x)) for x in np.linspace(0, of - 1, count)})


__all__ = ["WindowPlan", "WindowReplay", "merge", "plan_windows", "spread_indices"]
