"""The RDMA path under the NFS/RDMA mount: the port that carries it is up, and RoCE ports have
v2 GIDs for their addresses.

GDS-026 only asks whether *some* RDMA port is active; a host with one storage port down and a
compute port up passes it while its mount hangs or reconnects over nothing. The mount's
`clientaddr=` names the local address of its connection, so the address → net device → RDMA
port chain (ip addr, sysfs, `ibdev2netdev`; shared with GDS-043 in `storage_nic`) finds the
one port that matters. rdma_cm resolves addresses through the port's GID table (`show_gids`):
an IPv4 address with only a RoCE v1 GID reaches the storage only inside one L2 network.

Same concern as `rdma_mount` (ids GDS-02x); a module of its own to keep both small.
"""

from __future__ import annotations

import ipaddress

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.checks.rdma_mount import RDMA_PROTOS, mount_line, nfs_mount_or_skip
from kvops.checks.storage_nic import ctx_port_records, netdevs_holding


def check_mount_port_up(ctx: Context) -> list[Finding]:
    mount = nfs_mount_or_skip(ctx, "GDS-027")
    if isinstance(mount, Finding):
        return [mount]
    if mount.proto not in RDMA_PROTOS:
        msg = f"NFS over {mount.proto or 'tcp'}: no RDMA port carries it (see GDS-021)"
        return [finding("GDS-027", Severity.SKIP, msg)]
    local = mount.options.get("clientaddr")
    if not local:
        msg = "the mount shows no clientaddr= (NFSv3?): which port carries it is unknown"
        return [finding("GDS-027", Severity.SKIP, msg, mount_line(mount))]
    addresses = ctx.interface_addresses
    if addresses is None:
        return [ctx.skip("GDS-027", ev.IP_ADDR)]
    netdevs = netdevs_holding(addresses, local)
    if not netdevs:
        msg = f"clientaddr {local} is on no interface of this host (removed since the mount?)"
        remedy = "Put the address back on the RDMA interface, or remount so the mount uses one."
        return [finding("GDS-027", Severity.WARN, msg, mount_line(mount), remedy)]
    if ctx.rdma_ports is None and ctx.ibdev2netdev is None:
        return [ctx.skip("GDS-027", ev.INFINIBAND, ev.IBDEV2NETDEV)]
    where = f"{'/'.join(netdevs)} (clientaddr {local})"
    records = [r for name in netdevs for r in ctx_port_records(ctx, name)]
    if not records:
        msg = f"{where} carries the NFS/RDMA mount but no RDMA device maps to it"
        remedy = "Check with `ibdev2netdev` which interface is the RDMA port and mount over it."
        return [finding("GDS-027", Severity.WARN, msg, mount_line(mount), remedy)]
    lines = "\n".join(r.text for r in records)
    down = [r.text for r in records if r.up is False]
    if down:
        msg = f"the RDMA port carrying the NFS/RDMA mount is down: {where}: {down[0]}"
        return [finding("GDS-027", Severity.FAIL, msg, lines)]
    if all(r.up is None for r in records):
        msg = f"{where}: the state of its RDMA port is not recorded"
        return [finding("GDS-027", Severity.SKIP, msg, lines)]
    return [finding("GDS-027", Severity.PASS, f"{where}: its RDMA port is up", lines)]


def _is_ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def check_roce_v2_gids(ctx: Context) -> list[Finding]:
    table = ctx.show_gids
    if table is None:
        return [ctx.skip("GDS-028", ev.SHOW_GIDS)]
    infiniband = {p.device for p in ctx.rdma_ports or [] if p.link_layer.lower() == "infiniband"}
    addresses = ctx.interface_addresses or {}
    lines: list[str] = []
    missing: list[str] = []
    for device, port in table.ports():
        if device in infiniband:
            continue  # no RoCE on an InfiniBand port
        rows = table.rows(device, port)
        netdevs = sorted({r.netdev for r in rows if r.netdev})
        ipv4 = {r.ipv4 for r in rows if r.ipv4}
        ipv4 |= {a for name in netdevs for a in addresses.get(name, []) if _is_ipv4(a)}
        v2 = {r.ipv4: r.index for r in rows if r.ipv4 and r.version == "v2"}
        for address in sorted(ipv4):
            where = f"{device} port {port} {','.join(netdevs) or '-'} {address}"
            if address in v2:
                lines.append(f"{where}: RoCE v2 GID index {v2[address]}")
            else:
                lines.append(f"{where}: no RoCE v2 GID")
                missing.append(f"{address} ({device} port {port})")
    note = f" (show_gids output incomplete: {'; '.join(table.warnings)})" if table.warnings else ""
    if not lines:
        msg = f"show_gids lists no IPv4 address on a RoCE port: nothing to judge{note}"
        return [finding("GDS-028", Severity.SKIP, msg)]
    if missing:
        msg = (
            f"no RoCE v2 GID for {', '.join(missing)}: rdma_cm reaches the storage from it only "
            f"over RoCE v1, which does not cross an IP router (NFS/RDMA on routed networks "
            f"needs RoCE v2){note}"
        )
        return [finding("GDS-028", Severity.WARN, msg, "\n".join(lines))]
    msg = f"a RoCE v2 GID for each of {len(lines)} IPv4 address(es) on RoCE ports"
    return [finding("GDS-028", Severity.PASS, msg, "\n".join(lines))]


CHECKS = [check_mount_port_up, check_roce_v2_gids]
