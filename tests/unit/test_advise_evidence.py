"""`--storage-from-evidence`: storage figures from the gdsio runs of a saved validate bundle
(recorded gdsio output over NetApp ONTAP NFS/RDMA, tests/fixtures/gdsio/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from evidence_builders import command, edited

from kvops.advise.storage_evidence import (
    GB_PER_GIB,
    StorageEvidenceError,
    storage_from_documents,
    storage_from_evidence,
)
from kvops.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures" / "evidence"
LARGE_READ = (
    "IoType: READ XferType: GPUD Threads: 8 DataSetSize: 8388608/8388608(KiB) IOSize: 1024(KiB) "
    "Throughput: 8.000000 GiB/sec, Avg_Latency: 1100.000000 usecs ops: 8192 total_time 1.0 secs\n"
)


def test_recorded_bundle_gives_its_gdsio_figures() -> None:
    m = storage_from_evidence(FIXTURES / "healthy")
    # RANDREAD 4K GPUD: 0.569229 GiB/s; WRITE 1M GPUD: 2.547637 GiB/s; 4K latency 214.448 us.
    assert m.profile.read_bandwidth_gb_s == pytest.approx(0.569229 * GB_PER_GIB)
    assert m.profile.write_bandwidth_gb_s == pytest.approx(2.547637 * GB_PER_GIB)
    assert m.profile.io_latency_us == pytest.approx(214.448246)
    assert m.host == "netapp-rdma-ok"
    assert any("understates chunk-sized transfers" in n for n in m.notes)


def test_large_reads_preferred_and_latency_estimated() -> None:
    doc = edited(gdsio_read=command(["gdsio"], LARGE_READ), gdsio_write=None)
    m = storage_from_documents([doc], "bundle")
    assert m.profile.read_bandwidth_gb_s == pytest.approx(8 * GB_PER_GIB)
    # One 1 MiB I/O at 8 GiB/s shared by 8 threads takes 976.5625 us of its 1100 us.
    assert m.profile.io_latency_us == pytest.approx(1100 - 976.5625)
    assert m.profile.write_bandwidth_gb_s == m.profile.read_bandwidth_gb_s
    assert any("write bandwidth taken equal to read" in n for n in m.notes)


def test_fleet_skips_compat_mode_bench_and_uses_the_slowest_reader() -> None:
    fast = edited(gdsio_read=command(["gdsio"], LARGE_READ))
    fast["host"] = "fast"
    m = storage_from_evidence(FIXTURES / "fleet")
    assert m.host != "compat-only"
    assert any("compat-only skipped" in n and "GDS-051" in n for n in m.notes)
    both = storage_from_documents([fast, edited()], "bundle")
    assert both.host == "netapp-rdma-ok"  # 0.61 GB/s reads beat by 8.6 GB/s: the slow one counts


def test_no_bench_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    doc = edited(gdsio_read=None, gdsio_write=None)
    with pytest.raises(StorageEvidenceError, match="--storage-bench"):
        storage_from_documents([doc], "bundle")
    with pytest.raises(StorageEvidenceError, match=r"no \*\.json evidence files"):
        storage_from_evidence(tmp_path)


def test_cli_uses_measured_storage_in_sizing_and_trace() -> None:
    bundle = str(FIXTURES / "healthy")
    args = ["--prefix-tokens", "28000", "--num-prefixes", "20", "--json"]
    sized = CliRunner().invoke(main, ["advise", "sizing", *args, "--storage-from-evidence", bundle])
    assert sized.exit_code == 0, sized.output
    data = json.loads(sized.stdout)
    assert data["storage"] == "measured:netapp-rdma-ok"
    assert data["storage_read_gb_s"] == pytest.approx(0.569229 * GB_PER_GIB)
    # 0.61 GB/s is far below the 3.05 GB/s break-even: offload must not be advised.
    result = CliRunner().invoke(
        main,
        ["advise", "multi-shared-prefix", "--quick", "--json", "--storage-from-evidence", bundle],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["profiles"]["storage"] == "measured:netapp-rdma-ok"
    assert report["verdict"] != "helps"
    assert any(n.startswith("storage measured on netapp-rdma-ok") for n in report["notes"])
    bad = CliRunner().invoke(main, ["advise", "sizing", *args, "--storage-from-evidence", "/nope"])
    assert bad.exit_code == 2 and "not a directory" in bad.output
