"""Platform evidence: OS, kernel, GPU driver and PCIe topology, modules, nvidia-fs, RDMA ports
and GID tables, addresses, mounts, IOMMU.

Each function records raw text (or a structured summary of sysfs trees) under the item ids of
`kvops.evidence`; judging what it means is the checks' job, on the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Dict, List

from .core import KIND_COMMAND, KIND_SYSFS, Probe, read_text

NVIDIA_SMI_QUERY = "--query-gpu=index,name,driver_version,persistence_mode,pci.bus_id,memory.total"


def collect_platform(p: Probe) -> None:
    p.file("os_release", "/etc/os-release")
    p.command("uname", ["uname", "-srm"])
    p.command("nvidia_smi", ["nvidia-smi", NVIDIA_SMI_QUERY, "--format=csv"])
    p.file("nvidia_driver_version", "/proc/driver/nvidia/version")
    p.file("modules", "/proc/modules")
    p.file("nvfs_version", "/proc/driver/nvidia-fs/version")
    p.file("nvfs_stats", "/proc/driver/nvidia-fs/stats")
    nvfs_params(p)
    infiniband(p)
    # MLNX/DOCA-OFED tools: which net device each RDMA port carries (and its state), and the
    # GID table with RoCE versions. A host without them records exit 127, like any tool.
    p.command("ibdev2netdev", ["ibdev2netdev"])
    p.command("show_gids", ["show_gids"])
    ip_addr(p)
    p.file("mounts", "/proc/mounts")
    p.file("mountstats", "/proc/self/mountstats")  # pNFS layout in use (validate --ontap)
    p.file("cmdline", "/proc/cmdline")
    iommu(p)
    pci_acs(p)
    nvidia_topo(p)  # last: slower than the reads above (seconds on a large box)


def nvidia_topo(p: Probe) -> None:
    """`nvidia-smi topo -mp`, unless the query above timed out: a hung driver would hang this
    one too and spend the budget the rest of the evidence needs."""
    argv = ["nvidia-smi", "topo", "-mp"]
    smi = p.items.get("nvidia_smi") or {}
    if smi.get("exit_code") is None and str(smi.get("error") or "").startswith("timed out"):
        p.items["nvidia_smi_topo"] = {
            "kind": KIND_COMMAND,
            "source": argv,
            "error": "skipped: nvidia-smi timed out on the GPU query (item nvidia_smi)",
            "duration_s": 0.0,
        }
        return
    p.command("nvidia_smi_topo", argv)


def nvfs_params(p: Probe) -> None:
    start = time.monotonic()
    root = p.path("/sys/module/nvidia_fs/parameters")
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        p.structured("nvfs_params", KIND_SYSFS, root, None, "ENOENT %s: %s" % (root, exc), start)
        return
    data: Dict[str, Any] = {}
    for name in names:
        data[name] = read_text(os.path.join(root, name))
    p.structured("nvfs_params", KIND_SYSFS, root, data, None, start)


def _netdevs(dev_dir: str, port_dir: str) -> List[str]:
    """Net devices of an RDMA port: device/net/* and, for RoCE, the GID table's ndevs."""
    found: List[str] = []
    with contextlib.suppress(OSError):
        found += sorted(os.listdir(os.path.join(dev_dir, "device", "net")))
    ndevs = os.path.join(port_dir, "gid_attrs", "ndevs")
    try:
        for entry in sorted(os.listdir(ndevs), key=lambda s: int(s) if s.isdigit() else 0)[:8]:
            name = read_text(os.path.join(ndevs, entry))
            if name and name not in found:
                found.append(name)
    except OSError:
        pass
    return found


def infiniband(p: Probe) -> None:
    start = time.monotonic()
    root = p.path("/sys/class/infiniband")
    if p.out_of_time("infiniband", KIND_SYSFS, root):
        return
    devices: List[Dict[str, Any]] = []
    error = None
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []  # no RDMA stack loaded: an empty list is the evidence
    except OSError as exc:
        names, error = [], "cannot list %s: %s" % (root, exc)
    for name in names:
        dev_dir = os.path.join(root, name)
        ports: List[Dict[str, Any]] = []
        try:
            port_names = sorted(os.listdir(os.path.join(dev_dir, "ports")), key=_int_or_zero)
        except OSError:
            port_names = []
        for port in port_names:
            port_dir = os.path.join(dev_dir, "ports", port)
            ports.append(
                {
                    "port": _int_or_zero(port),
                    "state": read_text(os.path.join(port_dir, "state")),
                    "phys_state": read_text(os.path.join(port_dir, "phys_state")),
                    "rate": read_text(os.path.join(port_dir, "rate")),
                    "link_layer": read_text(os.path.join(port_dir, "link_layer")),
                    "netdevs": _netdevs(dev_dir, port_dir),
                }
            )
        devices.append({"name": name, "ports": ports})
    p.structured("infiniband", KIND_SYSFS, root, {"devices": devices}, error, start)


def _int_or_zero(text: str) -> int:
    return int(text) if text.isdigit() else 0


def ip_addr(p: Probe) -> None:
    """`ip -j addr show`, falling back to `ip -o addr show` on iproute2 without JSON."""
    item = p.command("ip_addr", ["ip", "-j", "addr", "show"])
    code = item.get("exit_code")
    if code == 127 or code is None:
        return  # no `ip` at all, or it timed out: a retry would only spend more budget
    if code == 0:
        try:
            json.loads(item.get("stdout") or "")
            return
        except ValueError:
            pass
    p.command("ip_addr", ["ip", "-o", "addr", "show"])


def iommu(p: Probe) -> None:
    start = time.monotonic()
    root = p.path("/sys/kernel/iommu_groups")
    if p.out_of_time("iommu", KIND_SYSFS, root):
        return
    types: Dict[str, int] = {}
    try:
        groups = [n for n in os.listdir(root) if n.isdigit()]
        error = None
    except FileNotFoundError:
        groups, error = [], None  # no iommu_groups directory: IOMMU off or not exposed
    except OSError as exc:
        groups, error = [], "cannot list %s: %s" % (root, exc)
    for group in groups:
        # the group's default domain: identity = pass-through, DMA/DMA-FQ = translated
        # (https://docs.kernel.org/admin-guide/abi-testing.html, /sys/kernel/iommu_groups/)
        kind = read_text(os.path.join(root, group, "type"))
        if kind:
            types[kind] = types.get(kind, 0) + 1
    data: Dict[str, Any] = {"group_count": len(groups)}
    if types:
        data["types"] = types
    p.structured("iommu", KIND_SYSFS, root, data, error, start)


ACS_LINE_MARKERS = ("ACSCap:", "ACSCtl:", "<access denied>")


def pci_acs(p: Probe) -> None:
    """`lspci -vvv`, kept to device headers and ACS lines: whether PCIe bridges redirect
    peer-to-peer requests up to the root complex (ACS ReqRedir/CmpltRedir), which defeats
    GPU↔NIC P2P under one switch (NVIDIA GDS Troubleshooting Guide, "PCIe ACS")."""
    item = p.command("pci_acs", ["lspci", "-vvv"])
    text = item.get("stdout") or ""
    if text:
        kept = [
            ln
            for ln in text.splitlines()
            if (ln and not ln[0].isspace()) or any(m in ln for m in ACS_LINE_MARKERS)
        ]
        item["stdout"] = "\n".join(kept) + "\n"
        item["filtered"] = "device headers and ACS lines of lspci -vvv"
