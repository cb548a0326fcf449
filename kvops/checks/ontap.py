"""The ONTAP side of the path, judged from one cluster's REST evidence and the hosts' mounts.

Pure: `kvops.ontap.collect` reads the cluster, the probe reads each host's /proc/mounts;
these judges only compare. Cluster-wide findings are filed under the cluster's inventory
name, per-host ones (does the export admit this host, does it mount the volume's junction,
through which LIF) under the GPU host, so the fleet report shows each where it is fixed.

Facts relied on (NetApp docs, https://docs.netapp.com/us-en/ontap/nfs-rdma/index.html):
NFS over RDMA needs ONTAP 9.10.1 for NFSv4.0, 9.14.1 for v4.1 and 9.15.1 for v3; a data
LIF carries RDMA when its `rdma_protocols` has `roce`. A LIF on a node other than the
volume's is a WARN: NetApp removed the old "node-local traffic only" sentence in 2024
(https://github.com/NetAppDocs/ontap/issues/1348), but remote access adds a cluster hop.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, Thresholds, finding
from kvops.checks.rdma_mount import gds_mount, mount_line
from kvops.evidence import MOUNTSTATS, item_text
from kvops.parse.mountstats import NOT_CONFIGURED, pnfs_layouts

Version = tuple[int, int, int]

# Mounted NFS version → first ONTAP release serving it over RDMA (NetApp nfs-rdma index).
RDMA_NFS_FLOORS: dict[str, Version] = {
    "4.0": (9, 10, 1),
    "4.1": (9, 14, 1),
    "3": (9, 15, 1),
}
WRITE_FLAVOURS = frozenset({"sys", "any"})


@dataclass(frozen=True)
class OntapThresholds:
    """Operator-tunable: the volume's free share below which validate FAILs."""

    min_free_percent: float = 10.0


@dataclass(frozen=True)
class HostMount:
    """What a GPU host's evidence says about its NFS mount of the GDS directory."""

    host: str
    server: str  # the address mounted (the mount's addr= option, else the device's host)
    export_path: str
    nfs_version: str  # "3", "4.0", "4.1", "4.2"
    client_address: str  # the mount's clientaddr=, else the inventory's storage address
    line: str
    mount_point: str = ""
    pnfs_layout: str | None = None  # `pnfs=` in /proc/self/mountstats; None = not recorded


def _vtext(version: Version) -> str:
    return ".".join(str(p) for p in version)


def normalise_nfs_version(raw: str | None) -> str:
    if raw in ("4", "4.0"):
        return "4.0"
    return raw or ""


def host_mount(document: Mapping[str, Any], storage_address: str = "") -> HostMount | str:
    """The host's GDS-directory NFS mount, or why there is none to compare."""
    host = str(document.get("host") or "?")
    if document.get("error"):
        return f"{host} was not probed"
    mount = gds_mount(Context(dict(document), Thresholds()))
    if mount is None or not mount.is_nfs:
        return f"{host}: the GDS directory is not on an NFS mount (see GDS-020)"
    device = mount.device
    if device.startswith("["):
        name, _, rest = device[1:].partition("]")
        path = rest.lstrip(":")
    else:
        name, _, path = device.partition(":")
    return HostMount(
        host=host,
        server=str(mount.options.get("addr") or name),
        export_path=path,
        nfs_version=normalise_nfs_version(mount.nfs_version),
        client_address=str(mount.options.get("clientaddr") or storage_address),
        line=mount_line(mount),
        mount_point=mount.mount_point,
        pnfs_layout=pnfs_layouts(item_text(dict(document), MOUNTSTATS) or "").get(
            mount.mount_point
        ),
    )


