"""The advise report three ways: a dict for `--json`, Markdown for `--markdown`, plain terminal
lines. All three carry the same facts; only layout differs."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from kvops.advise.analysis import Analysis
from kvops.advise.recommend import Advice

WIDTH = 100
LABELS = {
    "total_token_throughput_tok_s": ("throughput", "tok/s"),
    "mean_ttft_ms": ("mean TTFT", "ms"),
    "p99_ttft_ms": ("p99 TTFT", "ms"),
    "mean_itl_ms": ("mean ITL", "ms"),
}


def report_dict(a: Analysis, advice: Advice) -> dict[str, Any]:
    w = a.workload
    return {
        "source": w.source,
        "kind": w.kind,
        "requests": w.num_requests,
        "profiles": {
            "model": a.profiles.model.name,
            "gpu": a.profiles.gpu.name,
            "storage": a.profiles.storage.name,
            "storage_read_gb_s": a.profiles.storage.read_bandwidth_gb_s,
            "storage_write_gb_s": a.profiles.storage.write_bandwidth_gb_s,
            "storage_io_latency_us": a.profiles.storage.io_latency_us,
        },
        "verdict": advice.verdict,
        "readings": dict(zip(["nominal", *a.corner_names], advice.readings, strict=True)),
        "reference_case": advice.case,
        "reference_case_name": advice.case_name,
        "prefix_hit_rate_gpu_only": a.baseline.gpu_hit_rate,
        "prefix_hit_rate_with_offload": a.offload.total_hit_rate,
        "deltas": [
            {
                "metric": d.metric,
                "baseline": d.baseline,
                "offload": d.offload,
                "delta_pct": d.pct,
                "delta_low_pct": d.low_pct,
                "delta_high_pct": d.high_pct,
            }
            for d in a.deltas
        ],
        "reuse": {
            "reuse_share": a.reuse.reuse_share,
            "shared_working_set_tokens": a.reuse.shared_working_set_tokens,
            "distinct_shared_prefixes": a.reuse.distinct_shared_prefixes,
            "typical_shared_prefix_tokens": a.reuse.typical_shared_prefix_tokens,
        },
        "gpu_kv_capacity_tokens": a.sizing.gpu_kv_capacity_tokens,
        "sizing": a.sizing.to_dict(),
        "break_even_read_gb_s": a.sizing.break_even_read_gb_s,
        "simulated_break_even_read_gb_s": a.sim_break_even_gb_s,
        "flip_points": advice.flip_points,
        "cpu_tier": dataclasses.asdict(a.cpu_tier) if a.cpu_tier else None,
        "recommended_settings": advice.settings,
        "explanation": advice.explanation,
        "arms": {"baseline": a.baseline.summary(), "offload": a.offload.summary()},
        "sample_requests": a.sample_requests,
        "sampling": _sampling_dict(a),
        "notes": notes(a),
        "skipped_lines": w.skipped_lines,
    }


def _sampling_dict(a: Analysis) -> dict[str, object] | None:
    s = a.sampling
    if s is None:
        return None
    return {
        "method": "stratified seeded windows, each warmed up to its cache state",
        "seed": s.plan.seed,
        "windows": len(s.plan.windows),
        "window_requests": s.plan.window_requests,
        "counted_requests": s.plan.counted_requests,
        "replayed_requests_per_arm": s.plan.replayed_requests,
        "total_requests": s.plan.total_requests,
        "range_windows": len(s.range_windows),
        "range_requests": s.range_requests,
        "capped_warmups": s.capped_warmups,
        "delta_half_width_95_pct": s.half_width_pct,
    }


def sampling_notes(a: Analysis) -> list[str]:
    s = a.sampling
    if s is None:
        return []
    p = s.plan
    half = s.half_width_pct
    out = [
        f"sampled: the arms replayed {len(p.windows)} windows of {p.window_requests:,} requests "
        f"({p.counted_requests:,} of {p.total_requests:,} requests counted, "
        f"{p.replayed_requests:,} replayed with the warm-ups that rebuild each window's GPU "
        f"cache; the offload tier starts with every chunk stored before it), one per equal "
        f"slice of the trace at a seeded offset (seed {p.seed}); ranges, the read-bandwidth "
        f"flip point and the CPU tier ran on {len(s.range_windows)} of those windows "
        f"({s.range_requests:,} requests). Sampling adds +/-"
        f"{half['total_token_throughput_tok_s']:.1f} points to the throughput delta and +/-"
        f"{half['mean_ttft_ms']:.1f} to the mean-TTFT delta (95%, from the spread between "
        "windows; included in the ranges shown). p99 TTFT comes from the sampled requests alone "
        "and can miss a rare tail. Raise --sample-requests for a larger sample"
    ]
    if s.capped_warmups:
        out.append(
            f"{s.capped_warmups} window(s) had their warm-up capped before it touched the GPU "
            "cache's capacity in distinct tokens: their GPU hit rates may read low"
        )
    return out


def notes(a: Analysis) -> list[str]:
    out = list(a.workload.notes)
    out += sampling_notes(a)
    if a.sample_requests is not None and a.sampling is None:
        out.append(
            f"ranges and the read-bandwidth flip point come from the first {a.sample_requests:,} "
            "requests (--sample-requests)"
        )
    for arm in (a.baseline, a.offload):
        if arm.rejected:
            out.append(
                f"{arm.name}: {len(arm.rejected)} request(s) refused, first: {arm.rejected[0]}"
            )
    if a.corner_names:
        out.append(
            "ranges: prefill MFU x0.82..x1.18, storage bandwidth x0.7..x1.15, I/O latency "
            "x0.5..x2.5 around the profiles (kvops.advise.ranges)"
        )
    return out


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "none found"
    return f"{x:,.2f}{unit}" if abs(x) < 100 else f"{x:,.0f}{unit}"


def _table(a: Analysis) -> list[tuple[str, str, str, str]]:
    rows = []
    for d in a.deltas:
        label, unit = LABELS[d.metric]
        spread = f" ({d.low_pct:+.1f}..{d.high_pct:+.1f})" if a.corner_names else ""
        rows.append(
            (f"{label} ({unit})", _fmt(d.baseline), _fmt(d.offload), f"{d.pct:+.1f}%{spread}")
        )
    rows.append(
        (
            "prefix hit rate",
            f"{a.baseline.gpu_hit_rate:.0%}",
            f"{a.offload.total_hit_rate:.0%}",
            f"GPU {a.offload.gpu_hit_rate:.0%} + offload "
            f"{a.offload.total_hit_rate - a.offload.gpu_hit_rate:.0%}",
        )
    )
    return rows


def _flip_lines(a: Analysis, advice: Advice) -> list[str]:
    f = advice.flip_points
    read = f.get("read_gb_s")
    searched = a.options.flips
    out = [
        f"break-even read bandwidth: {a.sizing.break_even_read_gb_s:.2f} GB/s closed form"
        + (f", {_fmt(a.sim_break_even_gb_s, ' GB/s')} simulated" if searched else "")
        + f" (storage: {a.profiles.storage.read_bandwidth_gb_s:g} GB/s)",
        "flip point, read bandwidth: "
        + (
            f"offload's throughput beats the baseline's above {read:.2f} GB/s of reads"
            if isinstance(read, float)
            else "none (no bandwidth changes the answer)"
            if searched
            else "not searched (--quick)"
        ),
        f"flip point, distinct prefixes: {f['distinct_prefixes_note']}",
    ]
    out_tokens = f.get("output_tokens")
    out.append(
        "flip point, output length: "
        + (
            f"the throughput gain falls under {a.options.effect_pct:g}% above ~{out_tokens:,} "
            "output tokens per request (the TTFT gain stays)"
            if isinstance(out_tokens, int)
            else "none (no throughput gain for longer outputs to dilute)"
        )
    )
    return out


def _wrapped(texts: list[str], indent: str = "  ", width: int = WIDTH) -> list[str]:
    """Each text as lines of at most `width` characters, continuation lines indented more."""
    out: list[str] = []
    for text in texts:
        out += textwrap.wrap(
            text, width, initial_indent=indent, subsequent_indent=indent + "  "
        ) or [indent]
    return out


def terminal_lines(a: Analysis, advice: Advice) -> list[str]:
    p = a.profiles
    head = (
        f"{a.workload.source}: {a.workload.num_requests:,} requests; {p.model.name} on "
        f"{p.gpu.name} (tp={a.options.tensor_parallel_size}), storage {p.storage.name}"
    )
    lines = [head, "", f"VERDICT: offload {advice.verdict.upper()}  ({advice.case_name})", ""]
    head = "delta (range)" if a.corner_names else "delta"
    rows = [("", "baseline", "offload", head), *_table(a)]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    lines += ["", *_wrapped(_flip_lines(a, advice), ""), "", "Why:"]
    lines += _wrapped(advice.explanation)
    lines += ["", "Recommended settings:"]
    keys = ("offload", "chunk_size", "cpu_tier_note", "gds_buffer_size_mib", "kv_memory_note")
    lines += _wrapped([f"{key}: {advice.settings[key]}" for key in keys])
    shown = notes(a)
    if shown or a.workload.skipped_lines:
        lines += ["", "Notes:"]
        lines += _wrapped(shown)
        lines += [f"  skipped {x}" for x in a.workload.skipped_lines[:20]]
        if len(a.workload.skipped_lines) > 20:
            lines.append(f"  ... {len(a.workload.skipped_lines) - 20} more skipped lines")
    return lines


def markdown(a: Analysis, advice: Advice) -> str:
    p = a.profiles
    out = [
        f"# kvops advise: offload **{advice.verdict}**",
        "",
        f"- Workload: `{a.workload.source}` ({a.workload.num_requests:,} requests)",
        f"- Hardware: {p.model.name} on {p.gpu.name} (tp={a.options.tensor_parallel_size}), "
        f"storage {p.storage.name} ({p.storage.read_bandwidth_gb_s:g} GB/s read)",
        f"- Reference case {advice.case}: {advice.case_name}",
        "",
        f"| metric | baseline | offload | {'delta (range)' if a.corner_names else 'delta'} |",
        "|---|---:|---:|---:|",
    ]
    out += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in _table(a)]
    out += ["", "## Flip points", ""] + [f"- {x}" for x in _flip_lines(a, advice)]
    out += ["", "## Why", ""] + [f"- {x}" for x in advice.explanation]
    out += ["", "## Recommended settings", ""]
    for key in ("offload", "chunk_size", "cpu_tier_note", "gds_buffer_size_mib", "kv_memory_note"):
        out.append(f"- `{key}`: {advice.settings[key]}")
    shown = notes(a)
    if shown:
        out += ["", "## Notes", ""] + [f"- {n}" for n in shown]
    return "\n".join(out) + "\n"
