"""Judges fed by ibdev2netdev, show_gids and nvidia-smi topo -mp: GDS-026 (ibdev2netdev when
sysfs is missing), GDS-027 (the port carrying the mount), GDS-028 (RoCE v2 GIDs), GDS-043
(GPU/storage NIC PCIe placement). Evidence is the healthy ONTAP host with items swapped for recorded
outputs (tests/fixtures/misc) or stated edits of them."""

from __future__ import annotations

from typing import Any

from evidence_builders import (
    SHOW_GIDS_FIXTURE,
    TOPO_FIXTURE,
    command,
    data_item,
    edited,
    file_item,
    findings_for,
    fixture,
    healthy,
)

from kvops.validate.judge import judge

IBDEV2NETDEV_DGX = fixture("misc/ibdev2netdev-dgx-a100-nvidia-docs.txt")


def one(doc: dict[str, Any], check_id: str) -> tuple[str, str, str]:
    """(severity, message, evidence) of the single finding of `check_id`."""
    [f] = [f for f in judge(doc) if f.check_id == check_id]
    return str(f.severity), f.message, f.evidence


def ip_addr(*lines: str) -> dict[str, Any]:
    return command(["ip", "-o", "addr", "show"], "".join(f"{ln}\n" for ln in lines))


def infiniband(*ports: tuple[str, str, str, list[str]]) -> dict[str, Any]:
    """sysfs data: (device, state, link_layer, netdevs) per device, port 1."""
    devices = [
        {
            "name": name,
            "ports": [{"port": 1, "state": state, "link_layer": layer, "netdevs": netdevs}],
        }
        for name, state, layer, netdevs in ports
    ]
    return data_item("sysfs", "/sys/class/infiniband", {"devices": devices})


def mounts(options: str) -> dict[str, Any]:
    line = f"192.168.10.101:/trident_pvc /mnt/lmcache nfs4 rw,{options} 0 0\n"
    return file_item("/proc/mounts", line)


NET1_ACTIVE = ("mlx5_3", "4: ACTIVE", "Ethernet", ["net1"])
NET1_DOWN = ("mlx5_3", "1: DOWN", "Ethernet", ["net1"])
ETH0_ACTIVE = ("mlx5_0", "4: ACTIVE", "Ethernet", ["eth0"])


# --- GDS-026 from ibdev2netdev when sysfs is missing ----------------------------------------


def test_rdma_port_from_recorded_ibdev2netdev_without_sysfs() -> None:
    doc = edited(infiniband=None, ibdev2netdev=command(["ibdev2netdev"], IBDEV2NETDEV_DGX))
    severity, message, evidence = one(doc, "GDS-026")
    assert severity == "PASS"
    assert message == "8/12 ports Up per ibdev2netdev (infiniband: not collected)"
    assert "mlx5_10 port 1 ==> ibp225s0f0 (Down)" in IBDEV2NETDEV_DGX
    assert evidence.splitlines()[0] == "mlx5_0 port 1 ==> ibp12s0 (Up)"


def test_rdma_port_all_down_per_ibdev2netdev_fails_and_no_source_skips() -> None:
    all_down = IBDEV2NETDEV_DGX.replace("(Up)", "(Down)")
    doc = edited(infiniband=None, ibdev2netdev=command(["ibdev2netdev"], all_down))
    assert one(doc, "GDS-026")[:2] == (
        "FAIL",
        "no RDMA port is Up per ibdev2netdev (infiniband: not collected)",
    )
    missing = command(["ibdev2netdev"], "", exit_code=127)
    severity, message, _ = one(edited(infiniband=None, ibdev2netdev=missing), "GDS-026")
    assert severity == "SKIP" and "ibdev2netdev: command not found" in message


# --- GDS-027: the port carrying the NFS/RDMA mount -----------------------------------------


