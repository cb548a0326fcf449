"""From an analysis to an answer: the verdict, which reference case the traffic resembles, the
flip points, the settings to use, and the reasoning in plain language.

The reference experiment's three outcomes are the vocabulary (LMCache + vLLM on NetApp ONTAP
over NFS/RDMA): (1) unique one-shot prompts, nothing to reuse: no gain; (2) one shared prefix
that stays resident in GPU memory: vLLM's own prefix cache already serves it, no gain;
(3) many long shared prefixes overflowing GPU memory: offload serves what the GPU evicted,
a large gain when storage reads beat recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvops.advise.analysis import VERDICT_METRICS, Analysis, Delta

GB = 1e9
HELPS, NO_GAIN, HURTS, DEPENDS = "helps", "no gain", "hurts", "depends"
CASES = {
    1: "unique prompts (nothing to reuse)",
    2: "shared prefix(es) that stay resident in GPU memory",
    3: "many long shared prefixes overflowing GPU memory",
}
# Below this share of prompt tokens repeating an earlier prompt, traffic counts as unique.
MIN_REUSE_SHARE = 0.10
# The GPU alone counts as serving the reuse when it gets this share of what offload gets.
RESIDENT_SHARE = 0.8


def _classify(gains: list[float], effect: float) -> str:
    """One corner's reading of (throughput gain, TTFT gain), positive = better with offload."""
    if any(g >= effect for g in gains) and all(g > -effect for g in gains):
        return HELPS
    if any(g <= -effect for g in gains) and all(g < effect for g in gains):
        return HURTS
    if any(abs(g) >= effect for g in gains):
        return DEPENDS  # one metric better, the other worse
    return NO_GAIN


def verdicts(a: Analysis) -> tuple[str, list[str]]:
    """The overall verdict, and one reading per point (nominal, then each corner): the same
    reading everywhere is the verdict, anything else is "depends"."""
    effect = a.options.effect_pct
    picked = [a.delta(m) for m in VERDICT_METRICS]
    points = [{d.metric: d.pct for d in picked}, *a.corner_pcts]
    readings = [_classify([d.gain_pct(p[d.metric]) for d in picked], effect) for p in points]
    overall = readings[0] if len(set(readings)) == 1 else DEPENDS
    return overall, readings


def reference_case(a: Analysis) -> int:
    if a.reuse.reuse_share < MIN_REUSE_SHARE:
        return 1
    served = a.offload.total_hit_rate
    if served <= 0 or a.baseline.gpu_hit_rate >= RESIDENT_SHARE * served:
        return 2
    return 3


def output_tokens_flip(a: Analysis) -> int | None:
    """Mean output length beyond which the throughput gain falls under the effect size.

    Offload shortens prefill only; every extra output token adds the same decode time to both
    arms, about ITL x requests / mean concurrency of the run's duration, which dilutes the gain.
    None when there is no throughput gain to dilute."""
    b, o = a.baseline, a.offload
    e = a.options.effect_pct / 100
    if b.duration_s <= 0 or o.duration_s <= 0 or b.duration_s < (1 + e) * o.duration_s:
        return None
    per_token_s = (o.mean_itl_ms / 1e3) * o.completed / max(o.mean_concurrency, 1e-9)
    if per_token_s <= 0:
        return None
    extra_s = (b.duration_s - (1 + e) * o.duration_s) / e
    mean_output = o.output_tokens / max(1, o.completed)
    return int(mean_output + extra_s / per_token_s)


@dataclass
class Advice:
    verdict: str
    readings: list[str]
    case: int
    case_name: str
    offload: str
    settings: dict[str, object] = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)
    flip_points: dict[str, object] = field(default_factory=dict)


