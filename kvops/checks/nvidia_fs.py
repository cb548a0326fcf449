"""nvidia-fs: loaded, recent enough, and built with Mellanox PeerDirect."""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.driver import below, nvfs_version
from kvops.checks.model import Finding, Severity, finding


def check_loaded(ctx: Context) -> list[Finding]:
    modules = ctx.modules
    if modules is None:
        return [ctx.skip("GDS-010", ev.MODULES)]
    if "nvidia_fs" in modules:
        lines = [ln for ln in (ctx.text(ev.MODULES) or "").splitlines() if ln.startswith("nvidia")]
        return [finding("GDS-010", Severity.PASS, "nvidia_fs loaded", "\n".join(lines))]
    return [finding("GDS-010", Severity.FAIL, "nvidia_fs is not in /proc/modules")]


def check_version(ctx: Context) -> list[Finding]:
    version = nvfs_version(ctx)
    if version is None:
        stats, report = ctx.nvfs_stats, ctx.gdscheck
        why = "; ".join(
            [
                ctx.problem(ev.NVFS_VERSION)
                if ctx.text(ev.NVFS_VERSION) is None
                else f"{ev.NVFS_VERSION}: no version in it",
                ctx.problem(ev.GDSCHECK)
                if report is None
                else f"{ev.GDSCHECK}: no 'nvidia_fs version' header",
                ctx.problem(ev.NVFS_STATS)
                if stats is None
                else f"{ev.NVFS_STATS}: no 'NVFS Driver(version)' line",
            ]
        )
        return [finding("GDS-011", Severity.SKIP, f"nvidia-fs version unknown: {why}")]
    minimum = ctx.thresholds.min_nvidia_fs_version
    if below(version, minimum):
        return [finding("GDS-011", Severity.FAIL, f"nvidia_fs {version} < minimum {minimum}")]
    return [finding("GDS-011", Severity.PASS, f"nvidia_fs {version} (minimum {minimum})")]


def check_peerdirect(ctx: Context) -> list[Finding]:
    """PeerDirect from nvidia-fs stats (the driver's own view), else gdscheck's line."""
    state: bool | None = None
    excerpt = ""
    stats = ctx.nvfs_stats
    if stats is not None and stats.peerdirect_supported is not None:
        state = stats.peerdirect_supported
        excerpt = f"Mellanox PeerDirect Supported: {state}"
    elif ctx.gdscheck is not None and "Mellanox PeerDirect" in ctx.gdscheck.driver_properties:
        value = ctx.gdscheck.driver_properties["Mellanox PeerDirect"]
        state = value.lower() in {"enabled", "true", "supported"}
        excerpt = f"--Mellanox PeerDirect : {value}"
    if state is None:
        if stats is None and ctx.gdscheck is None:
            return [ctx.skip("GDS-012", ev.NVFS_STATS, ev.GDSCHECK)]
        why = "; ".join(
            [
                ctx.problem(ev.NVFS_STATS)
                if stats is None
                else f"{ev.NVFS_STATS}: no 'Mellanox PeerDirect Supported' line",
                ctx.problem(ev.GDSCHECK)
                if ctx.gdscheck is None
                else f"{ev.GDSCHECK}: no '--Mellanox PeerDirect' line",
            ]
        )
        return [finding("GDS-012", Severity.SKIP, f"PeerDirect state unknown: {why}")]
    if state:
        return [finding("GDS-012", Severity.PASS, "PeerDirect enabled", excerpt)]
    return [finding("GDS-012", Severity.WARN, "PeerDirect disabled in nvidia-fs", excerpt)]


CHECKS = [check_loaded, check_version, check_peerdirect]