def cluster_version(ontap: Mapping[str, Any]) -> Version | None:
    raw = (ontap.get("cluster") or {}).get("version") or {}
    try:
        return int(raw["generation"]), int(raw["major"]), int(raw["minor"])
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- cluster-wide
def check_version_floor(ontap: Mapping[str, Any], mounts: list[HostMount]) -> Finding:
    version = cluster_version(ontap)
    if version is None:
        return finding("ONT-001", Severity.FAIL, "the cluster reported no version")
    mounted = sorted({m.nfs_version for m in mounts})
    if not mounted:
        return finding("ONT-001", Severity.SKIP, "no host mount to compare with")
    too_old = [v for v in mounted if v in RDMA_NFS_FLOORS and version < RDMA_NFS_FLOORS[v]]
    unknown = [v for v in mounted if v not in RDMA_NFS_FLOORS]
    where = f"ONTAP {_vtext(version)}; hosts mount NFS {', '.join(mounted)}"
    if too_old:
        needs = ", ".join(f"v{v} needs {_vtext(RDMA_NFS_FLOORS[v])}" for v in too_old)
        return finding("ONT-001", Severity.FAIL, f"{where}: over RDMA {needs}")
    if unknown:
        msg = f"{where}: NetApp documents no RDMA support for NFS {', '.join(unknown)}"
        return finding("ONT-001", Severity.WARN, msg)
    return finding("ONT-001", Severity.PASS, where)


def check_nfs_rdma(ontap: Mapping[str, Any]) -> Finding:
    service = ontap.get("nfs_service")
    svm = ontap.get("svm")
    if not isinstance(service, dict):
        return finding("ONT-002", Severity.FAIL, f"SVM {svm} has no NFS service")
    state = f"enabled={service.get('enabled')}, state={service.get('state', '?')}"
    if service.get("enabled") is False or service.get("state") == "offline":
        return finding("ONT-002", Severity.FAIL, f"NFS on SVM {svm} is off ({state})")
    rdma = (service.get("transport") or {}).get("rdma_enabled")
    unreadable = (ontap.get("unreadable_fields") or {}).get("transport.rdma_enabled")
    if rdma is None:
        msg = f"RDMA on SVM {svm} cannot be read over REST ({unreadable or 'not reported'})"
        remedy = f"Check it on the cluster: `vserver nfs show -vserver {svm} -fields rdma`."
        return finding("ONT-002", Severity.WARN, msg, remedy=remedy)
    if rdma is not True:
        return finding("ONT-002", Severity.FAIL, f"NFS on SVM {svm}: RDMA disabled ({state})")
    return finding("ONT-002", Severity.PASS, f"NFS on SVM {svm}: RDMA enabled ({state})")


def _version_enabled(service: Mapping[str, Any], version: str) -> bool | None:
    protocol = service.get("protocol") or {}
    key = {"3": "v3_enabled", "4.0": "v40_enabled", "4.1": "v41_enabled"}.get(version)
    if version == "4.2":  # before 9.19.1, NFSv4.2 rides on the v4.1 switch
        value = protocol.get("v42_enabled", protocol.get("v41_enabled"))
    else:
        value = protocol.get(key) if key else None
    return value if isinstance(value, bool) else None


def check_nfs_versions(ontap: Mapping[str, Any], mounts: list[HostMount]) -> Finding:
    service = ontap.get("nfs_service")
    if not isinstance(service, dict):
        return finding("ONT-003", Severity.SKIP, "no NFS service (see ONT-002)")
    mounted = sorted({m.nfs_version for m in mounts})
    if not mounted:
        return finding("ONT-003", Severity.SKIP, "no host mount to compare with")
    off = [v for v in mounted if _version_enabled(service, v) is False]
    if off:
        msg = f"hosts mount NFS {', '.join(off)}, disabled on SVM {ontap.get('svm')}"
        return finding("ONT-003", Severity.FAIL, msg)
    return finding("ONT-003", Severity.PASS, f"NFS {', '.join(mounted)} enabled")


