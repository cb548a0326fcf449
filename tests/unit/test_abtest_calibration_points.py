"""`kvops advise --calibrate` on directories that hold no measured point: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.abtest.calibration_points import PointsError, load_points
from kvops.cli import main

pytestmark = pytest.mark.unit


def test_bad_run_directories_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(PointsError, match="no such run directory"):
        load_points([tmp_path / "missing"])
    with pytest.raises(PointsError, match="not a finished kvops ab-test run"):
        load_points([tmp_path])
    (tmp_path / "run.json").write_text("{not json")
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(PointsError, match="cannot read this run"):
        load_points([tmp_path])
    got = CliRunner().invoke(main, ["advise", "--calibrate", str(tmp_path / "missing")])
    assert got.exit_code == 2
    assert got.output.strip().splitlines() == [
        f"kvops advise calibrate: error: {tmp_path / 'missing'}: no such run directory"
    ]
