"""`gdscheck -p` verdicts and IOMMU: can cuFile do real GDS to NFS on this platform, and at full
speed. GPU↔storage-NIC PCIe placement (GDS-043), the same concern, lives in `gpu_nic`."""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse.pci_acs import parse_acs


def check_nfs_mode(ctx: Context) -> list[Finding]:
    report = ctx.gdscheck
    if report is None:
        item = ctx.item(ev.GDSCHECK)
        if item is None:
            return [ctx.skip("GDS-040", ev.GDSCHECK)]
        return [
            finding(
                "GDS-040",
                Severity.WARN,
                f"cannot prove the GDS path: {ctx.problem(ev.GDSCHECK)}",
                remedy="Install gds-tools-X-Y so /usr/local/cuda/gds/tools/gdscheck exists.",
            )
        ]
    modes = report.modes("NFS")
    excerpt = f"NFS : {', '.join(modes or [])}"
    if modes is None:
        if not report.drivers:  # no DRIVER CONFIGURATION at all: cut short, not a verdict
            msg = "gdscheck -p output has no DRIVER CONFIGURATION (truncated?): " + "; ".join(
                report.warnings
            )
            return [finding("GDS-040", Severity.WARN, msg)]
        return [finding("GDS-040", Severity.FAIL, "gdscheck -p lists no NFS line")]
    direct = report.direct_modes("NFS")
    if direct:
        return [finding("GDS-040", Severity.PASS, f"NFS via {', '.join(direct)}", excerpt)]
    if "compat" in modes:
        msg = "NFS only in compat mode: cuFile would use POSIX IO (no GDS)"
        return [finding("GDS-040", Severity.FAIL, msg, excerpt)]
    return [finding("GDS-040", Severity.FAIL, "NFS unsupported by GDS on this host", excerpt)]


def check_platform_verification(ctx: Context) -> list[Finding]:
    report = ctx.gdscheck
    if report is None:
        return [ctx.skip("GDS-041", ev.GDSCHECK)]
    line = report.platform.get("verification", "")
    if report.platform_verification is True:
        return [finding("GDS-041", Severity.PASS, "platform verification succeeded", line)]
    if report.platform_verification is False:
        return [finding("GDS-041", Severity.FAIL, "platform verification failed", line)]
    return [finding("GDS-041", Severity.WARN, "no verification line (truncated output?)")]


TRANSLATED = ("DMA", "DMA-FQ")
DOMAIN_TYPE_HINT = "check /sys/kernel/iommu_groups/*/type (identity = pass-through)"


def _iommu_from_domain_types(ctx: Context, cmdline: str) -> Finding | None:
    """Decisive when the probe read each group's default domain: the kernel may default to
    pass-through (CONFIG_IOMMU_DEFAULT_PASSTHROUGH) whatever the command line says."""
    groups = ctx.data(ev.IOMMU)
    types = groups.get("types") if groups else None
    if not isinstance(types, dict) or not types:
        return None
    counts = {str(k): v for k, v in types.items() if isinstance(v, int)}
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    translated = sum(v for k, v in counts.items() if k in TRANSLATED)
    if translated:
        msg = f"{translated} IOMMU groups translate DMA (default domain {shown})"
        return finding("GDS-042", Severity.FAIL, msg, cmdline)
    return finding("GDS-042", Severity.PASS, f"IOMMU pass-through (domains {shown})", cmdline)


def check_iommu(ctx: Context) -> list[Finding]:
    cmdline = ctx.text(ev.CMDLINE)
    tokens = set((cmdline or "").split())
    decided = _iommu_from_domain_types(ctx, cmdline or "")
    if decided is not None:
        return [decided]
    if "iommu=pt" in tokens or "iommu.passthrough=1" in tokens:
        return [finding("GDS-042", Severity.PASS, "IOMMU in pass-through mode", cmdline or "")]
    if tokens & {"intel_iommu=off", "amd_iommu=off", "iommu=off"}:
        return [
            finding("GDS-042", Severity.PASS, "IOMMU off on the kernel command line", cmdline or "")
        ]
    if "iommu.passthrough=0" in tokens or "amd_iommu=force_isolation" in tokens:
        msg = "IOMMU forced to translate DMA on the kernel command line"
        return [finding("GDS-042", Severity.FAIL, msg, cmdline or "")]
    if tokens & {"intel_iommu=on", "amd_iommu=on"}:
        msg = (
            "IOMMU enabled without iommu=pt; pass-through unless the kernel defaults to "
            f"translation: {DOMAIN_TYPE_HINT}"
        )
        return [finding("GDS-042", Severity.WARN, msg, cmdline or "")]
    groups = ctx.data(ev.IOMMU)
    if groups is not None and isinstance(groups.get("group_count"), int):
        count = groups["group_count"]
        if count > 0:
            msg = (
                f"{count} IOMMU groups and no iommu=pt; the kernel's default domain type was "
                f"not recorded: {DOMAIN_TYPE_HINT}"
            )
            return [finding("GDS-042", Severity.WARN, msg, cmdline or "")]
        return [finding("GDS-042", Severity.PASS, "no IOMMU groups: IOMMU off", cmdline or "")]
    if ctx.gdscheck is not None and "IOMMU" in ctx.gdscheck.platform:
        state = ctx.gdscheck.platform["IOMMU"]
        excerpt = f"IOMMU: {state}"
        if state.lower().startswith("disabled"):
            return [finding("GDS-042", Severity.PASS, "gdscheck: IOMMU disabled", excerpt)]
        return [finding("GDS-042", Severity.FAIL, f"gdscheck: IOMMU {state}", excerpt)]
    return [ctx.skip("GDS-042", ev.CMDLINE, ev.IOMMU, ev.GDSCHECK)]


def check_acs(ctx: Context) -> list[Finding]:
    text = ctx.text(ev.PCI_ACS)
    if text is None:
        return [ctx.skip("GDS-044", ev.PCI_ACS)]
    report = parse_acs(text)
    redirecting = report.redirecting
    if redirecting:
        shown = "\n".join(f"{d.address} {d.name}: {'+, '.join(d.redirects)}+" for d in redirecting)
        msg = f"ACS redirect on {len(redirecting)} PCIe ports: P2P DMA goes via the root complex"
        return [finding("GDS-044", Severity.WARN, msg, shown)]
    if not report.devices and report.access_denied:
        msg = "lspci could not read PCIe capabilities (<access denied>): probe as root"
        return [finding("GDS-044", Severity.SKIP, msg)]
    msg = f"no ACS redirect ({len(report.devices)} of {report.device_count} devices report ACS)"
    return [finding("GDS-044", Severity.PASS, msg)]


CHECKS = [check_nfs_mode, check_platform_verification, check_iommu, check_acs]