def test_healthy_mount_port_is_up_by_both_sources() -> None:
    severity, message, evidence = one(healthy(), "GDS-027")
    assert severity == "PASS"
    assert message == "net1 (clientaddr 192.168.10.30): its RDMA port is up"
    assert evidence.splitlines() == [
        "mlx5_3 port 1 4: ACTIVE (sysfs)",
        "mlx5_3 port 1 ==> net1 (Up) (ibdev2netdev)",
    ]


def test_mount_port_down_fails_even_when_another_port_is_active() -> None:
    """GDS-026 passes (one port ACTIVE); the port under the mount is the one that is down."""
    doc = edited(
        infiniband=infiniband(ETH0_ACTIVE, NET1_DOWN),
        ibdev2netdev=command(
            ["ibdev2netdev"], "mlx5_0 port 1 ==> eth0 (Up)\nmlx5_3 port 1 ==> net1 (Down)\n"
        ),
    )
    assert one(doc, "GDS-026")[0] == "PASS"
    severity, message, evidence = one(doc, "GDS-027")
    assert severity == "FAIL"
    assert message == (
        "the RDMA port carrying the NFS/RDMA mount is down: net1 (clientaddr 192.168.10.30): "
        "mlx5_3 port 1 1: DOWN (sysfs)"
    )
    assert "mlx5_3 port 1 ==> net1 (Down) (ibdev2netdev)" in evidence


def test_mount_port_down_per_ibdev2netdev_alone() -> None:
    down = command(["ibdev2netdev"], "mlx5_3 port 1 ==> net1 (Down)\n")
    for doc in (edited(ibdev2netdev=down), edited(infiniband=None, ibdev2netdev=down)):
        severity, message, _ = one(doc, "GDS-027")
        assert severity == "FAIL" and "mlx5_3 port 1 ==> net1 (Down) (ibdev2netdev)" in message


def test_mount_port_skips_without_rdma_proto_clientaddr_or_addresses() -> None:
    tcp = edited(mounts=mounts("vers=4.1,proto=tcp,clientaddr=192.168.10.30,addr=192.168.10.101"))
    assert one(tcp, "GDS-027")[:2] == (
        "SKIP",
        "NFS over tcp: no RDMA port carries it (see GDS-021)",
    )
    v3 = edited(mounts=mounts("vers=3,proto=rdma,port=20049,addr=192.168.10.101"))
    severity, message, _ = one(v3, "GDS-027")
    assert severity == "SKIP" and "no clientaddr=" in message
    severity, message, _ = one(edited(ip_addr=None), "GDS-027")
    assert severity == "SKIP" and "ip_addr: not collected" in message
    no_ports = edited(infiniband=None, ibdev2netdev=None)
    severity, message, _ = one(no_ports, "GDS-027")
    assert severity == "SKIP" and "infiniband: not collected" in message


def test_clientaddr_gone_or_on_a_non_rdma_interface_warns() -> None:
    gone = edited(ip_addr=ip_addr("5: net1    inet 192.168.10.31/24 scope global net1"))
    severity, message, _ = one(gone, "GDS-027")
    assert severity == "WARN" and message.startswith("clientaddr 192.168.10.30 is on no interface")
    elsewhere = edited(ip_addr=ip_addr("2: eth9    inet 192.168.10.30/24 scope global eth9"))
    assert one(elsewhere, "GDS-027")[:2] == (
        "WARN",
        "eth9 (clientaddr 192.168.10.30) carries the NFS/RDMA mount but no RDMA device maps to it",
    )


def test_vlan_interface_rides_its_parents_port() -> None:
    doc = edited(ip_addr=ip_addr("7: net1.100@net1    inet 192.168.10.30/24 scope global net1.100"))
    severity, message, _ = one(doc, "GDS-027")
    assert (severity, message) == (
        "PASS",
        "net1.100 (clientaddr 192.168.10.30): its RDMA port is up",
    )


# --- GDS-028: RoCE v2 GIDs -----------------------------------------------------------------


def show_gids(text: str) -> dict[str, Any]:
    return command(["show_gids"], text)


