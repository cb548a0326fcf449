"""The GDS directory must sit on an NFS mount that really runs over RDMA.

A mount that fell back to TCP works, is slower, and nvidia-fs cannot DMA into GPU memory
over it: everything looks fine except the numbers. These checks read /proc/mounts, not fstab,
because what counts is what the kernel mounted.
"""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse.mounts import Mount

RDMA_PROTOS = frozenset({"rdma", "rdma6"})


def gds_mount(ctx: Context) -> Mount | None:
    table = ctx.mounts
    if table is None or ctx.gds_dir is None:
        return None
    return table.mount_for(ctx.real_path(ctx.gds_dir))


def mount_line(mount: Mount) -> str:
    opts = ",".join(k if v is None else f"{k}={v}" for k, v in mount.options.items())
    return f"{mount.device} {mount.mount_point} {mount.fs_type} {opts}"


def nfs_mount_or_skip(ctx: Context, check_id: str) -> Mount | Finding:
    if ctx.gds_dir is None:
        return finding(check_id, Severity.SKIP, "settings.gds_dir not set: no GDS directory")
    mount = gds_mount(ctx)
    if mount is None:
        return ctx.skip(check_id, ev.MOUNTS)
    if not mount.is_nfs:
        return finding(check_id, Severity.SKIP, f"{ctx.gds_dir} is not on NFS (see GDS-020)")
    return mount


def check_on_nfs(ctx: Context) -> list[Finding]:
    if ctx.gds_dir is None:
        return [finding("GDS-020", Severity.SKIP, "settings.gds_dir not set: no GDS directory")]
    mount = gds_mount(ctx)
    if mount is None:
        return [ctx.skip("GDS-020", ev.MOUNTS)]
    where = f"{ctx.gds_dir} is on {mount.mount_point} ({mount.fs_type} from {mount.device})"
    if mount.is_nfs:
        return [finding("GDS-020", Severity.PASS, where, mount_line(mount))]
    return [finding("GDS-020", Severity.FAIL, where + ", not NFS", mount_line(mount))]


def check_proto_rdma(ctx: Context) -> list[Finding]:
    mount = nfs_mount_or_skip(ctx, "GDS-021")
    if isinstance(mount, Finding):
        return [mount]
    proto = mount.proto
    if proto in RDMA_PROTOS:
        return [finding("GDS-021", Severity.PASS, f"proto={proto}", mount_line(mount))]
    msg = f"NFS over {proto or 'tcp (no proto option)'}, not RDMA: GDS cannot DMA to the GPU"
    return [finding("GDS-021", Severity.FAIL, msg, mount_line(mount))]


def check_nfs_version(ctx: Context) -> list[Finding]:
    mount = nfs_mount_or_skip(ctx, "GDS-022")
    if isinstance(mount, Finding):
        return [mount]
    version = mount.nfs_version
    allowed = ctx.thresholds.nfs_versions_over_rdma
    if version in allowed:
        return [finding("GDS-022", Severity.PASS, f"NFS vers={version}", mount_line(mount))]
    msg = f"NFS vers={version or 'unknown'}; ONTAP serves RDMA for {', '.join(allowed)}"
    return [finding("GDS-022", Severity.WARN, msg, mount_line(mount))]


def check_hard(ctx: Context) -> list[Finding]:
    mount = nfs_mount_or_skip(ctx, "GDS-023")
    if isinstance(mount, Finding):
        return [mount]
    if mount.hard:
        return [finding("GDS-023", Severity.PASS, "hard mount", mount_line(mount))]
    msg = "soft mount: IO errors on timeouts"
    return [finding("GDS-023", Severity.WARN, msg, mount_line(mount))]


def check_rw_size(ctx: Context) -> list[Finding]:
    mount = nfs_mount_or_skip(ctx, "GDS-024")
    if isinstance(mount, Finding):
        return [mount]
    minimum = ctx.thresholds.min_nfs_rw_size_bytes
    sizes = {name: mount.size_bytes(name) for name in ("rsize", "wsize")}
    small = {k: v for k, v in sizes.items() if v is not None and v < minimum}
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    if small:
        return [finding("GDS-024", Severity.WARN, f"{shown} below {minimum}", mount_line(mount))]
    if None in sizes.values():
        return [finding("GDS-024", Severity.WARN, f"{shown}: not shown by the kernel")]
    return [finding("GDS-024", Severity.PASS, f"{shown} (minimum {minimum})")]


def check_rpcrdma(ctx: Context) -> list[Finding]:
    modules = ctx.modules
    if modules is None:
        return [ctx.skip("GDS-025", ev.MODULES)]
    loaded = sorted(modules & {"rpcrdma", "xprtrdma"})
    if loaded:
        return [finding("GDS-025", Severity.PASS, f"{', '.join(loaded)} loaded")]
    return [finding("GDS-025", Severity.FAIL, "neither rpcrdma nor xprtrdma in /proc/modules")]


def check_rdma_port(ctx: Context) -> list[Finding]:
    ports = ctx.rdma_ports
    if ports is None:
        return [_rdma_port_from_ibdev2netdev(ctx)]
    lines = "\n".join(
        f"{p.device} port {p.port} {p.state} {p.rate_gbit_s} Gb/s {','.join(p.netdevs)}"
        for p in ports
    )
    active = [p for p in ports if p.active]
    if not ports:
        return [finding("GDS-026", Severity.FAIL, "no RDMA device in /sys/class/infiniband")]
    if not active:
        return [finding("GDS-026", Severity.FAIL, "no RDMA port is ACTIVE", lines)]
    return [finding("GDS-026", Severity.PASS, f"{len(active)}/{len(ports)} ports active", lines)]


def _rdma_port_from_ibdev2netdev(ctx: Context) -> Finding:
    """GDS-026 from `ibdev2netdev` when the sysfs tree could not be read (older evidence, a
    permission error): the same question, answered by the other source."""
    table = ctx.ibdev2netdev
    if table is None:
        return ctx.skip("GDS-026", ev.INFINIBAND, ev.IBDEV2NETDEV)
    source = f"per ibdev2netdev ({ctx.problem(ev.INFINIBAND)})"
    links = table.links
    lines = "\n".join(
        f"{k.device} port {k.port} ==> {k.netdev or 'N/A'} ({k.state})" for k in links
    )
    if not links and (ctx.text(ev.IBDEV2NETDEV) or "").strip():
        msg = f"ibdev2netdev output not understood: {'; '.join(table.warnings)}"
        return finding("GDS-026", Severity.WARN, msg)
    if not links:
        return finding("GDS-026", Severity.FAIL, f"no RDMA device {source}")
    up = [k for k in links if k.up]
    if not up:
        return finding("GDS-026", Severity.FAIL, f"no RDMA port is Up {source}", lines)
    return finding("GDS-026", Severity.PASS, f"{len(up)}/{len(links)} ports Up {source}", lines)


CHECKS = [
    check_on_nfs,
    check_proto_rdma,
    check_nfs_version,
    check_hard,
    check_rw_size,
    check_rpcrdma,
    check_rdma_port,
]
