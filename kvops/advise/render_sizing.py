"""Sizing as a short terminal report: each figure with its unit, then what it means."""

from __future__ import annotations

from kvops.advise.sizing import Sizing

GB = 1e9


def sizing_lines(s: Sizing) -> list[str]:
    fit = f"{s.prefixes_fit_in_gpu} of {s.num_prefixes}"
    lines = [
        f"{s.model} on {s.gpu} (tp={s.tensor_parallel_size}, "
        f"gpu_memory_utilization={s.gpu_memory_utilization}), storage {s.storage}",
        f"  KV per token                 {s.kv_bytes_per_token:,} B "
        f"({s.kv_bytes_per_token / 1024:.0f} KiB)",
        f"  GPU KV capacity              {s.gpu_kv_capacity_tokens:,} tokens "
        f"({s.gpu_kv_capacity_tokens * s.kv_bytes_per_token / GB:.1f} GB)",
        f"  one prefix                   {s.prefix_tokens:,} tokens "
        f"({s.prefix_tokens * s.kv_bytes_per_token / GB:.2f} GB)",
        f"  prefixes that fit in GPU     {fit}",
        f"  storage needed (all)         {s.storage_bytes_needed / GB:.1f} GB",
        f"  prefill per prefix           {s.prefill_seconds_per_prefix * 1e3:,.1f} ms",
        f"  load per prefix              {s.load_seconds_per_prefix * 1e3:,.1f} ms "
        f"at {s.storage_read_gb_s:.3g} GB/s read",
        f"  break-even read bandwidth    {s.break_even_read_gb_s:.2f} GB/s",
    ]
    return [*lines, "", *sizing_meaning(s)]


def sizing_meaning(s: Sizing) -> list[str]:
    """Plain-language reading of the numbers (why offload would or would not pay)."""
    out = []
    if s.storage_read_gb_s > s.break_even_read_gb_s:
        out.append(
            f"Loading a stored prefix is {s.load_speedup:.1f}x faster than recomputing it "
            f"({s.storage_read_gb_s:.3g} GB/s read is above the {s.break_even_read_gb_s:.2f} GB/s "
            "break-even)."
        )
    else:
        out.append(
            f"Recomputing a prefix is faster than loading it: {s.storage_read_gb_s:.3g} GB/s read "
            f"is below the {s.break_even_read_gb_s:.2f} GB/s break-even; offload cannot pay."
        )
    if s.overflows_gpu:
        out.append(
            f"The {s.num_prefixes} prefixes overflow GPU memory (only {s.prefixes_fit_in_gpu} fit, "
            "before any request's own tokens): without offload, evicted prefixes are recomputed."
        )
    else:
        out.append(
            f"All {s.num_prefixes} prefixes fit in GPU memory: vLLM's prefix cache keeps them "
            "resident, so offload has little to add unless requests' own tokens crowd them out."
        )
    return out
