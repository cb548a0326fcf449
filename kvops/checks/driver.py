"""NVIDIA driver: present, recent enough, and the open kernel module nvidia-fs needs."""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse._common import version_tuple
from kvops.parse.nvidia_smi import parse_nvidia_proc_version, parse_nvidia_smi_csv


def _driver_version(ctx: Context) -> tuple[str | None, str]:
    """(version, evidence line) from nvidia-smi, else /proc/driver/nvidia/version."""
    smi = ctx.text(ev.NVIDIA_SMI)
    if smi is not None:
        versions = parse_nvidia_smi_csv(smi).driver_versions
        if versions:
            return versions[0], smi
    proc = ctx.text(ev.NVIDIA_DRIVER_VERSION)
    if proc is not None:
        parsed = parse_nvidia_proc_version(proc)
        return parsed.driver_version, parsed.text
    return None, ""


def check_driver_version(ctx: Context) -> list[Finding]:
    if ctx.item(ev.NVIDIA_SMI) is None and ctx.item(ev.NVIDIA_DRIVER_VERSION) is None:
        return [ctx.skip("GDS-001", ev.NVIDIA_SMI, ev.NVIDIA_DRIVER_VERSION)]
    version, excerpt = _driver_version(ctx)
    if version is None:
        reasons = f"{ctx.problem(ev.NVIDIA_SMI)}; {ctx.problem(ev.NVIDIA_DRIVER_VERSION)}"
        return [finding("GDS-001", Severity.FAIL, f"no NVIDIA driver found ({reasons})")]
    minimum = ctx.thresholds.min_driver_version
    have, need = version_tuple(version), version_tuple(minimum)
    if have is not None and need is not None and have < need:
        return [finding("GDS-001", Severity.FAIL, f"driver {version} < minimum {minimum}", excerpt)]
    return [finding("GDS-001", Severity.PASS, f"driver {version} (minimum {minimum})", excerpt)]


def nvfs_version(ctx: Context) -> str | None:
    """The kernel's own `/proc/driver/nvidia-fs/version` ("version: 2.20", major.minor), else
    gdscheck's header, else the stats' `NVFS Driver(version: 2:7:47)`."""
    text = ctx.text(ev.NVFS_VERSION)
    if text and version_tuple(text.split(":")[-1]):
        return text.split(":")[-1].strip()
    gdscheck = ctx.gdscheck
    if gdscheck is not None and gdscheck.nvidia_fs_version:
        return gdscheck.nvidia_fs_version
    stats = ctx.nvfs_stats
    return stats.driver_version if stats is not None else None


def below(version: str | None, minimum: str) -> bool | None:
    """Whether `version` is below `minimum`, compared at the precision `version` has: the
    kernel prints "2.17" for 2.17.x, which is not provably below 2.17.5. None if unparsable."""
    have, need = version_tuple(version), version_tuple(minimum)
    if have is None or need is None:
        return None
    return have < need[: len(have)]


def check_open_kernel_module(ctx: Context) -> list[Finding]:
    proc = ctx.text(ev.NVIDIA_DRIVER_VERSION)
    is_open: bool | None = None
    excerpt = ""
    if proc is not None:
        parsed = parse_nvidia_proc_version(proc)
        is_open, excerpt = parsed.open_kernel_module, parsed.text
    if is_open is None and ctx.gdscheck is not None:
        status = ctx.gdscheck.platform.get("Nvidia Driver Info Status")
        if status:
            is_open, excerpt = "Open Driver" in status, f"Nvidia Driver Info Status: {status}"
    if is_open is None:
        return [ctx.skip("GDS-002", ev.NVIDIA_DRIVER_VERSION, ev.GDSCHECK)]
    if is_open:
        return [finding("GDS-002", Severity.PASS, "open kernel module loaded", excerpt)]
    nvfs = nvfs_version(ctx)
    limit = ctx.thresholds.open_module_required_from_nvfs
    if below(nvfs, limit):
        message = f"proprietary kernel module; nvidia-fs {nvfs} < {limit} still works with it"
        return [finding("GDS-002", Severity.WARN, message, excerpt)]
    message = (
        f"proprietary kernel module loaded; nvidia-fs {nvfs or '(version unknown)'} "
        f"needs the open module from {limit}"
    )
    return [finding("GDS-002", Severity.FAIL, message, excerpt)]


CHECKS = [check_driver_version, check_open_kernel_module]
