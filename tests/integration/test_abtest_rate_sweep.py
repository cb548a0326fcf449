"""A rate campaign (`kvops ab-test --sweep rate=...`) on the embedded engines: every point gets
its own paired verdict, and the prediction written before it (rate mode replayed on the
client's own arrival schedule) is scored against what it measured (issue 27)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvops.abtest.validity import NOT_FROM_OFFLOAD

VERDICTS = {"helps", "hurts", "no significant difference", NOT_FROM_OFFLOAD}


@pytest.mark.timeout(400)
def test_a_rate_sweep_gives_each_point_a_verdict_and_a_scored_prediction(tmp_path: Path) -> None:
    out = tmp_path / "rates"
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--scenario", "multi-shared-prefix",
         "--scale", "0.02", "--trials", "2", "--seed", "7", "--sweep", "rate=40,1000",
         "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    campaign = json.loads(proc.stdout)
    assert campaign["param"] == "rate" and campaign["values"] == [40.0, 1000.0]
    for point in campaign["points"]:
        assert point["status"] == "complete", point
        assert point["verdict"] in VERDICTS, point
        assert point["ci95_low_pct"] <= point["delta_pct"] <= point["ci95_high_pct"], point
        # predicted before the point ran, from the same arrival schedule, and scored after
        assert point["predicted_delta_pct"] is not None, point
        assert point["prediction_deltas"] > 0 and point["prediction_error_pp"] is not None, point
        prediction = json.loads((Path(point["run_dir"]) / "prediction.json").read_text())
        assert not prediction.get("unavailable"), prediction
    assert campaign["prediction_score"]["deltas_compared"] > 0
    assert "Crossover" in (out / "campaign.md").read_text()
