"""ibdev2netdev and show_gids parsers on their recorded outputs, the -v format, and cut-off or
foreign input (what could be read plus a warning, never an exception)."""

from __future__ import annotations

from pathlib import Path

from kvops.parse.rdma_tools import parse_ibdev2netdev, parse_show_gids

MISC = Path(__file__).parent.parent / "fixtures" / "misc"
IBDEV2NETDEV = (MISC / "ibdev2netdev-dgx-a100-nvidia-docs.txt").read_text()
SHOW_GIDS = (MISC / "show_gids-mlx5.txt").read_text()
# The -v line quoted in fixtures/misc/README.md (NVIDIA GDS Troubleshooting Guide §9.8).
VERBOSE = (
    "0000:b8:00.1 mlx5_13 (MT4123 - MCX653106A-ECAT) ConnectX-6 VPI adapter card, 100Gb/s "
    "(HDR100, EDR IB and 100GbE), dual-port QSFP56 fw 20.26.4012 port 1 (ACTIVE) ==> ib4 (Up) "
    "(o2ib)\n"
)


def test_recorded_dgx_a100_ibdev2netdev() -> None:
    table = parse_ibdev2netdev(IBDEV2NETDEV)
    assert table.warnings == []  # the `$ sudo ibdev2netdev` prompt line is skipped
    assert len(table.links) == 12
    by_device = {link.device: link for link in table.links}
    down = by_device["mlx5_10"]
    assert (down.port, down.netdev, down.state, down.up) == (1, "ibp225s0f0", "Down", False)
    assert by_device["mlx5_0"].netdev == "ibp12s0" and by_device["mlx5_0"].up
    assert sorted(d for d, link in by_device.items() if not link.up) == [
        "mlx5_10",
        "mlx5_11",
        "mlx5_4",
        "mlx5_5",
    ]
    assert [link.device for link in table.for_netdev("ibp97s0f1")] == ["mlx5_5"]
    assert by_device["mlx5_0"].pci_address is None and by_device["mlx5_0"].port_state is None


def test_verbose_format_adds_pci_address_port_state_and_firmware() -> None:
    [link] = parse_ibdev2netdev(VERBOSE).links
    assert (link.pci_address, link.device, link.port) == ("0000:b8:00.1", "mlx5_13", 1)
    assert (link.port_state, link.netdev, link.state, link.up) == ("ACTIVE", "ib4", "Up", True)
    assert link.firmware == "20.26.4012"
    assert link.description is not None and "MCX653106A-ECAT" in link.description


def test_truncated_ibdev2netdev_keeps_complete_lines_and_warns() -> None:
    cut = IBDEV2NETDEV.rstrip("\n")[:-6]  # ends inside the last line: "... ==> ibp202s"
    table = parse_ibdev2netdev(cut)
    assert len(table.links) == 11 and table.links[-1].device == "mlx5_8"
    [warning] = table.warnings
    assert warning == "line 13: not an ibdev2netdev line: mlx5_9 port 1 ==> ibp202s"


def test_ibdev2netdev_garbage_and_empty_input() -> None:
    table = parse_ibdev2netdev("bash: ibdev2netdev: command not found\n")
    assert table.links == [] and len(table.warnings) == 2
    assert parse_ibdev2netdev("").warnings == [
        "no device lines: no RDMA device, or not ibdev2netdev output"
    ]
    assert parse_ibdev2netdev("mlx5_0 port 1 ==> N/A (Down)\n").links[0].netdev is None


def test_recorded_show_gids() -> None:
    table = parse_show_gids(SHOW_GIDS)
    assert table.warnings == []
    assert table.n_gids_found == 4 and len(table.gids) == 4
    assert table.ports() == [("mlx5_3", 1)]
    third = table.gids[3]
    assert (third.device, third.port, third.index) == ("mlx5_3", 1, 3)
    assert third.gid == "0000:0000:0000:0000:0000:ffff:c0a8:0a02"
    assert (third.ipv4, third.version, third.netdev) == ("192.168.10.2", "v2", "net1")
    link_local = table.gids[0]
    assert (link_local.ipv4, link_local.version, link_local.netdev) == (None, "v1", "net1")
    assert [g.version for g in table.gids] == ["v1", "v2", "v1", "v2"]


def test_truncated_show_gids_reports_the_missing_count() -> None:
    cut = SHOW_GIDS[: SHOW_GIDS.index("mlx5_3\t1\t3")]
    table = parse_show_gids(cut)
    assert [g.index for g in table.gids] == [0, 1, 2]
    assert table.n_gids_found is None
    assert table.warnings == ["no 'n_gids_found=' line: output truncated or not show_gids"]
    lying = parse_show_gids(cut + "n_gids_found=4\n")
    assert lying.warnings == ["n_gids_found=4 but 3 rows read (truncated?)"]


def test_show_gids_infiniband_row_and_garbage() -> None:
    # InfiniBand port: no IPv4, no net device; only the version column after the GID.
    table = parse_show_gids(
        "mlx5_0\t1\t0\tfe80:0000:0000:0000:b83f:d203:00a5:2f1c\t\t\tv1\t\nnonsense here\n"
        "n_gids_found=x\n"
    )
    [row] = table.gids
    assert (row.ipv4, row.version, row.netdev) == (None, "v1", None)
    assert table.warnings == [
        "line 2: not a show_gids row: nonsense here",
        "line 3: n_gids_found is not a number",
        "no 'n_gids_found=' line: output truncated or not show_gids",
    ]