RECORDED_GIDS = fixture(SHOW_GIDS_FIXTURE)
NET1_AT_10_2 = ip_addr("5: net1    inet 192.168.10.2/24 brd 192.168.10.255 scope global net1")


def test_healthy_has_a_v2_gid_for_its_address() -> None:
    assert one(healthy(), "GDS-028") == (
        "PASS",
        "a RoCE v2 GID for each of 1 IPv4 address(es) on RoCE ports",
        "mlx5_3 port 1 net1 192.168.10.30: RoCE v2 GID index 3",
    )


def test_recorded_gids_pass_for_their_own_address() -> None:
    doc = edited(show_gids=show_gids(RECORDED_GIDS), ip_addr=NET1_AT_10_2)
    severity, _, evidence = one(doc, "GDS-028")
    assert (severity, evidence) == ("PASS", "mlx5_3 port 1 net1 192.168.10.2: RoCE v2 GID index 3")


def test_v1_only_gids_warn() -> None:
    v1_only = "".join(
        ln for ln in RECORDED_GIDS.splitlines(keepends=True) if not ln.rstrip().endswith("v2\tnet1")
    ).replace("n_gids_found=4", "n_gids_found=2")
    severity, message, evidence = one(
        edited(show_gids=show_gids(v1_only), ip_addr=NET1_AT_10_2), "GDS-028"
    )
    assert severity == "WARN"
    assert message.startswith("no RoCE v2 GID for 192.168.10.2 (mlx5_3 port 1): ")
    assert "routed networks needs RoCE v2" in message and "incomplete" not in message
    assert evidence == "mlx5_3 port 1 net1 192.168.10.2: no RoCE v2 GID"


def test_interface_address_without_any_gid_warns() -> None:
    """The recorded table has GIDs for 192.168.10.2 only; the host's net1 holds .30."""
    severity, message, evidence = one(edited(show_gids=show_gids(RECORDED_GIDS)), "GDS-028")
    assert severity == "WARN" and "no RoCE v2 GID for 192.168.10.30 (mlx5_3 port 1)" in message
    assert evidence.splitlines() == [
        "mlx5_3 port 1 net1 192.168.10.2: RoCE v2 GID index 3",
        "mlx5_3 port 1 net1 192.168.10.30: no RoCE v2 GID",
    ]


def test_truncated_gid_table_says_so() -> None:
    cut = RECORDED_GIDS[: RECORDED_GIDS.index("mlx5_3\t1\t3")]
    severity, message, _ = one(edited(show_gids=show_gids(cut), ip_addr=NET1_AT_10_2), "GDS-028")
    assert severity == "WARN"
    assert message.endswith("(show_gids output incomplete: no 'n_gids_found=' line: output "
                            "truncated or not show_gids)")  # fmt: skip


def test_infiniband_ports_and_missing_tool_skip() -> None:
    ib = infiniband(("mlx5_3", "4: ACTIVE", "InfiniBand", ["net1"]))
    severity, message, _ = one(edited(infiniband=ib), "GDS-028")
    assert severity == "SKIP" and "no IPv4 address on a RoCE port" in message
    missing = command(["show_gids"], "", exit_code=127)
    severity, message, _ = one(edited(show_gids=missing), "GDS-028")
    assert severity == "SKIP" and "show_gids: command not found" in message


# --- GDS-043: GPU <-> RDMA NIC PCIe placement ---------------------------------------------


def topo(text: str) -> dict[str, Any]:
    return command(["nvidia-smi", "topo", "-mp"], text)


RECORDED_TOPO = fixture(TOPO_FIXTURE)


STORAGE_VIA_CLIENTADDR = "the mount's clientaddr 192.168.10.30 on net1"
FALLBACK = "storage NIC unknown: judged against the nearest RDMA NIC"


