"""`kvops advise --instances N`: the traffic over a fleet sharing the export, beside the advice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.advise.fleet import with_export
from kvops.cli import main
from kvops.sim.profiles import StorageProfile, load_storage

pytestmark = pytest.mark.unit


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "small.yaml"
    spec.write_text(
        "name: small\nnum_prefixes: 6\nprefix_tokens: 2048\nprompt_tokens: 2304\n"
        "output_tokens: 4\nbatch_size: 6\niterations: 3\n"
    )
    return spec


def test_advise_instances_adds_the_fleet(tmp_path: Path) -> None:
    spec = str(_spec(tmp_path))
    result = CliRunner().invoke(main, ["advise", spec, "--quick", "--instances", "2", "--json"])
    assert result.exit_code == 0, result.output
    fleet = json.loads(result.output)["fleet"]
    assert fleet["instances"] == 2 and fleet["requests"] == 18 and fleet["rejected"] == 0
    # round-robin: a prefix computed on one instance comes back on the other, from the export
    assert fleet["cross_instance_hit_share"] > 0
    assert fleet["bottleneck"] in ("gpu", "export")
    assert set(fleet["node_busy_share"]) == {
        "node0_read", "node1_read", "node0_write", "node1_write"
    }  # fmt: skip
    text = CliRunner().invoke(main, ["advise", spec, "--quick", "--instances", "2"])
    assert text.exit_code == 0 and "Fleet: 2 instances" in text.output
    assert "bottleneck at 2 instances" in text.output
    alone = CliRunner().invoke(main, ["advise", spec, "--quick", "--json"])
    assert "fleet" not in json.loads(alone.output)
    local = CliRunner().invoke(
        main, ["advise", spec, "--quick", "--instances", "2", "--storage", "local-nvme"]
    )
    assert local.exit_code == 2 and "shared export" in local.output


def test_measured_link_keeps_the_named_exports_nodes(tmp_path: Path) -> None:
    """A gdsio bench measures one host's link; the nodes come from --storage."""
    named = load_storage("ontap-nfs-rdma-400g")
    measured = StorageProfile("measured:h", 5.0, 4.0, 100.0, None)
    merged = with_export(measured, named)
    assert (merged.read_bandwidth_gb_s, merged.io_latency_us) == (5.0, 100.0)
    assert merged.export_nodes == named.export_nodes
    assert merged.node_read_bandwidth_gb_s == named.node_read_bandwidth_gb_s
    bundle = Path(__file__).parent.parent / "fixtures" / "evidence" / "healthy"
    args = ["advise", str(_spec(tmp_path)), "--quick", "--instances", "2", "--json"]
    result = CliRunner().invoke(main, [*args, "--storage-from-evidence", str(bundle)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["fleet"]["instances"] == 2
    assert any("export's nodes from --storage" in n for n in doc["notes"])
