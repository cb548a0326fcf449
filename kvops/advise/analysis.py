"""The whole analysis of one workload: both arms at the profiles' values and at the two corners
of their ranges, the closed-form sizing of the workload's shared prefixes, and the flip points.

Replays are the cost. The nominal arms always run over the whole workload; the corner arms and
the read-bandwidth search run over its first `sample_requests` requests when it is longer (the
report says so), and a corner's delta is applied as a shift from the sample's own nominal
delta, so the range stays centred on the full workload's figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from kvops.advise.arms import ArmResult, Profiles, run_arm
from kvops.advise.flips import simulated_break_even_gb_s, throughput_flip_gb_s
from kvops.advise.ranges import corners
from kvops.advise.sizing import Sizing, compute_sizing, inputs_from_settings
from kvops.advise.workload import Group, PromptBuilder, Reuse, Workload, measure_reuse
from kvops.errors import KvopsError
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import EngineSettings

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
    sample_requests: int = 5000
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
    left = limit
    for g in workload.groups:
        if left <= 0:
            break
        groups.append(Group(g.requests[:left], g.closed))
        left -= len(groups[-1].requests)
    return Workload(workload.source, workload.kind, groups, workload.hash_block_tokens)


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


def analyse(
    workload: Workload,
    profiles: Profiles,
    options: AdviseOptions,
    builder: PromptBuilder,
    stage: Stage | None = None,
) -> Analysis:
    """Run every replay the report needs. `stage(description, requests)` may return a progress
    callback (called with the number of requests just finished) for each replay."""

    def progress(what: str, n: int) -> Callable[[int], None] | None:
        return stage(what, n) if stage is not None else None

    base_settings, off_settings = options.arm_settings()
    reuse = measure_reuse(workload, builder, options.chunk_size)
    n = workload.num_requests
    baseline = run_arm(
        "baseline", workload, builder, profiles, base_settings, progress("baseline", n)
    )
    offload = run_arm("offload", workload, builder, profiles, off_settings, progress("offload", n))
    if not baseline.completed:
        first = baseline.rejected[0] if baseline.rejected else "no requests"
        raise NothingSimulated(f"no request of the workload could be simulated; first: {first}")
    part = sample(workload, options.sample_requests)
    sampled = part is not workload
    m = part.num_requests
    if sampled:
        s_base = run_arm(
            "baseline", part, builder, profiles, base_settings, progress("sample baseline", m)
        )
        s_off = run_arm(
            "offload", part, builder, profiles, off_settings, progress("sample offload", m)
        )
    else:
        s_base, s_off = baseline, offload
    reference = _pct_all(s_base, s_off)
    shifts: list[dict[str, float]] = []
    names: list[str] = []
    if options.corners:
        for corner in corners(profiles):
            cb = run_arm(
                "baseline",
                part,
                builder,
                corner.profiles,
                base_settings,
                progress(corner.name + ": baseline", m),
            )
            co = run_arm(
                "offload",
                part,
                builder,
                corner.profiles,
                off_settings,
                progress(corner.name + ": offload", m),
            )
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
    result = Analysis(
        workload, profiles, options, reuse, sizing, baseline, offload,
        _deltas(baseline, offload, points), m if sampled else None, corner_names=names,
        corner_pcts=points,
    )  # fmt: skip
    if options.flips:
        if stage is not None:
            stage("break-even and flip-point search", 0)
        result.sim_break_even_gb_s = simulated_break_even_gb_s(
            profiles, base_settings, off_settings, prefix_tokens, sizing.break_even_read_gb_s
        )
        if reuse.reusable_tokens:
            gap = s_off.duration_s / s_base.duration_s - 1 if s_base.duration_s else 0.0
            result.flip_read_gb_s = throughput_flip_gb_s(
                part, builder, profiles, off_settings, s_base.duration_s, gap,
                sizing.break_even_read_gb_s,
            )  # fmt: skip
        working_set_gb = reuse.shared_working_set_tokens * sizing.kv_bytes_per_token / 1e9
        if working_set_gb > 0:
            size_gb = round(working_set_gb * CPU_TIER_HEADROOM, 1)
            tiered = run_arm(
                "offload+cpu", part, builder, profiles, cpu_tier_settings(off_settings, size_gb),
                progress(f"CPU tier {size_gb:g} GB: offload", m),
            )  # fmt: skip
            pct = _pct_all(s_off, tiered)
            result.cpu_tier = CpuTier(
                size_gb, pct["total_token_throughput_tok_s"], pct["mean_ttft_ms"]
            )
    return result