def test_gpu_under_the_storage_nic_switch_passes() -> None:
    severity, message, evidence = one(healthy(), "GDS-043")
    assert severity == "PASS"
    assert message == (
        f"each GPU shares a PCIe switch with a storage RDMA NIC ({STORAGE_VIA_CLIENTADDR}): "
        "GPU0->mlx5_3 PIX"
    )
    assert evidence.splitlines() == [
        f"storage NIC: mlx5_3 (NIC3, net1) (from {STORAGE_VIA_CLIENTADDR})",
        "GPU0 -> mlx5_3 (NIC3, net1): PIX, storage NIC",
    ]


def test_recorded_r760xa_gpu_reaches_its_storage_nic_through_node_only() -> None:
    severity, message, evidence = one(edited(nvidia_smi_topo=topo(RECORDED_TOPO)), "GDS-043")
    assert severity == "WARN"
    assert message.startswith(
        f"storage RDMA NIC ({STORAGE_VIA_CLIENTADDR}) is NODE for GPU0->mlx5_3: GPU<->NIC DMA "
        "crosses the interconnect between PCIe host bridges"
    )
    assert "one PCIe switch" in message and "nearer" not in message  # all NICs are NODE
    assert evidence.splitlines()[1] == "GPU0 -> mlx5_3 (NIC3, net1): NODE, storage NIC"
    assert findings_for(edited(nvidia_smi_topo=topo(RECORDED_TOPO)), "GDS-043")[0][0] == "WARN"


def test_sys_gets_the_stronger_wording_and_pxb_passes() -> None:
    gpu_row = next(ln for ln in RECORDED_TOPO.splitlines() if ln.startswith("GPU0"))
    across = RECORDED_TOPO.replace(gpu_row, gpu_row.replace("NODE", "SYS"))
    severity, message, evidence = one(edited(nvidia_smi_topo=topo(across)), "GDS-043")
    assert severity == "WARN" and "CPU interconnect between NUMA nodes" in message
    assert evidence.splitlines()[1] == "GPU0 -> mlx5_3 (NIC3, net1): SYS, storage NIC"
    switch = RECORDED_TOPO.replace(gpu_row, gpu_row.replace("NODE", "PXB"))
    assert one(edited(nvidia_smi_topo=topo(switch)), "GDS-043")[0] == "PASS"


# The mount's port is mlx5_0 (NIC0: NODE to GPU0 in healthy's matrix); mlx5_1 (NIC1) is a live
# compute NIC under GPU0's switch (PIX) that carries no storage traffic.
STORAGE_FAR = {
    "infiniband": infiniband(
        ("mlx5_0", "4: ACTIVE", "Ethernet", ["net1"]),
        ("mlx5_1", "4: ACTIVE", "Ethernet", ["eth1"]),
    ),
    "ibdev2netdev": command(
        ["ibdev2netdev"], "mlx5_0 port 1 ==> net1 (Up)\nmlx5_1 port 1 ==> eth1 (Up)\n"
    ),
    "ip_addr": ip_addr(
        "5: net1    inet 192.168.10.30/24 scope global net1",
        "6: eth1    inet 192.168.20.31/24 scope global eth1",
    ),
}


def test_storage_nic_far_warns_although_a_compute_nic_is_near() -> None:
    """The weakness this check had: GPU0 is PIX to mlx5_1, so "any RDMA NIC" passed, while
    every KV block crosses the host bridges to mlx5_0, the NIC under the mount."""
    severity, message, evidence = one(edited(**STORAGE_FAR), "GDS-043")
    assert severity == "WARN"
    assert message.startswith(
        f"storage RDMA NIC ({STORAGE_VIA_CLIENTADDR}) is NODE for GPU0->mlx5_0"
    )
    assert message.endswith("; nearer NICs carry no storage traffic: GPU0->mlx5_1 PIX")
    assert evidence.splitlines() == [
        f"storage NIC: mlx5_0 (NIC0, net1) (from {STORAGE_VIA_CLIENTADDR})",
        "GPU0 -> mlx5_0 (NIC0, net1): NODE, storage NIC; nearer mlx5_1 (NIC1, eth1): PIX, "
        "not a storage NIC",
    ]
    [warned] = [f for f in judge(edited(**STORAGE_FAR)) if f.check_id == "GDS-043"]
    assert warned.remedy.startswith("Carry the storage traffic over the RDMA NIC under each GPU")


