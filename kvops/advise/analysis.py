"""The whole analysis of one workload: both arms at the profiles' values and at the two corners
of their ranges, the closed-form sizing of the workload's shared prefixes, and the flip points.

Replays are the cost (1-2 ms of CPU per request per arm). A workload of up to
`sample_requests` requests is replayed whole. A longer trace is replayed as a seeded,
stratified sample of windows, each warmed up to the cache state it starts in
(`kvops.advise.windows`), and the report states the sample and the interval it adds. A longer
spec keeps its whole nominal replay and runs the ranges and the flip search on its first
`sample_requests` requests. Either way a corner's delta is applied as a shift from the part's
own nominal delta, so the range stays centred on the nominal figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from kvops.advise.arms import ArmResult, Profiles, merge, run_arm
from kvops.advise.flips import simulated_break_even_gb_s, throughput_flip_gb_s
from kvops.advise.ranges import corners
from kvops.advise.sizing import Sizing, compute_sizing, inputs_from_settings
from kvops.advise.windows import (
    WindowPlan,
    WindowReplay,
    plan_windows,
    sampling_half_width_pct,
    spread_indices,
)
from kvops.advise.workload import (
    Group,
    PromptBuilder,
    Reuse,
    TraceRequest,
    Workload,
    measure_reuse,
    request_units,
)
from kvops.errors import KvopsError
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import EngineSettings, build_engine

# (metric, True when higher is better); the first two decide the verdict, as in the reference
# experiment (throughput and mean TTFT), the others are shown.
METRICS: tuple[tuple[str, bool], ...] = (
    ("total_token_throughput_tok_s", True),
    ("mean_ttft_ms", False),
    ("mean_itl_ms", False),
    ("p99_ttft_ms", False),
)
VERDICT_METRICS = ("total_token_throughput_tok_s", "mean_ttft_ms")
# A CPU tier sized to the reused working set plus room for what is still being written.
CPU_TIER_HEADROOM = 1.2


class NothingSimulated(KvopsError, ValueError):
    """Every request was refused by the engine (e.g. all longer than the model's context)."""


Stage = Callable[[str, int], Callable[[int], None] | None]


@dataclass(frozen=True)
class AdviseOptions:
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    chunk_size: int = 256
    gds_buffer_mib: int = 8192
    sample_requests: int = 2000
    window_requests: int = 250
    range_windows: int = 2
    seed: int = 0
    effect_pct: float = 5.0
    corners: bool = True
    flips: bool = True

    def arm_settings(self) -> tuple[EngineSettings, EngineSettings]:
        """Baseline: vLLM with prefix caching. Offload: the same plus LMCache's GDS backend
        (no CPU hot cache, as LMCache's GDS docs recommend) with its VRAM buffer."""
        base = EngineSettings(
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        lm = LMCacheSettings(
            chunk_size=self.chunk_size,
            local_cpu=False,
            gds_path="(virtual)",
            gds_buffer_size=self.gds_buffer_mib,
        )
        return base, dataclasses.replace(base, offload=True, lmcache=lm)


def delta_pct(baseline: float, offload: float) -> float:
    return 100.0 * (offload / baseline - 1.0) if baseline else 0.0


@dataclass(frozen=True)
class Delta:
    """Offload relative to baseline, in percent, with the range from the profile corners."""

    metric: str
    higher_is_better: bool
    baseline: float
    offload: float
    pct: float
    low_pct: float
    high_pct: float

    def gain_pct(self, pct: float) -> float:
        """The change expressed so that positive is better for offload."""
        return pct if self.higher_is_better else -pct


@dataclass
class Analysis:
    workload: Workload
    profiles: Profiles
    options: AdviseOptions
    reuse: Reuse
    sizing: Sizing
    baseline: ArmResult
    offload: ArmResult
    deltas: list[Delta]
    sample_requests: int | None = None  # set when corners/flips ran on a sample
    sim_break_even_gb_s: float | None = None
    flip_read_gb_s: float | None = None
    cpu_tier: CpuTier | None = None
    corner_names: list[str] = field(default_factory=list)
    corner_pcts: list[dict[str, float]] = field(default_factory=list)  # metric -> delta %
    sampling: Sampling | None = None  # set when a long trace was replayed as windows

    def delta(self, metric: str) -> Delta:
        return next(d for d in self.deltas if d.metric == metric)


@dataclass(frozen=True)
class CpuTier:
    """A CPU DRAM tier in front of GDS (LMCache `local_cpu` + `max_local_cpu_size`, written
    through, read first), simulated on the sample against GDS alone."""

    size_gb: float
    throughput_gain_pct: float  # vs the GDS-only offload arm on the same requests
    mean_ttft_gain_pct: float  # negative: faster first tokens


def cpu_tier_settings(offload: EngineSettings, size_gb: float) -> EngineSettings:
    lm = dataclasses.replace(offload.lmcache, local_cpu=True, max_local_cpu_size=size_gb)
    return dataclasses.replace(offload, lmcache=lm)


def sample(workload: Workload, limit: int) -> Workload:
    """The first `limit` requests (whole groups while they fit, then part of one)."""
    if workload.num_requests <= limit:
        return workload
    groups: list[Group] = []
    followups: dict[int, TraceRequest] = {}
    left = limit
    for g in workload.groups:
        if left <= 0:
            break
        kept: list[TraceRequest] = []
        for req in g.requests:  # a session's first turn brings its later turns along
            if left <= 0:
                break
            kept.append(req)
            left -= 1
            prev, nxt = req, workload.followups.get(req.line)
            while nxt is not None and left > 0:
                followups[prev.line] = nxt
                left -= 1
                prev, nxt = nxt, workload.followups.get(nxt.line)
        groups.append(Group(kept, g.closed))
    return Workload(
        workload.source, workload.kind, groups, workload.hash_block_tokens, followups=followups
    )


def _deltas(base: ArmResult, off: ArmResult, points: list[dict[str, float]]) -> list[Delta]:
    b, o = base.summary(), off.summary()
    out = []
    for metric, higher in METRICS:
        pct = delta_pct(b[metric], o[metric])
        values = [pct, *(p[metric] for p in points)]
        out.append(Delta(metric, higher, b[metric], o[metric], pct, min(values), max(values)))
    return out


def _pct_all(base: ArmResult, off: ArmResult) -> dict[str, float]:
    b, o = base.summary(), off.summary()
    return {m: delta_pct(b[m], o[m]) for m, _ in METRICS}


@dataclass(frozen=True)
class Sampling:
    """How a long trace was sampled (see `kvops.advise.windows`) and what that costs in
    certainty: the 95% half-width, in percentage points, of each delta over which windows were
    drawn (it does not cover the warm-up's approximation of the state before each window)."""

    plan: WindowPlan
    range_windows: list[int]  # indices of the windows the ranges, flips and CPU tier ran on
    half_width_pct: dict[str, float]

    @property
    def range_requests(self) -> int:
        windows = self.plan.windows
        return sum(windows[k].stop - windows[k].start for k in self.range_windows)

    @property
    def capped_warmups(self) -> int:
        return sum(1 for w in self.plan.windows if w.warmup_capped)


ReplayPart = Callable[[str, Profiles, EngineSettings, str], ArmResult]


def analyse(
    workload: Workload,
    profiles: Profiles,
    options: AdviseOptions,
    builder: PromptBuilder,
    stage: Stage | None = None,
) -> Analysis:
    """Run every replay the report needs. `stage(description, requests)` may return a progress
    callback (called with the number of requests just finished) for each replay.

    A workload of at most `sample_requests` requests is replayed whole by the nominal arms and
    the ranges. A longer trace (open arrivals) is replayed as a seeded sample of windows
    (`kvops.advise.windows`): both nominal arms over `sample_requests // window_requests`
    windows, the ranges, flip search and CPU tier over `range_windows` of them. A longer spec
    (closed groups, whose state carries from group to group) keeps the whole nominal replay and
    runs the ranges on its first `sample_requests` requests."""

    def progress(what: str, n: int) -> Callable[[int], None] | None:
        return stage(what, n) if stage is not None else None

    base_settings, off_settings = options.arm_settings()
    n = workload.num_requests
    windowed = (
        n > options.sample_requests
        and options.sample_requests >= 2 * options.window_requests
        and not any(g.closed for g in workload.groups)
        and not workload.followups  # sessions carry their state from turn to turn
    )
    sampling: Sampling | None = None
    if windowed:
        units = list(request_units(workload, builder, options.chunk_size))
        reuse = measure_reuse(workload, builder, options.chunk_size, units)
        engine = build_engine(profiles.model, profiles.gpu, profiles.storage, base_settings)
        capacity = engine.cache.num_blocks * base_settings.block_size
        count = options.sample_requests // options.window_requests
        plan = plan_windows(units, count, options.window_requests, capacity, options.seed)
        replay = WindowReplay(
            workload, units, plan, builder, base_settings.block_size, options.chunk_size
        )
        del units
        every = list(range(count))
        m_all = plan.counted_requests
        bw = replay.run("baseline", profiles, base_settings, every, progress("baseline", m_all))
        ow = replay.run("offload", profiles, off_settings, every, progress("offload", m_all))
        share = m_all / n
        baseline, offload = merge("baseline", bw, share), merge("offload", ow, share)
        sub = spread_indices(options.range_windows, count)
        sampling = Sampling(plan, sub, {})
        m = sampling.range_requests
        s_base = merge("baseline", [bw[k] for k in sub], m / n)
        s_off = merge("offload", [ow[k] for k in sub], m / n)
        for metric, _ in METRICS:
            sampling.half_width_pct[metric] = sampling_half_width_pct(bw, ow, metric, delta_pct)

        def part(name: str, p: Profiles, st: EngineSettings, what: str) -> ArmResult:
            return merge(name, replay.run(name, p, st, sub, progress(what, m)), m / n)

    else:
        reuse = measure_reuse(workload, builder, options.chunk_size)
        baseline = run_arm(
            "baseline", workload, builder, profiles, base_settings, progress("baseline", n)
        )
        offload = run_arm(
            "offload", workload, builder, profiles, off_settings, progress("offload", n)
        )
        piece = sample(workload, options.sample_requests)
        m = piece.num_requests
        if piece is not workload:
            s_base = run_arm(
                "baseline", piece, builder, profiles, base_settings, progress("sample baseline", m)
            )
            s_off = run_arm(
                "offload", piece, builder, profiles, off_settings, progress("sample offload", m)
            )
        else:
            s_base, s_off = baseline, offload

        def part(name: str, p: Profiles, st: EngineSettings, what: str) -> ArmResult:
            return run_arm(name, piece, builder, p, st, progress(what, m))

    if not baseline.completed:
        first = baseline.rejected[0] if baseline.rejected else "no requests"
        raise NothingSimulated(f"no request of the workload could be simulated; first: {first}")
    sampled = windowed or m < n
    return _ranges_and_flips(
        workload, profiles, options, reuse, baseline, offload, s_base, s_off, part,
        m if sampled else None, sampling, stage,
    )  # fmt: skip


def _ranges_and_flips(
    workload: Workload,
    profiles: Profiles,
    options: AdviseOptions,
    reuse: Reuse,
    baseline: ArmResult,
    offload: ArmResult,
    s_base: ArmResult,
    s_off: ArmResult,
    part: ReplayPart,
    sample_requests: int | None,
    sampling: Sampling | None,
    stage: Stage | None,
) -> Analysis:
    """Corners, sizing, flip points and the CPU tier, on the part `part` replays (whose
    nominal arms are `s_base`, `s_off`)."""
    base_settings, off_settings = options.arm_settings()
    n = workload.num_requests
    reference = _pct_all(s_base, s_off)
    shifts: list[dict[str, float]] = []
    names: list[str] = []
    if options.corners:
        for corner in corners(profiles):
            cb = part("baseline", corner.profiles, base_settings, corner.name + ": baseline")
            co = part("offload", corner.profiles, off_settings, corner.name + ": offload")
            pct = _pct_all(cb, co)
            shifts.append({k: pct[k] - reference[k] for k in pct})
            names.append(corner.name)
    prefix_tokens = reuse.typical_shared_prefix_tokens or max(1, reuse.prompt_tokens // max(1, n))
    sizing = compute_sizing(
        profiles.model,
        profiles.gpu,
        profiles.storage,
        inputs_from_settings(base_settings, prefix_tokens, max(1, reuse.distinct_shared_prefixes)),
    )
    full = _pct_all(baseline, offload)
    points = [{k: full[k] + shift[k] for k in full} for shift in shifts]
    deltas = _deltas(baseline, offload, points)
    if sampling is not None:  # the sample's own uncertainty widens each range
        deltas = [
            dataclasses.replace(
                d,
                low_pct=d.low_pct - sampling.half_width_pct[d.metric],
                high_pct=d.high_pct + sampling.half_width_pct[d.metric],
            )
            for d in deltas
        ]
    result = Analysis(
        workload, profiles, options, reuse, sizing, baseline, offload, deltas, sample_requests,
        corner_names=names, corner_pcts=points, sampling=sampling,
    )  # fmt: skip
    if options.flips:
        if stage is not None:
            stage("break-even and flip-point search", 0)
        result.sim_break_even_gb_s = simulated_break_even_gb_s(
            profiles, base_settings, off_settings, prefix_tokens, sizing.break_even_read_gb_s
        )
        if reuse.reusable_tokens:
            gap = s_off.duration_s / s_base.duration_s - 1 if s_base.duration_s else 0.0

            def offload_duration_s(p: Profiles) -> float:
                bandwidth = p.storage.read_bandwidth_gb_s
                what = f"offload at {bandwidth:.2f} GB/s"
                return part("offload", p, off_settings, what).duration_s

            result.flip_read_gb_s = throughput_flip_gb_s(
                offload_duration_s, profiles, s_base.duration_s, gap, sizing.break_even_read_gb_s
            )
        working_set_gb = reuse.shared_working_set_tokens * sizing.kv_bytes_per_token / 1e9
        if working_set_gb > 0:
            size_gb = round(working_set_gb * CPU_TIER_HEADROOM, 1)
            tiered = part(
                "offload+cpu", profiles, cpu_tier_settings(off_settings, size_gb),
                f"CPU tier {size_gb:g} GB: offload",
            )  # fmt: skip
            pct = _pct_all(s_off, tiered)
            result.cpu_tier = CpuTier(
                size_gb, pct["total_token_throughput_tok_s"], pct["mean_ttft_ms"]
            )
    return result
