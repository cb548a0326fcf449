"""`gdscheck -p` verdicts, IOMMU and GPU↔NIC PCIe placement: can cuFile do real GDS to NFS on
this platform, and at full speed."""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse.topo import PCIE_LINK_RANK, link_rank


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


def check_iommu(ctx: Context) -> list[Finding]:
    cmdline = ctx.text(ev.CMDLINE)
    tokens = set((cmdline or "").split())
    if "iommu=pt" in tokens or "iommu.passthrough=1" in tokens:
        return [finding("GDS-042", Severity.PASS, "IOMMU in pass-through mode", cmdline or "")]
    if tokens & {"intel_iommu=off", "amd_iommu=off", "iommu=off"}:
        return [
            finding("GDS-042", Severity.PASS, "IOMMU off on the kernel command line", cmdline or "")
        ]
    if tokens & {"intel_iommu=on", "amd_iommu=on", "amd_iommu=force_isolation"}:
        msg = "IOMMU enabled on the kernel command line without iommu=pt"
        return [finding("GDS-042", Severity.FAIL, msg, cmdline or "")]
    groups = ctx.data(ev.IOMMU)
    if groups is not None and isinstance(groups.get("group_count"), int):
        count = groups["group_count"]
        if count > 0:
            msg = f"{count} IOMMU groups present and no iommu=pt: DMA is translated"
            return [finding("GDS-042", Severity.FAIL, msg, cmdline or "")]
        return [finding("GDS-042", Severity.PASS, "no IOMMU groups: IOMMU off", cmdline or "")]
    if ctx.gdscheck is not None and "IOMMU" in ctx.gdscheck.platform:
        state = ctx.gdscheck.platform["IOMMU"]
        excerpt = f"IOMMU: {state}"
        if state.lower().startswith("disabled"):
            return [finding("GDS-042", Severity.PASS, "gdscheck: IOMMU disabled", excerpt)]
        return [finding("GDS-042", Severity.FAIL, f"gdscheck: IOMMU {state}", excerpt)]
    return [ctx.skip("GDS-042", ev.CMDLINE, ev.IOMMU, ev.GDSCHECK)]


# What the GPU↔NIC DMA crosses, by `nvidia-smi topo` link type (worse than PXB only).
_CROSSES = {
    "PHB": "crosses a PCIe host bridge (the CPU)",
    "NODE": "crosses the interconnect between PCIe host bridges of a NUMA node",
    "SYS": "crosses the CPU interconnect between NUMA nodes (QPI/UPI), the slowest path for "
    "peer-to-peer DMA",
    "SOC": "crosses the CPU interconnect between sockets, the slowest path for peer-to-peer DMA",
}


def check_gpu_nic_affinity(ctx: Context) -> list[Finding]:
    """Per GPU, its best PCIe link to an RDMA NIC that is not down; the worst GPU decides."""
    topo = ctx.topo
    if topo is None:
        return [ctx.skip("GDS-043", ev.NVIDIA_SMI_TOPO)]
    notes = f" ({'; '.join(topo.warnings)})" if topo.warnings else ""
    if not topo.gpus or not topo.nics:
        what = "no GPU" if not topo.gpus else "no NIC (see GDS-026)"
        return [finding("GDS-043", Severity.SKIP, f"nvidia-smi topo -mp shows {what}{notes}")]
    down = ctx.down_rdma_devices
    nics = [n for n in topo.nics if topo.nic_name(n) not in down] or topo.nics
    best: list[tuple[int, str, str, str]] = []  # (rank, GPU, NIC name, link type)
    lines: list[str] = []
    excluded = [topo.nic_name(n) for n in topo.nics if n not in nics]
    if excluded:  # first, so a long GPU list cannot push it out of the excerpt
        lines.append(f"not counted (port down): {', '.join(excluded)}")
    for gpu in topo.gpus:
        ranked = sorted(
            (rank, topo.nic_name(nic), nic, label)
            for nic in nics
            if (rank := link_rank(label := topo.link(gpu, nic) or "")) is not None
        )
        if ranked:
            rank, name, nic, label = ranked[0]
            best.append((rank, gpu, name, label))
            lines.append(f"{gpu} -> {name}{f' ({nic})' if nic != name else ''}: {label}")
        else:
            lines.append(f"{gpu}: no PCIe link type to any NIC")
    if not best:
        return [finding("GDS-043", Severity.SKIP, f"no GPU-NIC PCIe link types{notes}")]
    worst = max(rank for rank, *_ in best)
    if worst <= PCIE_LINK_RANK["PXB"]:
        pairs = ", ".join(f"{gpu}->{name} {label}" for _, gpu, name, label in best)
        msg = f"each GPU shares a PCIe switch with an RDMA NIC: {pairs}"
        return [finding("GDS-043", Severity.PASS, msg, "\n".join(lines))]
    at_worst = [(gpu, name, label) for rank, gpu, name, label in best if rank == worst]
    label = at_worst[0][2]
    pairs = ", ".join(f"{gpu}->{name}" for gpu, name, _ in at_worst)
    msg = (
        f"nearest RDMA NIC is {label} for {pairs}: GPU<->NIC DMA {_CROSSES[label]}, so GDS "
        f"throughput drops; NVIDIA's GDS guidance is GPU and NIC under one PCIe switch"
    )
    return [finding("GDS-043", Severity.WARN, msg, "\n".join(lines))]


CHECKS = [check_nfs_mode, check_platform_verification, check_iommu, check_gpu_nic_affinity]
