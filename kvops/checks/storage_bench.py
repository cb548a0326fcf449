"""gdsio on the GDS directory: real GPU-direct bandwidth, and proof it went through nvidia-fs.

Throughput alone cannot tell GDS from compat mode (POSIX through a bounce buffer can be fast);
nvidia-fs counts only IO it carried, so its read/write counters rising during the run is the
proof (NVIDIA GDS TSG §5.9: compat and P2PDMA IO are not counted).
"""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse.gdsio import GdsioResult, parse_gdsio
from kvops.parse.nvfs_stats import NvfsStats, io_counts, missing_counters, parse_nvfs_stats

GIB_PER_GBIT = 1e9 / 8 / 2**30


def _results(ctx: Context) -> tuple[list[GdsioResult], list[str], list[str]]:
    """Complete result lines; failures (gdsio did not run cleanly); gaps (output cut short:
    what each cut line had and lacks), which are absent evidence, not a verdict."""
    results: list[GdsioResult] = []
    failures: list[str] = []
    gaps: list[str] = []
    for item_id in (ev.GDSIO_WRITE, ev.GDSIO_READ):
        if ctx.item(item_id) is None:
            continue  # not requested; the other run is judged alone
        text = ctx.text(item_id)
        if text is None:
            failures.append(ctx.problem(item_id))
            continue
        parsed = parse_gdsio(text)
        results.extend(parsed.results)
        gaps.extend(f"{item_id}: {partial.describe()}" for partial in parsed.partial)
        if not parsed.results and not parsed.partial:
            gaps.append(f"{item_id}: no result line (IoType ... Throughput): output cut short?")
    return results, failures, gaps


def _incomplete(gaps: list[str]) -> Finding:
    msg = "gdsio output incomplete, not judged: " + "; ".join(gaps)
    remedy = "Rerun with --storage-bench; a cut output usually means the run was interrupted."
    return finding("GDS-050", Severity.WARN, msg, remedy=remedy)


def check_throughput(ctx: Context) -> list[Finding]:
    if ctx.item(ev.GDSIO_WRITE) is None and ctx.item(ev.GDSIO_READ) is None:
        return [finding("GDS-050", Severity.SKIP, "no storage bench (run with --storage-bench)")]
    results, failures, gaps = _results(ctx)
    if failures:
        return [finding("GDS-050", Severity.FAIL, "gdsio failed: " + "; ".join(failures))]
    direct = [r for r in results if r.gpu_direct]
    if not direct and gaps:  # the GPU-direct line may be the one cut short
        return [_incomplete(gaps)]
    return _judge_direct(ctx, results, direct) + ([_incomplete(gaps)] if gaps else [])


def _judge_direct(
    ctx: Context, results: list[GdsioResult], direct: list[GdsioResult]
) -> list[Finding]:
    """GPU-direct results against the RDMA link rate (large IO only)."""
    if not direct:
        kinds = sorted({r.xfer_type for r in results})
        msg = f"no GPU-direct (-x 0) result, only {kinds}"
        return [finding("GDS-050", Severity.FAIL, msg)]
    shown = "\n".join(
        f"{r.io_type} {r.xfer_type} threads={r.threads} {r.throughput_gib_s:.3f} GiB/s"
        for r in direct
    )
    rates = [p.rate_gbit_s for p in ctx.rdma_ports or [] if p.active and p.rate_gbit_s]
    if not rates:
        msg = "link rate unknown (no active RDMA port rate): throughput not judged"
        return [finding("GDS-050", Severity.SKIP, msg, shown)]
    link_gib_s = max(rates) * GIB_PER_GBIT
    share = ctx.thresholds.bench_min_link_share
    min_io_kib = ctx.thresholds.bench_min_io_size_kib
    large = [r for r in direct if r.io_size_kib is not None and r.io_size_kib >= min_io_kib]
    if not large:
        msg = f"no GPU-direct run with IO >= {min_io_kib} KiB: bandwidth not judged"
        return [finding("GDS-050", Severity.SKIP, msg, shown)]
    out = []
    for kind in ("read", "write"):
        runs = [r for r in large if r.is_read == (kind == "read")]
        if not runs:
            continue
        best = max(r.throughput_gib_s for r in runs)
        ratio = best / link_gib_s
        msg = (
            f"{kind} {best:.2f} GiB/s = {ratio:.0%} of the {max(rates):g} Gb/s link "
            f"({link_gib_s:.2f} GiB/s; threshold {share:.0%})"
        )
        severity = Severity.PASS if ratio >= share else Severity.WARN
        out.append(finding("GDS-050", severity, msg, shown))
    return out