def test_unknown_storage_nic_falls_back_to_the_nearest_rdma_nic_and_says_so() -> None:
    no_clientaddr = mounts("vers=3,proto=rdma,port=20049,addr=192.168.10.101")
    severity, message, evidence = one(edited(**STORAGE_FAR, mounts=no_clientaddr), "GDS-043")
    assert (severity, message) == (
        "PASS",
        f"each GPU shares a PCIe switch with an RDMA NIC: GPU0->mlx5_1 PIX; {FALLBACK} "
        "(the mount shows no clientaddr=)",
    )
    assert evidence.splitlines() == [
        "storage NIC unknown (the mount shows no clientaddr=): every live RDMA NIC counted",
        "GPU0 -> mlx5_1 (NIC1, eth1): PIX",
    ]
    tcp = mounts("vers=4.1,proto=tcp,clientaddr=192.168.10.30,addr=192.168.10.101")
    severity, message, _ = one(edited(**STORAGE_FAR, mounts=tcp), "GDS-043")
    assert severity == "PASS"
    assert message.endswith(f"{FALLBACK} (/mnt/lmcache is NFS over tcp, not NFS/RDMA)")
    severity, message, _ = one(edited(**{**STORAGE_FAR, "ip_addr": None}), "GDS-043")
    assert severity == "PASS" and message.endswith(f"{FALLBACK} (ip_addr: not collected)")
    unmapped = ip_addr("9: eth9    inet 192.168.10.30/24 scope global eth9")
    severity, message, _ = one(edited(**{**STORAGE_FAR, "ip_addr": unmapped}), "GDS-043")
    assert message.endswith(f"{FALLBACK} (no RDMA device maps to eth9 (clientaddr 192.168.10.30))")


def cufile_routing(dynamic: bool, nfs: str) -> dict[str, Any]:
    """healthy's cufile.json with rdma_dynamic_routing set and keys added to `fs.nfs`."""
    text = healthy()["items"]["cufile_json"]["stdout"]
    text = text.replace(
        '"rdma_dynamic_routing": false', f'"rdma_dynamic_routing": {str(dynamic).lower()}'
    )
    return file_item("/etc/cufile.json", text.replace('"nfs": {', '"nfs": {' + nfs, 1))


def test_dynamic_routing_address_list_names_the_storage_nics() -> None:
    """With rdma_dynamic_routing, cuFile moves the mount's IO through the listed addresses'
    NICs: eth1's mlx5_1 (PIX) is then the storage NIC, not the mount's mlx5_0 (NODE)."""
    listed = '"rdma_dev_addr_list": ["192.168.20.31"]'
    doc = edited(**STORAGE_FAR, cufile_json=cufile_routing(True, listed))
    assert findings_for(doc, "GDS-033") == [
        ("PASS", "fs.nfs.rdma_dev_addr_list subset of RDMA addresses")
    ]
    severity, message, evidence = one(doc, "GDS-043")
    via = "fs.nfs.rdma_dev_addr_list ['192.168.20.31'] with rdma_dynamic_routing"
    assert (severity, message) == (
        "PASS",
        f"each GPU shares a PCIe switch with a storage RDMA NIC ({via}): GPU0->mlx5_1 PIX",
    )
    assert evidence.splitlines()[0] == f"storage NIC: mlx5_1 (NIC1, eth1) (from {via})"
    # Without dynamic routing NFS ignores the list: the mount's NIC decides again.
    off = edited(**STORAGE_FAR, cufile_json=cufile_routing(False, listed))
    assert one(off, "GDS-043")[0] == "WARN"
    # The mount's own mount_table entry wins over the fs.nfs list.
    table = '"mount_table": {"/mnt/": {"rdma_dev_addr_list": ["192.168.10.30"]}}, ' + listed
    severity, message, _ = one(
        edited(**STORAGE_FAR, cufile_json=cufile_routing(True, table)), "GDS-043"
    )
    assert severity == "WARN"
    assert "storage RDMA NIC (fs.nfs.mount_table./mnt/ ['192.168.10.30'] with " in message
    # A list naming no address of this host (GDS-033 FAILs it) leaves the mount's NIC.
    foreign = '"rdma_dev_addr_list": ["10.9.9.9"]'
    severity, message, _ = one(
        edited(**STORAGE_FAR, cufile_json=cufile_routing(True, foreign)), "GDS-043"
    )
    assert severity == "WARN" and message.startswith(
        f"storage RDMA NIC ({STORAGE_VIA_CLIENTADDR}; no address of fs.nfs.rdma_dev_addr_list "
        "is on an RDMA port) is NODE"
    )


