"""Which RDMA device(s) carry the GDS directory's storage traffic, shared by GDS-027 (is that
port up) and GDS-043 (is that NIC near each GPU).

Why a module of its own: GPU hosts often have several RDMA NICs (compute NICs for GPU-to-GPU
traffic, storage NICs for NFS), and only the storage ones move KV-cache blocks between GPU
memory and ONTAP. A judge that looks at "any RDMA NIC" passes a host whose mount is down or
whose storage NIC sits across the CPU from the GPUs. Two sources name the storage NIC:

- Kernel NFS/RDMA picks the NIC itself: the mount's `clientaddr=` is the local address of its
  connection, so clientaddr → net device (ip addr) → RDMA port (sysfs, `ibdev2netdev`).
- With `properties.rdma_dynamic_routing` true, cuFile routes GDS IO through the client
  addresses listed for the mount: `fs.nfs.mount_table.<mount>.rdma_dev_addr_list`, else
  `fs.nfs.rdma_dev_addr_list`, else `properties.rdma_dev_addr_list` (most specific first).
  Without dynamic routing, NFS ignores these lists and kernel NFS/RDMA picks the NIC itself
  (NVIDIA GDS Configuration Guide, `rdma_dynamic_routing`,
  https://docs.nvidia.com/gpudirect-storage/configuration-guide/index.html; Troubleshooting
  Guide §18.13.1), so the mount's NIC is the one that matters.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvops import evidence as ev
from kvops.checks.context import Context, RdmaPort
from kvops.checks.cufile import address_lists, flag
from kvops.checks.rdma_mount import RDMA_PROTOS, gds_mount
from kvops.parse.cufile import CufileConfig
from kvops.parse.mounts import Mount
from kvops.parse.rdma_tools import RdmaLink


@dataclass(frozen=True)
class PortRecord:
    """What one source (sysfs or `ibdev2netdev`) says about the RDMA port on a net device."""

    device: str
    text: str
    up: bool | None  # None: the source did not record a state


def netdevs_holding(addresses: Mapping[str, Sequence[str]], address: str) -> list[str]:
    """Net devices that hold `address` (from `ip addr`), sorted."""
    return sorted(name for name, addrs in addresses.items() if address in addrs)


def port_records(
    ports: Sequence[RdmaPort], links: Sequence[RdmaLink], netdev: str
) -> list[PortRecord]:
    """Records of the RDMA port(s) on `netdev` from sysfs `ports` and ibdev2netdev `links`.
    A VLAN device (`ens1f0.100`) rides its parent's port, so the parent's name counts too."""
    names = {netdev, netdev.split(".", 1)[0]}
    out: list[PortRecord] = []
    for port in ports:
        if names & set(port.netdevs):
            state = port.state or "state not recorded"
            up = port.active if port.state else None
            text = f"{port.device} port {port.port} {state} (sysfs)"
            out.append(PortRecord(port.device, text, up))
    for link in links:
        if link.netdev in names:
            text = f"{link.device} port {link.port} ==> {link.netdev} ({link.state}) (ibdev2netdev)"
            out.append(PortRecord(link.device, text, link.up))
    return out


def ctx_port_records(ctx: Context, netdev: str) -> list[PortRecord]:
    """`port_records` over whatever port sources the evidence has."""
    links = ctx.ibdev2netdev.links if ctx.ibdev2netdev else []
    return port_records(ctx.rdma_ports or [], links, netdev)


def device_netdevs(ctx: Context) -> dict[str, list[str]]:
    """RDMA device → its net devices, by sysfs and ibdev2netdev together (for evidence text)."""
    out: dict[str, set[str]] = {}
    for port in ctx.rdma_ports or []:
        out.setdefault(port.device, set()).update(port.netdevs)
    for link in ctx.ibdev2netdev.links if ctx.ibdev2netdev else []:
        if link.netdev:
            out.setdefault(link.device, set()).add(link.netdev)
    return {device: sorted(names) for device, names in out.items()}


def routed_address_list(config: CufileConfig, mount_point: str | None) -> tuple[str, list[str]]:
    """(key, addresses) of the list cuFile's dynamic routing uses for the mount: its
    mount_table entry, else the fs.nfs list, else the properties list; ("", []) when dynamic
    routing is off or no list is set (then the lists do not choose a NIC for NFS)."""
    if flag(config.get("properties.rdma_dynamic_routing")) is not True:
        return "", []
    lists = {key: addrs for key, addrs in address_lists(config).items() if addrs}
    if mount_point is not None:
        prefix = "fs.nfs.mount_table."
        for key, addrs in lists.items():
            path = key[len(prefix) :] if key.startswith(prefix) else None
            if path and posixpath.normpath(path) == posixpath.normpath(mount_point):
                return key, addrs
    for key in ("fs.nfs.rdma_dev_addr_list", "properties.rdma_dev_addr_list"):
        if key in lists:
            return key, lists[key]
    return "", []


@dataclass
class StorageNics:
    """The storage RDMA devices and how they were found; `devices` empty when unknown, with
    `source` saying why."""

    devices: list[str] = field(default_factory=list)
    source: str = ""


def _rdma_devices(ctx: Context, netdevs: Sequence[str]) -> list[str]:
    found = (r.device for name in netdevs for r in ctx_port_records(ctx, name))
    return sorted(set(found))


def _from_address_list(ctx: Context, mount: Mount | None) -> StorageNics:
    """The NICs of the dynamic-routing address list; no devices when no list applies (source
    empty) or none of its addresses is on an RDMA port (source says so)."""
    config = ctx.cufile
    if config is None or config.error is not None:
        return StorageNics()
    key, addresses = routed_address_list(config, mount.mount_point if mount else None)
    if not key:
        return StorageNics()
    on_host = ctx.interface_addresses or {}
    netdevs = [n for a in addresses for n in netdevs_holding(on_host, a)]
    devices = _rdma_devices(ctx, netdevs)
    if not devices:
        return StorageNics(source=f"no address of {key} is on an RDMA port")
    return StorageNics(devices, f"{key} {addresses} with rdma_dynamic_routing")


def _from_clientaddr(ctx: Context, mount: Mount | None) -> StorageNics:
    if ctx.gds_dir is None:
        return StorageNics(source="settings.gds_dir not set")
    if mount is None:
        return StorageNics(
            source=f"the mount of {ctx.gds_dir} is unknown ({ctx.problem(ev.MOUNTS)})"
        )
    if not mount.is_nfs or mount.proto not in RDMA_PROTOS:
        what = f"NFS over {mount.proto or 'tcp'}" if mount.is_nfs else f"{mount.fs_type}"
        return StorageNics(source=f"{mount.mount_point} is {what}, not NFS/RDMA")
    local = mount.options.get("clientaddr")
    if not local:
        return StorageNics(source="the mount shows no clientaddr=")
    if ctx.interface_addresses is None:
        return StorageNics(source=ctx.problem(ev.IP_ADDR))
    netdevs = netdevs_holding(ctx.interface_addresses, local)
    if not netdevs:
        return StorageNics(source=f"clientaddr {local} is on no interface")
    devices = _rdma_devices(ctx, netdevs)
    if not devices:
        return StorageNics(
            source=f"no RDMA device maps to {'/'.join(netdevs)} (clientaddr {local})"
        )
    return StorageNics(devices, f"the mount's clientaddr {local} on {'/'.join(netdevs)}")


def storage_nics(ctx: Context) -> StorageNics:
    """The RDMA devices that carry the GDS directory's traffic: the dynamic-routing address
    list when cuFile uses one and any of its addresses is on an RDMA port, else the port under
    the mount's clientaddr (the kernel's choice)."""
    mount = gds_mount(ctx) if ctx.gds_dir is not None else None
    routed = _from_address_list(ctx, mount)
    if routed.devices:
        return routed
    out = _from_clientaddr(ctx, mount)
    if routed.source:
        out.source += f"; {routed.source}"
    return out