def check_counters_rise(ctx: Context) -> list[Finding]:
    before_text = ctx.text(ev.NVFS_STATS_BEFORE_BENCH)
    after_text = ctx.text(ev.NVFS_STATS_AFTER_BENCH)
    if before_text is None or after_text is None:
        if ctx.item(ev.NVFS_STATS_BEFORE_BENCH) is None:
            return [
                finding("GDS-051", Severity.SKIP, "no storage bench (run with --storage-bench)")
            ]
        return [ctx.skip("GDS-051", ev.NVFS_STATS_BEFORE_BENCH, ev.NVFS_STATS_AFTER_BENCH)]
    stats = {"before": parse_nvfs_stats(before_text), "after": parse_nvfs_stats(after_text)}
    before, after = io_counts(stats["before"]), io_counts(stats["after"])
    if before is None or after is None:
        cannot = _counters_cannot_move(ctx)
        if cannot is not None:
            return [cannot]
        return [_counters_missing(stats)]
    reads, writes = after[0] - before[0], after[1] - before[1]
    shown = f"Reads n: {before[0]} -> {after[0]}\nWrites n: {before[1]} -> {after[1]}"
    if reads > 0 and writes > 0:
        return [finding("GDS-051", Severity.PASS, f"+{reads} reads, +{writes} writes", shown)]
    cannot = _counters_cannot_move(ctx, shown)
    if cannot is not None:
        return [cannot]
    msg = f"nvidia-fs saw +{reads} reads, +{writes} writes: IO bypassed GDS (compat mode?)"
    return [finding("GDS-051", Severity.FAIL, msg, shown)]


def _counters_missing(stats: dict[str, NvfsStats]) -> Finding:
    """Stats without their Reads/Writes lines (cut short, or a driver that does not print
    them) cannot show the counters rise: unproven, not a bypass."""
    lacking = "; ".join(
        f"{when} the bench: no {' or '.join(missing_counters(parsed))} line"
        for when, parsed in stats.items()
        if missing_counters(parsed)
    )
    msg = f"nvidia-fs stats incomplete ({lacking}): the counters cannot prove the I/O path"
    remedy = f"Rerun with --storage-bench; check that {STATS_FILE} prints Reads and Writes."
    return finding("GDS-051", Severity.WARN, msg, remedy=remedy)


STATS_FILE = "/proc/driver/nvidia-fs/stats"
STATS_PARAM = "/sys/module/nvidia_fs/parameters/rw_stats_enabled"


def _counters_cannot_move(ctx: Context, shown: str = "") -> Finding | None:
    """A reason the counters stand still that is not a GDS bypass: nvidia-fs counts reads and
    writes only with its `rw_stats_enabled` parameter set, and never counts P2PDMA I/O (NVIDIA
    GDS Troubleshooting Guide, "nvidia-fs statistics"; compat and P2PDMA I/O are not counted).
    Statistics off show in the parameter or in the stats file itself (`IO stats: Disabled`)."""
    disabled = _stats_disabled(ctx)
    if disabled is not None:
        # Writing to the stats file only clears the counters (nvfs_stats_clear in
        # gds-nvidia-fs src/nvfs-stat.c); the module parameter is what turns counting on.
        msg = (
            f"nvidia-fs read/write statistics are disabled ({disabled}), so the counters "
            "cannot move: cannot tell whether the I/O went through GDS, not judged. Enable: "
            f"`echo 1 > {STATS_PARAM}` (root), then rerun with --storage-bench"
        )
        return finding("GDS-051", Severity.SKIP, msg, shown)
    cufile = ctx.cufile
    p2p_keys = ("properties.use_pci_p2pdma", "fs.nfs.use_pci_p2pdma")
    p2p_config = cufile is not None and any(cufile.get(k) is True for k in p2p_keys)
    report = ctx.gdscheck
    direct = report.direct_modes("NFS") if report is not None else []
    if p2p_config or ("p2pdma" in direct and "nvfs" not in direct):
        msg = (
            "cuFile uses PCI P2PDMA for NFS, which nvidia-fs does not count: the counters "
            "cannot prove the path (see GDS-040 and the gdsio throughput, GDS-050)"
        )
        remedy = "To prove it by counters, bench with use_pci_p2pdma false (nvidia-fs path)."
        return finding("GDS-051", Severity.WARN, msg, shown, remedy=remedy)
    return None


def _stats_disabled(ctx: Context) -> str | None:
    """Where the evidence says nvidia-fs I/O statistics are off; None when nothing says so."""
    params = ctx.data(ev.NVFS_PARAMS)
    if params is not None and str(params.get("rw_stats_enabled", "")).strip() == "0":
        return "rw_stats_enabled=0"
    for item_id in (ev.NVFS_STATS_BEFORE_BENCH, ev.NVFS_STATS_AFTER_BENCH):
        text = ctx.text(item_id)
        if text is not None and parse_nvfs_stats(text).io_stats_enabled is False:
            return f"'IO stats: Disabled' in {STATS_FILE}"
    return None


CHECKS = [check_throughput, check_counters_rise]
