"""`kvops parse`: JSON out, exit codes, and no traceback on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kvops.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures"


def run(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["parse", *args], input=stdin)
    return result.exit_code, result.output


def test_gdscheck_modes_as_json() -> None:
    path = FIXTURES / "gdscheck" / "nvidia-docs-l4-rhel9-gds1.16-nfs-compat.txt"
    code, out = run("gdscheck", str(path))
    assert code == 0
    assert json.loads(out)["drivers"]["NFS"] == ["compat"]


def test_gdsio_from_stdin() -> None:
    text = (FIXTURES / "gdsio" / "openshift-l40s-netapp-nfs-rdma.txt").read_text()
    code, out = run("gdsio", "-", stdin=text)
    assert code == 0
    assert [r["throughput_gib_s"] for r in json.loads(out)["results"]] == [
        0.34494,
        0.569229,
        2.547637,
    ]


def test_nvfs_stats_and_mounts() -> None:
    code, out = run(
        "nvfs-stats", str(FIXTURES / "nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt")
    )
    assert code == 0 and json.loads(out)["peerdirect_supported"] is True
    code, out = run("mounts", str(FIXTURES / "misc/mount-nfs4-rdma-netapp-ontap.txt"))
    assert code == 0 and json.loads(out)["mounts"][0]["options"]["proto"] == "rdma"


def test_cufile_syntax_error_exits_1_with_position() -> None:
    code, out = run("cufile", "-", stdin='{\n  "logging": {,}\n}\n')
    assert code == 1
    assert json.loads(out)["error"].startswith("line 2 column 15")


def test_unreadable_file_is_a_clear_error_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "parse", "gdsio", str(tmp_path / "nope.txt")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Could not open file" in proc.stderr and "No such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rdma_tools_and_topo_subcommands() -> None:
    code, out = run("ibdev2netdev", str(FIXTURES / "misc/ibdev2netdev-dgx-a100-nvidia-docs.txt"))
    links = json.loads(out)["links"]
    assert code == 0 and len(links) == 12
    assert {"device": "mlx5_10", "netdev": "ibp225s0f0", "state": "Down", "up": False}.items() <= (
        links[2].items()
    )
    code, out = run("show-gids", str(FIXTURES / "misc/show_gids-mlx5.txt"))
    gids = json.loads(out)
    assert code == 0 and gids["n_gids_found"] == 4
    assert (gids["gids"][3]["ipv4"], gids["gids"][3]["version"]) == ("192.168.10.2", "v2")
    text = (FIXTURES / "misc/nvidia-smi-topo-mp-l40s-r760xa.txt").read_text()
    code, out = run("topo", "-", stdin=text)
    topo = json.loads(out)
    assert code == 0 and topo["gpus"] == ["GPU0"] and topo["nic_names"]["NIC1"] == "mlx5_1"
    assert topo["links"]["GPU0"]["NIC1"] == "NODE" and topo["warnings"] == []


def test_truncated_topo_still_exits_0_with_warnings() -> None:
    code, out = run("topo", "-", stdin="\tGPU0\tNIC0\nGPU0\t X \tPIX\n")
    topo = json.loads(out)
    assert code == 0 and topo["links"]["GPU0"]["NIC0"] == "PIX"
    assert topo["warnings"] == [
        "no row for NIC0 (output truncated?)",
        "NIC Legend missing NIC0: RDMA device names unknown (truncated?)",
    ]
