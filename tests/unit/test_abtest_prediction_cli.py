"""Which profiles `kvops ab-test` predicts from: the arms' own (`--sim-*`), those given for the
prediction (`--predict-gpu/--predict-storage`), or the storage a validate bundle measured
(`--storage-from-evidence`, recorded gdsio output, tests/fixtures/gdsio/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.advise.storage_evidence import GB_PER_GIB
from kvops.cli.ab_test import CliArgs, _predict_profiles, ab_test

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent.parent / "fixtures" / "evidence"


def _args(*argv: str) -> CliArgs:
    ctx = ab_test.make_context("ab-test", list(argv))
    return CliArgs(**ctx.params)


def test_the_arms_profiles_by_default() -> None:
    p = _predict_profiles(_args("--sim-storage", "ontap-nfs-rdma-400g"))
    assert (p.gpu.name, p.storage.name, p.source) == (
        "h100-sxm-80gb", "ontap-nfs-rdma-400g", "the arms' profiles"
    )  # fmt: skip


def test_measured_storage_replaces_the_profiles() -> None:
    p = _predict_profiles(_args("--storage-from-evidence", str(FIXTURES / "healthy")))
    # the bundle's GPU-direct RANDREAD 4K: 0.569229 GiB/s (test_advise_evidence.py)
    assert p.storage.read_bandwidth_gb_s == pytest.approx(0.569229 * GB_PER_GIB)
    assert "storage measured in" in p.source


def test_a_profile_file_for_the_prediction(tmp_path: Path) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("kind: storage\nname: site\nread_bandwidth_gb_s: 3.5\nwrite_bandwidth_gb_s: 2\n"
                 "io_latency_us: 900\ncapacity_gb: null\n")  # fmt: skip
    p = _predict_profiles(_args("--predict-storage", str(f)))
    assert (p.storage.name, p.storage.read_bandwidth_gb_s) == ("site", 3.5)
    got = CliRunner().invoke(
        ab_test, ["--predict-gpu", "no-such-gpu", "--out", str(tmp_path / "r")]
    )
    assert got.exit_code == 2 and "unknown gpu profile 'no-such-gpu'" in got.output
