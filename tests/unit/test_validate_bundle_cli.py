"""`kvops validate --from-evidence` through the CLI: a saved bundle that FAILs exits 1 and names
each failing check per host (the README's evidence table); a bundle that cannot be read exits
2 with one line naming the file and the position, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import evidence_builders as eb
from click.testing import CliRunner, Result

from kvops.cli import main

# tests/fixtures/evidence/README.md: what each deliberately broken host FAILs
BROKEN_FAILS = {
    "compat-only": {"GDS-040", "GDS-051"},
    "tcp-fallback": {"GDS-021", "GDS-060"},
    "proprietary-driver": {"GDS-002"},
    "wrong-lmcache-buffer-key": {"GDS-061"},
}


def _validate(*args: str) -> Result:
    return CliRunner().invoke(main, ["validate", *args])


def test_a_failing_bundle_exits_1_and_names_each_failed_check_per_host() -> None:
    result = _validate("--from-evidence", str(eb.EVIDENCE_DIR / "broken"), "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    for host, expected in BROKEN_FAILS.items():
        findings = report["hosts"][host]["findings"]
        failed = {f["check_id"] for f in findings if f["severity"] == "FAIL"}
        assert failed == expected, (host, failed)


def test_a_bundle_with_a_corrupt_document_exits_2_naming_file_and_position(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(eb.EVIDENCE_DIR / "healthy", bundle)
    (bundle / "half-written.json").write_text('{"host": "gpu7", "items": {')
    result = _validate("--from-evidence", str(bundle))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("kvops validate: error: ")
    assert "half-written.json" in result.output and "line 1 column" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_directory_without_evidence_exits_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not evidence\n")
    result = _validate("--from-evidence", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("kvops validate: error: ") and "no *.json" in result.output


def test_max_fill_pct_sets_the_fill_threshold() -> None:
    healthy = str(eb.EVIDENCE_DIR / "healthy")  # its GDS file system is 51.2% full
    for option, expected in (([], "PASS"), (["--max-fill-pct", "50"], "WARN")):
        result = _validate("--from-evidence", healthy, "--json", *option)
        assert result.exit_code == 0, result.output  # a WARN does not fail the run
        findings = json.loads(result.stdout)["hosts"]["netapp-rdma-ok"]["findings"]
        [fill] = [f for f in findings if f["check_id"] == "GDS-083"]
        assert fill["severity"] == expected, fill