def check_volume(ontap: Mapping[str, Any], limits: OntapThresholds) -> list[Finding]:
    volume = ontap.get("volume")
    name = f"{ontap.get('svm')}:{ontap.get('volume_name')}"
    if not isinstance(volume, dict):
        return [finding("ONT-005", Severity.FAIL, f"volume {name} not found")]
    state = volume.get("state", "?")
    out = [
        finding(
            "ONT-005",
            Severity.PASS if state == "online" else Severity.FAIL,
            f"volume {name} is {state}, junction {(volume.get('nas') or {}).get('path', '-')}",
        )
    ]
    space = volume.get("space") or {}
    size, available = space.get("size"), space.get("available")
    if not isinstance(size, int) or not isinstance(available, int) or size <= 0:
        out.append(finding("ONT-031", Severity.WARN, f"volume {name}: space not reported"))
        return out
    free_pct = 100.0 * available / size
    gib = 1024**3
    msg = (
        f"{free_pct:.1f}% free ({available / gib:.0f} of {size / gib:.0f} GiB), "
        f"floor {limits.min_free_percent:g}%"
    )
    severity = Severity.FAIL if free_pct < limits.min_free_percent else Severity.PASS
    out.append(finding("ONT-031", severity, f"volume {name}: {msg}"))
    return out


def _roce(lif: Mapping[str, Any]) -> bool:
    protocols = [str(p).lower() for p in lif.get("rdma_protocols") or []]
    services = lif.get("services")
    serves_nfs = services is None or "data_nfs" in services
    return "roce" in protocols and serves_nfs and lif.get("enabled", True) is not False


def _lif_node(lif: Mapping[str, Any]) -> str:
    location = lif.get("location") or {}
    node = location.get("node") or location.get("home_node") or {}
    return str(node.get("name") or "?")


def _lif_address(lif: Mapping[str, Any]) -> str:
    return str((lif.get("ip") or {}).get("address") or "")


def lif_owners(ontap: Mapping[str, Any]) -> dict[str, str]:
    """Data LIF address → `cluster/svm`: hosts that mount one SVM's export through different
    LIFs share one namespace (kvops/checks/shared_store.py compares their stores by it)."""
    cluster = (ontap.get("cluster") or {}).get("name") or ontap.get("host") or "ontap"
    owner = f"{cluster}/{ontap.get('svm')}"
    lifs = [lif for lif in ontap.get("lifs") or [] if isinstance(lif, dict)]
    return {address: owner for lif in lifs if (address := _lif_address(lif))}


def check_roce_lifs(ontap: Mapping[str, Any]) -> Finding:
    lifs = [lif for lif in ontap.get("lifs") or [] if isinstance(lif, dict)]
    roce = [lif for lif in lifs if _roce(lif)]
    lines = "\n".join(
        f"{lif.get('name')} {_lif_address(lif)} on {_lif_node(lif)} "
        f"rdma_protocols={lif.get('rdma_protocols') or []}"
        for lif in lifs
    )
    if not roce:
        msg = f"no data LIF of SVM {ontap.get('svm')} has rdma_protocols roce"
        return finding("ONT-010", Severity.FAIL, msg, lines)
    nodes = list(ontap.get("volume_nodes") or [])
    covered = {_lif_node(lif) for lif in roce}
    missing = [n for n in nodes if n not in covered]
    if missing:
        msg = (
            f"no RoCE LIF on {', '.join(missing)} (the volume's node, per "
            f"{ontap.get('volume_nodes_source')}): RoCE LIFs only on {', '.join(sorted(covered))}"
        )
        return finding("ONT-010", Severity.WARN, msg, lines)
    where = ", ".join(nodes) if nodes else "the volume's node unknown"
    return finding("ONT-010", Severity.PASS, f"{len(roce)} RoCE LIF(s); volume on {where}", lines)


