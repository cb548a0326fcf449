"""Predict first, score after, recalibrate (issue 27), on embedded engines whose prediction
profile was deliberately mis-set: every campaign point's prediction is on disk before its
first request, results.json and campaign.json score it, and `kvops advise --calibrate` fitted
on some points improves the score on a point it held back. The same campaign finds the
crossover where the prefixes' KV outgrows the GPU KV capacity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.advise.calibrate import hold_out
from kvops.cli.advise import advise
from kvops.sim.profiles import load_storage
from kvops.workload.record import read_records

# The engines' storage is ontap-nfs-rdma-200g (21.25 GB/s read); the prediction is told 1 GB/s.
MIS_SET = """kind: storage
name: mis-set-slow
read_bandwidth_gb_s: 1.0
write_bandwidth_gb_s: 18.75
io_latency_us: 200
capacity_gb: null
"""
VALUES = (5, 20, 40)


@pytest.mark.timeout(300)
def test_a_mis_set_prediction_is_scored_and_calibration_improves_it_on_held_back_points(
    tmp_path: Path,
) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text(MIS_SET)
    out = tmp_path / "camp"
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--scenario", "multi-shared-prefix",
         "--scale", "0.02", "--trials", "2", "--seed", "7",
         "--sweep", "num_prefixes=" + ",".join(map(str, VALUES)),
         "--predict-storage", str(slow), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    campaign = json.loads(proc.stdout)
    for v in VALUES:
        point = out / f"num_prefixes={v}"
        written = (point / "prediction.json").stat().st_mtime
        first_sent = min(r.send_time_unix_s for r in read_records(point / "records.jsonl"))
        assert written <= first_sent  # predicted before anything was measured
        prediction = json.loads((point / "prediction.json").read_text())
        assert prediction["profiles"]["storage"]["name"] == "mis-set-slow"
        score = json.loads((point / "results.json").read_text())["prediction_score"]
        assert score["deltas_compared"] == 3 and "mis-set-slow" in score["source"]
        assert "## Prediction vs measurement" in (point / "report.md").read_text()
    assert campaign["prediction_score"]["deltas_compared"] == 3 * len(VALUES)
    assert "**Prediction**" in (out / "campaign.md").read_text()
    # the crossover sits where the working set outgrows the GPU KV capacity
    assert (campaign["crossover"]["after"], campaign["crossover"]["value"]) == (5, 20)
    assert campaign["gpu_capacity"].startswith(
        "the working set outgrows the GPU KV capacity between num_prefixes = 5 and 20"
    )
    assert campaign["crossover_vs_capacity"].startswith("the crossover and the capacity crossing")

    # hold back the largest point: fit on the others, predict beyond them
    seed = next(s for s in range(100) if hold_out(len(VALUES), 1, s) == [len(VALUES) - 1])
    cal = tmp_path / "cal"
    got = CliRunner().invoke(advise, [
        "--calibrate", str(out), "--hold-out", "1", "--seed", str(seed), "--max-evals", "24",
        "--out", str(cal), "--json",
    ])  # fmt: skip
    assert got.exit_code == 0, got.output[-2000:]
    report = json.loads(got.stdout)
    assert [h.split()[-1] for h in report["held_back"]] == ["multi-shared-prefix@num_prefixes=40"]
    before, after = report["score_held_back_before"], report["score_held_back_after"]
    assert after["mean_abs_error_pp"] < before["mean_abs_error_pp"]
    assert after["verdict_agreement_share"] >= before["verdict_agreement_share"]
    # the fit moved the storage toward the engines' real (faster) storage
    calibrated = load_storage(str(cal / "storage.yaml"))
    assert calibrated.read_bandwidth_gb_s > 1.0
    assert calibrated.read_bandwidth_gb_s == report["figures_after"]["storage.read_bandwidth_gb_s"]