def test_down_nics_are_not_counted() -> None:
    """GPU0 is PIX to NIC1-NIC9 (healthy's matrix) but only mlx5_0 (NODE) has a live port."""
    ports = [("mlx5_0", "4: ACTIVE", "Ethernet", ["eth0"])]
    ports += [(f"mlx5_{n}", "1: DOWN", "Ethernet", [f"eth{n}"]) for n in range(1, 10)]
    doc = edited(infiniband=infiniband(*ports), ibdev2netdev=None)
    severity, message, evidence = one(doc, "GDS-043")
    assert severity == "WARN" and "NODE for GPU0->mlx5_0" in message
    down = ", ".join(f"mlx5_{n}" for n in range(1, 10))
    assert FALLBACK in message  # net1 (the mount's) is on none of these ports
    assert evidence.splitlines() == [
        "storage NIC unknown (no RDMA device maps to net1 (clientaddr 192.168.10.30)): every "
        "live RDMA NIC counted",
        f"not counted (port down): {down}",
        "GPU0 -> mlx5_0 (NIC0, eth0): NODE",
    ]
    all_down = [(name, "1: DOWN", layer, nets) for name, _, layer, nets in ports]
    doc = edited(infiniband=infiniband(*all_down), ibdev2netdev=None)
    assert one(doc, "GDS-043")[0] == "PASS"  # none live: all counted


def test_no_topology_evidence_skips_with_the_reason() -> None:
    severity, message, _ = one(edited(nvidia_smi_topo=None), "GDS-043")
    assert severity == "SKIP" and "nvidia_smi_topo: not collected" in message
    missing = command(["nvidia-smi", "topo", "-mp"], "", exit_code=127)
    severity, message, _ = one(edited(nvidia_smi_topo=missing), "GDS-043")
    assert severity == "SKIP" and "command not found" in message
    failed = topo("NVIDIA-SMI has failed because it couldn't communicate with the driver.\n")
    severity, message, _ = one(edited(nvidia_smi_topo=failed), "GDS-043")
    assert severity == "SKIP" and message.startswith("nvidia-smi topo -mp shows no GPU (")


def test_the_worst_gpu_decides_and_is_named() -> None:
    """Two GPUs, NIC columns named by device (older drivers): GPU1 only reaches NICs via SYS."""
    matrix = (
        "\tGPU0\tGPU1\tmlx5_0\tmlx5_1\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV12\tPXB\tSYS\t0-31\t0\n"
        "GPU1\tNV12\t X \tSYS\tSYS\t32-63\t1\n"
        "mlx5_0\tPXB\tSYS\t X \tSYS\t\t\n"
        "mlx5_1\tSYS\tSYS\tSYS\t X \t\t\n"
    )
    severity, message, evidence = one(edited(nvidia_smi_topo=topo(matrix)), "GDS-043")
    assert severity == "WARN" and message.startswith("nearest RDMA NIC is SYS for GPU1->mlx5_0:")
    assert "GPU0" not in message
    assert message.endswith(f"{FALLBACK} (mlx5_3 not a NIC in nvidia-smi topo -mp)")
    assert evidence.splitlines()[1:] == ["GPU0 -> mlx5_0: PXB", "GPU1 -> mlx5_0: SYS"]