# ---------------------------------------------------------------- per host
def check_host_lif(ontap: Mapping[str, Any], mount: HostMount) -> Finding:
    lifs = [lif for lif in ontap.get("lifs") or [] if isinstance(lif, dict)]
    lif = next((x for x in lifs if _lif_address(x) == mount.server), None)
    if lif is None:
        msg = f"mounts {mount.server}, not a data LIF of SVM {ontap.get('svm')}"
        return finding("ONT-011", Severity.WARN, msg, mount.line)
    name, node = lif.get("name"), _lif_node(lif)
    if not _roce(lif):
        msg = f"mounts LIF {name} ({mount.server}) which has no rdma_protocols roce"
        return finding("ONT-011", Severity.FAIL, msg, mount.line)
    nodes = list(ontap.get("volume_nodes") or [])
    if nodes and node not in nodes:
        msg = (
            f"mounts LIF {name} on {node}; the volume is on {', '.join(nodes)}: "
            "every IO crosses the cluster interconnect"
        )
        return finding("ONT-011", Severity.WARN, msg, mount.line)
    return finding("ONT-011", Severity.PASS, f"mounts RoCE LIF {name} on {node}", mount.line)


def _client_matches(spec: str, address: str) -> bool:
    spec = spec.strip()
    if spec == address:
        return True
    try:
        ip = ipaddress.ip_address(address)
        return ip in ipaddress.ip_network(spec, strict=False)
    except ValueError:
        return False


def _rule_text(rule: Mapping[str, Any]) -> str:
    clients = ",".join(str(c.get("match")) for c in rule.get("clients") or [])
    return (
        f"rule {rule.get('index')}: clients={clients} protocols={rule.get('protocols')} "
        f"ro={rule.get('ro_rule')} rw={rule.get('rw_rule')} superuser={rule.get('superuser')}"
    )


def _protocol_ok(protocols: Iterable[str], version: str) -> bool:
    wanted = {"any", "nfs", "nfs3" if version == "3" else "nfs4"}
    return bool(wanted & {str(p) for p in protocols})


def check_export(ontap: Mapping[str, Any], mount: HostMount) -> Finding:
    rules = ontap.get("export_rules")
    policy = ((ontap.get("volume") or {}).get("nas") or {}).get("export_policy") or {}
    name = policy.get("name", "?")
    if not mount.client_address:
        msg = "storage address unknown: no clientaddr= in the mount, no kvops_storage_address"
        return finding("ONT-020", Severity.SKIP, msg)
    if not isinstance(rules, list):
        return finding("ONT-020", Severity.FAIL, f"volume has no readable export policy ({name})")
    ordered = sorted((r for r in rules if isinstance(r, dict)), key=lambda r: r.get("index", 0))
    addr = mount.client_address
    # ONTAP applies the first rule (lowest index) whose clients match.
    rule = next(
        (
            r
            for r in ordered
            if any(_client_matches(str(c.get("match")), addr) for c in r.get("clients") or [])
        ),
        None,
    )
    if rule is None:
        msg = f"export policy {name} admits no rule for {addr}"
        return finding("ONT-020", Severity.FAIL, msg, "\n".join(map(_rule_text, ordered)))
    text = _rule_text(rule)
    if not _protocol_ok(rule.get("protocols") or [], mount.nfs_version):
        msg = f"{name} {text.split(':')[0]} for {addr} does not allow NFS {mount.nfs_version}"
        return finding("ONT-020", Severity.FAIL, msg, text)
    if not WRITE_FLAVOURS & set(rule.get("rw_rule") or []):
        rw_rule = rule.get("rw_rule")
        msg = f"{name} {text.split(':')[0]} gives {addr} read-only access (rw_rule {rw_rule})"
        return finding("ONT-020", Severity.FAIL, msg, text)
    # Root squashed (superuser none) is what ontap_export sets: the service user owns the volume
    # root and creates the GDS directory. Root access for a host makes its root everyone's.
    if WRITE_FLAVOURS & set(rule.get("superuser") or []):
        msg = (
            f"{name} admits {addr} read-write, and root unsquashed (superuser "
            f"{rule.get('superuser')}): root on any admitted host is root on the shared volume"
        )
        remedy = (
            "Squash root (ontap_export_superuser: [none], the role's default) and give the volume "
            "root to the service user (ontap_export_volume_uid/gid)."
        )
        return finding("ONT-020", Severity.WARN, msg, text, remedy)
    msg = f"{name} admits {addr} read-write with sys, root squashed"
    return finding("ONT-020", Severity.PASS, msg, text)


