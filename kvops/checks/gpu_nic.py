"""GDS-043: is each GPU under the same PCIe switch as the RDMA NIC that carries its storage
traffic (`nvidia-smi topo -mp`)?

GDS moves KV blocks by peer-to-peer DMA between the storage NIC and GPU memory; through a host
bridge (PHB), between host bridges (NODE) or across the CPU interconnect (SYS) the transfer
goes through the CPU complex and throughput drops. What matters is the NIC that carries the
NFS/RDMA mount (or, with cuFile dynamic routing, the NICs of its address list; see
`storage_nic`): a GPU next to a compute NIC gains nothing when its KV blocks travel through a
NIC across the CPU. When the storage NIC cannot be named, the nearest live RDMA NIC is judged
instead and the finding says so.

Same concern as `gds_platform` (ids GDS-04x); a module of its own to keep both small.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.checks.storage_nic import device_netdevs, storage_nics
from kvops.parse.topo import PCIE_LINK_RANK, TopoMatrix, link_rank

# What the GPU↔NIC DMA crosses, by `nvidia-smi topo` link type (worse than PXB only).
_CROSSES = {
    "PHB": "crosses a PCIe host bridge (the CPU)",
    "NODE": "crosses the interconnect between PCIe host bridges of a NUMA node",
    "SYS": "crosses the CPU interconnect between NUMA nodes (QPI/UPI), the slowest path for "
    "peer-to-peer DMA",
    "SOC": "crosses the CPU interconnect between sockets, the slowest path for peer-to-peer DMA",
}
_FALLBACK = "storage NIC unknown: judged against the nearest RDMA NIC"
_REMEDY_NEARER = (
    "Carry the storage traffic over the RDMA NIC under each GPU's PCIe switch: put it on the "
    "storage network and mount through it (its address becomes the mount's clientaddr), or set "
    "properties.rdma_dynamic_routing true and list its address in the mount's "
    "rdma_dev_addr_list; else move the storage NIC to a slot behind the GPUs' switch."
)


@dataclass(frozen=True, order=True)
class Link:
    """A GPU's best PCIe link among some NICs (ordered best first, then by column)."""

    rank: int  # PCIE_LINK_RANK: 0 (PIX) .. 4 (SYS)
    nic: str  # topo column (NIC3, or mlx5_3 on older drivers)
    label: str  # link type: PIX, PXB, PHB, NODE, SYS


def nearest(topo: TopoMatrix, gpu: str, nics: list[str]) -> Link | None:
    """The GPU's best PCIe link among `nics`; None when no pair has a PCIe link type."""
    ranked = sorted(
        Link(rank, nic, label)
        for nic in nics
        if (rank := link_rank(label := topo.link(gpu, nic) or "")) is not None
    )
    return ranked[0] if ranked else None


@dataclass
class Judged:
    """What GDS-043 compares: the NICs judged and, per GPU, the nearest of them."""

    storage: bool  # judged NICs are the storage NICs (False: storage NIC unknown)
    about: str  # how the storage NICs were found, or why they are unknown
    lines: list[str]  # evidence
    best: dict[str, Link]  # GPU → its nearest judged NIC
    nearer: dict[str, Link]  # GPU → a closer NIC that carries no storage traffic


def _storage_columns(ctx: Context, topo: TopoMatrix) -> tuple[list[str], str]:
    """(topo columns of the storage NIC(s), how found); no columns and the reason when the
    storage NIC cannot be named or is not in the matrix."""
    found = storage_nics(ctx)
    if not found.devices:
        return [], found.source
    columns = [n for n in topo.nics if topo.nic_name(n) in found.devices]
    if not columns:
        return [], f"{', '.join(found.devices)} not a NIC in nvidia-smi topo -mp"
    return columns, found.source


