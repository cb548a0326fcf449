"""`kvops validate --strict`: a CI gate must not pass on "unproven" (WARN/SKIP of the checks
that prove GDS carries the I/O), while plain runs keep WARN passing."""

from __future__ import annotations

import json
from pathlib import Path

import evidence_builders as eb
from click.testing import CliRunner

from kvops.checks.fleet import proves_path
from kvops.cli import main
from kvops.validate.judge import judge_fleet, save_evidence


def _validate(bundle: Path, *args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(main, ["validate", "--from-evidence", str(bundle), "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_path_proving_checks() -> None:
    assert all(proves_path(i) for i in ("GDS-032", "GDS-040", "GDS-043", "GDS-050", "GDS-051"))
    assert not any(proves_path(i) for i in ("GDS-031", "GDS-063", "GDS-082"))


def test_strict_fails_a_warn_of_a_path_check_that_plain_runs_pass(tmp_path: Path) -> None:
    save_evidence(tmp_path / "far", [eb.nic_across_host_bridge()])  # only GDS-043 WARN
    assert _validate(tmp_path / "far")[0] == 0
    code, report = _validate(tmp_path / "far", "--strict")
    assert code == 1 and report["unproven"] == ["nic-across-host-bridge GDS-043 WARN"]
    assert _validate(eb.EVIDENCE_DIR / "healthy", "--strict")[0] == 0


def test_strict_fails_a_run_without_the_storage_bench(tmp_path: Path) -> None:
    doc = eb.healthy()
    for item in ("gdsio_write", "gdsio_read", "nvfs_stats_before_bench", "nvfs_stats_after_bench"):
        doc["items"].pop(item)
    assert judge_fleet([doc]).exit_code() == 0
    fleet = judge_fleet([doc], strict=True)
    assert fleet.exit_code() == 1
    assert {f.check_id for f in fleet.unproven()} == {"GDS-050", "GDS-051"}


def test_misspelled_key_warn_is_not_path_proving_but_compat_is(tmp_path: Path) -> None:
    fleet = judge_fleet([eb.misspelled_cufile_key()], strict=True)  # GDS-031, GDS-032 WARN
    assert [f.check_id for f in fleet.unproven()] == ["GDS-032"]
