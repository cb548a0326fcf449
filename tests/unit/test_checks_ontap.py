"""Pure ONTAP judges: the rule-matching and version logic a cluster read cannot show alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from evidence_builders import edited, file_item

from kvops.checks.ontap import (
    HostMount,
    check_export,
    check_nfs_versions,
    check_pnfs,
    host_mount,
    judge_ontap,
)
from kvops.parse.mountstats import pnfs_layouts


def mount(version: str = "4.1", client: str = "10.1.2.3") -> HostMount:
    return HostMount("gpu-01", "192.168.10.101", "/kvcache", version, client, "line")


def ontap(rules: list[dict[str, Any]], **protocol: bool) -> dict[str, Any]:
    return {
        "host": "c1",
        "svm": "svm_kv",
        "volume": {"name": "kvcache", "nas": {"export_policy": {"name": "kv"}}},
        "export_rules": rules,
        "nfs_service": {"enabled": True, "protocol": protocol},
    }


def rule(index: int, match: str, rw: str = "sys", protocols: str = "nfs") -> dict[str, Any]:
    return {
        "index": index,
        "clients": [{"match": match}],
        "protocols": [protocols],
        "ro_rule": ["sys"],
        "rw_rule": [rw],
        "superuser": ["none"],
    }


def test_a_subnet_rule_admits_the_host() -> None:
    found = check_export(ontap([rule(1, "10.1.2.0/24")]), mount())
    assert (str(found.severity), found.message) == (
        "PASS",
        "kv admits 10.1.2.3 read-write with sys, root squashed",
    )


def test_root_access_for_the_hosts_warns() -> None:
    """superuser sys: root on one GPU host is root on the volume every host shares."""
    unsquashed = {**rule(1, "10.1.2.0/24"), "superuser": ["sys"]}
    found = check_export(ontap([unsquashed]), mount())
    assert str(found.severity) == "WARN" and "root on any admitted host" in found.message
    assert "ontap_export_superuser" in str(found.remedy)


def test_the_first_matching_rule_decides_even_if_a_later_one_is_read_write() -> None:
    rules = [rule(2, "10.1.2.3"), rule(1, "10.1.0.0/16", rw="never")]
    found = check_export(ontap(rules), mount())
    assert str(found.severity) == "FAIL" and "rule 1 gives 10.1.2.3 read-only" in found.message


def test_an_nfs4_only_rule_refuses_an_nfsv3_mount() -> None:
    found = check_export(ontap([rule(1, "10.1.2.3", protocols="nfs4")]), mount("3"))
    assert str(found.severity) == "FAIL" and "does not allow NFS 3" in found.message


def test_nfsv42_follows_the_v41_switch_before_9_19_1() -> None:
    mounts = [mount("4.2")]
    assert str(check_nfs_versions(ontap([], v41_enabled=False), mounts).severity) == "FAIL"
    assert str(check_nfs_versions(ontap([], v41_enabled=True), mounts).severity) == "PASS"


def test_an_nfsv3_mount_without_clientaddr_uses_the_inventory_storage_address() -> None:
    line = "192.168.10.101:/kvcache /mnt nfs vers=3,proto=rdma,port=20049,addr=192.168.10.101 0 0\n"
    doc = edited(mounts=file_item("/proc/mounts", line))
    found = host_mount(doc, "10.9.9.9")
    assert isinstance(found, HostMount)
    assert (found.nfs_version, found.client_address, found.export_path) == (
        "3",
        "10.9.9.9",
        "/kvcache",
    )


def test_a_host_not_probed_skips_its_ontap_checks_instead_of_failing_them() -> None:
    findings = judge_ontap(ontap([]), [{"host": "gpu-09", "error": "unreachable"}])
    assert {str(f.severity) for f in findings["gpu-09"]} == {"SKIP"}


MOUNTSTATS = (  # the kernel's format (fs/nfs/super.c nfs_show_stats), two NFSv4.1 mounts
    "device 192.168.10.101:/kvcache mounted on /mnt with fstype nfs4 statvers=1.1\n"
    "\topts:\trw,vers=4.1,proto=rdma\n"
    "\tnfsv4:\tbm0=0xfdffbfff,bm1=0x40f9be3e,bm2=0x803,acl=0x3,sessions,pnfs=not configured\n"
    "device 192.168.10.102:/other mounted on /data with fstype nfs4 statvers=1.1\n"
    "\tnfsv4:\tbm0=0xfdffbfff,acl=0x3,sessions,pnfs=LAYOUT_NFSV4_1_FILES,lease_time=90\n"
)


def test_pnfs_layouts_per_mount_point() -> None:
    assert pnfs_layouts(MOUNTSTATS) == {"/mnt": "not configured", "/data": "LAYOUT_NFSV4_1_FILES"}


def test_a_mount_without_pnfs_warns_when_the_svm_offers_it() -> None:
    cluster = {
        "svm": "svm_kv",
        "nfs_service": {"protocol": {"v41_features": {"pnfs_enabled": True}}},
    }
    on_mnt = HostMount("gpu-01", "a", "/kvcache", "4.1", "c", "line", "/mnt", "not configured")
    assert str(check_pnfs(cluster, on_mnt).severity) == "WARN"
    on_v3 = HostMount("gpu-01", "a", "/kvcache", "3", "c", "line", "/mnt", None)
    assert "NFS 3 has no pNFS" in check_pnfs(cluster, on_v3).message
    cluster["nfs_service"] = {"protocol": {"v41_features": {"pnfs_enabled": False}}}
    assert str(check_pnfs(cluster, on_mnt).severity) == "SKIP"