def _judge(ctx: Context, topo: TopoMatrix) -> Judged:
    down = ctx.down_rdma_devices
    live = [n for n in topo.nics if topo.nic_name(n) not in down] or topo.nics
    storage, about = _storage_columns(ctx, topo)
    judged = ([n for n in storage if n in live] or storage) if storage else live
    netdevs = device_netdevs(ctx)

    def named(nic: str) -> str:
        name = topo.nic_name(nic)
        where = ([nic] if nic != name else []) + netdevs.get(name, [])
        return f"{name} ({', '.join(where)})" if where else name

    # Header and exclusions first, so a long GPU list cannot push them out of the excerpt.
    if storage:
        lines = [f"storage NIC: {', '.join(named(n) for n in storage)} (from {about})"]
    else:
        lines = [f"storage NIC unknown ({about}): every live RDMA NIC counted"]
    excluded = [topo.nic_name(n) for n in (storage or topo.nics) if n not in judged]
    if excluded:
        lines.append(f"not counted (port down): {', '.join(excluded)}")
    out = Judged(bool(storage), about, lines, {}, {})
    others = [n for n in live if n not in storage]
    for gpu in topo.gpus:
        hit = nearest(topo, gpu, judged)
        if hit is None:
            lines.append(f"{gpu}: no PCIe link type to any {'storage ' if storage else ''}NIC")
            continue
        out.best[gpu] = hit
        line = f"{gpu} -> {named(hit.nic)}: {hit.label}{', storage NIC' if storage else ''}"
        other = nearest(topo, gpu, others) if storage else None
        if other is not None and other.rank < hit.rank:
            out.nearer[gpu] = other
            line += f"; nearer {named(other.nic)}: {other.label}, not a storage NIC"
        lines.append(line)
    return out


def check_gpu_nic_affinity(ctx: Context) -> list[Finding]:
    """Per GPU, its best PCIe link to a storage RDMA NIC (any RDMA NIC not down when the storage
    NIC is unknown); the worst GPU decides: PIX/PXB PASS, PHB/NODE/SYS WARN."""
    topo = ctx.topo
    if topo is None:
        return [ctx.skip("GDS-043", ev.NVIDIA_SMI_TOPO)]
    notes = f" ({'; '.join(topo.warnings)})" if topo.warnings else ""
    if not topo.gpus or not topo.nics:
        what = "no GPU" if not topo.gpus else "no NIC (see GDS-026)"
        return [finding("GDS-043", Severity.SKIP, f"nvidia-smi topo -mp shows {what}{notes}")]
    j = _judge(ctx, topo)
    if not j.best:
        return [finding("GDS-043", Severity.SKIP, f"no GPU-NIC PCIe link types{notes}")]
    evidence = "\n".join(j.lines)
    fallback = "" if j.storage else f"; {_FALLBACK} ({j.about})"
    worst = max(link.rank for link in j.best.values())
    if worst <= PCIE_LINK_RANK["PXB"]:
        pairs = ", ".join(f"{g}->{topo.nic_name(k.nic)} {k.label}" for g, k in j.best.items())
        if j.storage:
            msg = f"each GPU shares a PCIe switch with a storage RDMA NIC ({j.about}): {pairs}"
        else:
            msg = f"each GPU shares a PCIe switch with an RDMA NIC: {pairs}{fallback}"
        return [finding("GDS-043", Severity.PASS, msg, evidence)]
    at_worst = [g for g, k in j.best.items() if k.rank == worst]
    label = j.best[at_worst[0]].label
    pairs = ", ".join(f"{g}->{topo.nic_name(j.best[g].nic)}" for g in at_worst)
    which = f"storage RDMA NIC ({j.about})" if j.storage else "nearest RDMA NIC"
    msg = (
        f"{which} is {label} for {pairs}: GPU<->NIC DMA {_CROSSES[label]}, so GDS "
        f"throughput drops; NVIDIA's GDS guidance is GPU and NIC under one PCIe switch"
    )
    nearer = [(g, j.nearer[g]) for g in at_worst if g in j.nearer]
    closer = [f"{g}->{topo.nic_name(k.nic)} {k.label}" for g, k in nearer]
    if closer:
        msg += f"; nearer NICs carry no storage traffic: {', '.join(closer)}"
    remedy = _REMEDY_NEARER if closer else None
    return [finding("GDS-043", Severity.WARN, msg + fallback, evidence, remedy)]


CHECKS = [check_gpu_nic_affinity]