def advise(a: Analysis) -> Advice:
    overall, readings = verdicts(a)
    case = reference_case(a)
    s = a.sizing
    storage = a.profiles.storage
    fit = s.gpu_kv_capacity_tokens // s.prefix_tokens
    overflow = (
        f"more than {fit} distinct shared prefixes of ~{s.prefix_tokens:,} tokens overflow GPU "
        "KV memory; up to that the GPU prefix cache can hold them all"
    )
    if not a.reuse.reusable_tokens:
        overflow = f"none shared here; if prompts of this length were shared, {overflow}"
    flips: dict[str, object] = {
        "distinct_prefixes": fit + 1,
        "distinct_prefixes_note": overflow,
        "read_gb_s": a.flip_read_gb_s,
        "output_tokens": output_tokens_flip(a),
    }
    if overall == HELPS:
        switch = "on"
    elif overall == DEPENDS and readings[0] == HELPS:
        switch = "on, if storage reaches the profile's read bandwidth (check with gdsio)"
    else:
        switch = "off"
    working_set_gb = a.reuse.shared_working_set_tokens * s.kv_bytes_per_token / GB
    tier = a.cpu_tier
    tier_gb: float = 0.0
    tier_note = (
        f"the reused working set is {working_set_gb:.1f} GB; a CPU tier (LMCache local_cpu + "
        "max_local_cpu_size) of that size would serve re-reads from host DRAM (not simulated: "
        "--quick or nothing reused)"
    )
    if tier is not None:
        pays = tier.throughput_gain_pct >= a.options.effect_pct or (
            -tier.mean_ttft_gain_pct >= a.options.effect_pct
        )
        tier_gb = tier.size_gb if pays and switch != "off" else 0.0
        tier_note = (
            f"simulated a {tier.size_gb:g} GB CPU tier (local_cpu: true, max_local_cpu_size: "
            f"{tier.size_gb:g}) in front of GDS: throughput {tier.throughput_gain_pct:+.1f}%, "
            f"mean TTFT {tier.mean_ttft_gain_pct:+.1f}% vs GDS alone; "
            + ("worth it if the host has the DRAM" if tier_gb else "not worth it here")
        )
    chunk = a.options.chunk_size
    typical = a.reuse.typical_shared_prefix_tokens
    chunk_note = f"{chunk} (LMCache default; only full chunks are stored)"
    if 0 < typical < 4 * chunk:
        smaller = max(16, 1 << max(4, (typical // 4).bit_length() - 1))
        chunk_note = (
            f"{smaller}: shared prefixes are ~{typical} tokens, so {chunk}-token chunks "
            "would leave much of each prefix unstored"
        )
    gpu_blocks_lost = a.baseline.num_gpu_blocks - a.offload.num_gpu_blocks
    settings: dict[str, object] = {
        "offload": switch,
        "chunk_size": chunk_note,
        "cpu_tier_gb": tier_gb,
        "cpu_tier_note": tier_note,
        "gds_buffer_size_mib": a.options.gds_buffer_mib,
        "kv_memory_note": (
            f"the GDS buffer takes {gpu_blocks_lost * 16:,} tokens of GPU KV capacity "
            f"({a.baseline.num_gpu_blocks * 16:,} -> {a.offload.num_gpu_blocks * 16:,}); "
            "LMCache's GDS guide starts at 8 GiB with --gpu-memory-utilization 0.85 on 80 GB"
        ),
        "storage_read_gb_s": storage.read_bandwidth_gb_s,
    }
    return Advice(
        overall, readings, case, CASES[case], switch, settings, explain(a, overall, case), flips
    )


def explain(a: Analysis, verdict: str, case: int) -> list[str]:
    s, r = a.sizing, a.reuse
    thr, ttft = a.delta(VERDICT_METRICS[0]), a.delta(VERDICT_METRICS[1])
    cap_gb = s.gpu_kv_capacity_tokens * s.kv_bytes_per_token / GB
    ws_gb = r.shared_working_set_tokens * s.kv_bytes_per_token / GB
    lines = [
        f"{r.reuse_share:.0%} of prompt tokens repeat an earlier prompt's prefix; the reused "
        f"working set is {ws_gb:.1f} GB against {cap_gb:.1f} GB of GPU KV capacity.",
        f"Prefix hit rate: {a.baseline.gpu_hit_rate:.0%} from the GPU alone, "
        f"{a.offload.total_hit_rate:.0%} with offload.",
    ]
    if case == 1:
        lines.append(
            "This is reference case 1 (unique prompts): nothing repeats, so no cache can help; "
            "offload only adds its store traffic."
        )
    elif case == 2:
        lines.append(
            "This is reference case 2 (a shared prefix that stays resident): vLLM's GPU prefix "
            "cache already serves the reuse, so offload has little left to add."
        )
    else:
        lines.append(
            "This is reference case 3 (many long shared prefixes overflowing GPU memory): the "
            "GPU evicts prefixes that come back, and offload serves them from storage."
        )
        if s.storage_read_gb_s > s.break_even_read_gb_s:
            lines.append(
                f"Loading a ~{s.prefix_tokens:,}-token prefix takes "
                f"{s.load_seconds_per_prefix * 1e3:,.0f} ms at {s.storage_read_gb_s:g} GB/s "
                f"vs {s.prefill_seconds_per_prefix * 1e3:,.0f} ms to recompute it: storage is "
                f"above the {s.break_even_read_gb_s:.2f} GB/s break-even."
            )
        else:
            lines.append(
                f"But {s.storage_read_gb_s:g} GB/s read is below the "
                f"{s.break_even_read_gb_s:.2f} GB/s break-even: recomputing beats loading."
            )

    def shown(d: Delta) -> str:
        if not a.corner_names:
            return f"{d.pct:+.1f}%"
        return f"{d.pct:+.1f}% ({d.low_pct:+.1f}..{d.high_pct:+.1f}%)"

    lines.append(
        f"Predicted with offload: throughput {shown(thr)}, mean TTFT {shown(ttft)}: {verdict}."
    )
    return lines