def check_junction(ontap: Mapping[str, Any], mount: HostMount) -> Finding:
    volume = ontap.get("volume")
    if not isinstance(volume, dict):
        return finding("ONT-030", Severity.SKIP, "volume not found (see ONT-005)")
    path = (volume.get("nas") or {}).get("path")
    if not path:
        msg = f"volume {volume.get('name')} has no junction path: not in the SVM namespace"
        return finding("ONT-030", Severity.FAIL, msg, mount.line)
    if mount.export_path.rstrip("/") == str(path).rstrip("/"):
        return finding("ONT-030", Severity.PASS, f"mounts {path}", mount.line)
    msg = f"mounts {mount.export_path}, the volume's junction path is {path}"
    return finding("ONT-030", Severity.FAIL, msg, mount.line)


def check_pnfs(ontap: Mapping[str, Any], mount: HostMount) -> Finding:
    """With pNFS on the SVM, each host should read from the node owning the data: its
    mountstats then name a layout driver instead of `pnfs=not configured`."""
    service = ontap.get("nfs_service") or {}
    features = (service.get("protocol") or {}).get("v41_features") or {}
    if features.get("pnfs_enabled") is not True:
        return finding("ONT-040", Severity.SKIP, f"pNFS is off on SVM {ontap.get('svm')}")
    if mount.nfs_version not in ("4.1", "4.2"):
        msg = f"pNFS is on, but NFS {mount.nfs_version} has no pNFS: mount vers=4.1"
        return finding("ONT-040", Severity.WARN, msg, mount.line)
    if mount.pnfs_layout is None:
        msg = f"no pnfs= for {mount.mount_point} in /proc/self/mountstats (older probe?)"
        return finding("ONT-040", Severity.SKIP, msg)
    if mount.pnfs_layout == NOT_CONFIGURED:
        msg = f"{mount.mount_point}: pnfs=not configured: all IO goes through the metadata node"
        return finding("ONT-040", Severity.WARN, msg, mount.line)
    return finding("ONT-040", Severity.PASS, f"{mount.mount_point}: pnfs={mount.pnfs_layout}")


def judge_ontap(
    ontap: Mapping[str, Any],
    host_documents: Iterable[Mapping[str, Any]],
    storage_addresses: Mapping[str, str] | None = None,
    limits: OntapThresholds | None = None,
) -> dict[str, list[Finding]]:
    """{cluster name: cluster findings, GPU host: its ONTAP findings}."""
    limits = limits or OntapThresholds()
    addresses = storage_addresses or {}
    cluster = str(ontap.get("host") or "ontap")
    mounts: list[HostMount] = []
    per_host: dict[str, list[Finding]] = {}
    for document in host_documents:
        host = str(document.get("host") or "?")
        found = host_mount(document, addresses.get(host, ""))
        if isinstance(found, HostMount):
            mounts.append(found)
            per_host[host] = [
                check_host_lif(ontap, found),
                check_export(ontap, found),
                check_junction(ontap, found),
                check_pnfs(ontap, found),
            ]
        else:
            per_host[host] = [
                finding(cid, Severity.SKIP, found)
                for cid in ("ONT-011", "ONT-020", "ONT-030", "ONT-040")
            ]
    version = cluster_version(ontap)
    read = finding(
        "ONT-000",
        Severity.PASS,
        f"{(ontap.get('cluster') or {}).get('name')} (ONTAP "
        f"{_vtext(version) if version else '?'}) read over REST at {ontap.get('collected_at')}",
    )
    findings = [
        read,
        check_version_floor(ontap, mounts),
        check_nfs_rdma(ontap),
        check_nfs_versions(ontap, mounts),
        *check_volume(ontap, limits),
        check_roce_lifs(ontap),
    ]
    out = {cluster: [replace(f, host=cluster) for f in findings]}
    for host, items in per_host.items():
        out[host] = [replace(f, host=host) for f in items]
    return out
