"""`nvidia-smi topo -mp` parser on the recorded L40S/R760xa matrix (tab-separated, prompt line,
Legend and NIC Legend), the older mlx5-named columns, and cut-off input."""

from __future__ import annotations

from pathlib import Path

from kvops.parse.topo import link_rank, parse_topo

TOPO = (
    Path(__file__).parent.parent / "fixtures" / "misc" / "nvidia-smi-topo-mp-l40s-r760xa.txt"
).read_text()


def test_recorded_l40s_matrix() -> None:
    topo = parse_topo(TOPO)
    assert topo.warnings == []
    assert topo.gpus == ["GPU0"]
    assert topo.nics == [f"NIC{n}" for n in range(10)]
    assert topo.nic_names == {f"NIC{n}": f"mlx5_{n}" for n in range(10)}
    assert topo.nic_name("NIC3") == "mlx5_3"
    # GPU0 reaches every NIC through NODE; NIC1..NIC9 share one PCIe switch (PIX).
    assert {topo.link("GPU0", nic) for nic in topo.nics} == {"NODE"}
    assert topo.link("GPU0", "NIC0") == "NODE" and topo.link("NIC1", "GPU0") == "NODE"
    assert topo.link("NIC1", "NIC2") == "PIX" and topo.link("NIC0", "NIC9") == "NODE"
    assert topo.link("GPU0", "GPU0") == "X"
    # The GPU row has one more (empty) field than the header before `GPU NUMA ID`.
    assert topo.affinity == {
        "GPU0": {"cpu_affinity": "0,2,4,6,8,10", "numa_affinity": "0", "gpu_numa_id": None}
    }


def test_link_rank_orders_pcie_paths_and_ignores_the_rest() -> None:
    ranks = [link_rank(label) for label in ("PIX", "PXB", "PHB", "NODE", "SYS")]
    assert ranks == sorted(ranks) == [0, 1, 2, 3, 4]
    assert link_rank("X") is None and link_rank("NV12") is None and link_rank(None) is None


OLD_STYLE = (
    "\tGPU0\tGPU1\tmlx5_0\tmlx5_1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV12\tPXB\tSYS\t0-31\t0\n"
    "GPU1\tNV12\t X \tSYS\tPIX\t32-63\t1\n"
    "mlx5_0\tPXB\tSYS\t X \tSYS\t\t\n"
    "mlx5_1\tSYS\tPIX\tSYS\t X \t\t\n"
    "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def test_mlx5_named_columns_nvlink_and_no_nic_legend() -> None:
    topo = parse_topo(OLD_STYLE)
    assert topo.warnings == []
    assert topo.gpus == ["GPU0", "GPU1"] and topo.nics == ["mlx5_0", "mlx5_1"]
    assert topo.nic_name("mlx5_1") == "mlx5_1"  # no legend needed: columns are device names
    assert topo.link("GPU0", "GPU1") == "NV12"
    assert topo.link("GPU1", "mlx5_1") == "PIX" and topo.link("GPU0", "mlx5_1") == "SYS"
    assert topo.affinity["GPU1"] == {"cpu_affinity": "32-63", "numa_affinity": "1"}


def test_space_separated_copy_parses_the_same() -> None:
    spaced = TOPO.replace("\t", "   ")
    topo = parse_topo(spaced)
    assert topo.warnings == []
    assert topo.link("NIC1", "NIC2") == "PIX" and topo.nic_name("NIC9") == "mlx5_9"
    assert topo.affinity["GPU0"]["cpu_affinity"] == "0,2,4,6,8,10"


def test_truncated_matrix_keeps_rows_read_and_warns() -> None:
    row = TOPO.index("\nNIC5\t") + 1
    cut = TOPO[: row + len("NIC5\tNODE\tNODE\tPIX")]  # stops inside the NIC5 row
    topo = parse_topo(cut)
    assert topo.link("GPU0", "NIC3") == "NODE" and topo.link("NIC4", "NIC1") == "PIX"
    assert topo.links["NIC5"] == {"GPU0": "NODE", "NIC0": "NODE", "NIC1": "PIX"}
    assert topo.warnings == [
        "line 9: NIC5 has 3 of 11 links (truncated?)",
        "no row for NIC6, NIC7, NIC8, NIC9 (output truncated?)",
        "NIC Legend missing NIC0, NIC1, NIC2, NIC3, NIC4, NIC5, NIC6, NIC7, NIC8, NIC9: "
        "RDMA device names unknown (truncated?)",
    ]


def test_not_topology_output() -> None:
    topo = parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the driver.\n")
    assert topo.devices == [] and topo.gpus == []
    assert topo.warnings[-1].startswith("no topology matrix header")
    assert parse_topo("").warnings == [
        "no topology matrix header (GPU0 ...): not nvidia-smi topo -m output"
    ]


def test_unknown_link_label_is_kept_with_a_warning() -> None:
    topo = parse_topo("\tGPU0\tNIC0\nGPU0\t X \tWAT\nNIC0\tWAT\t X \nNIC Legend:\n  NIC0: mlx5_0\n")
    assert topo.link("GPU0", "NIC0") == "WAT"
    assert topo.warnings == [
        "line 2: unknown link type 'WAT' (GPU0-NIC0)",
        "line 3: unknown link type 'WAT' (NIC0-GPU0)",
    ]
