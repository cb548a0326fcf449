"""A/A: one simulated engine against itself must read "no significant difference" on every
metric (DESIGN: "An A/A run must read no significant difference"). Both arms are the same
server; `/reset_prefix_cache` gives every segment the same cold GPU cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from measuring import ahead_of_the_lab_groups
from sim_server import sim_server

WORKLOAD = """\
name: aa
num_prefixes: 4
prefix_tokens: 1024
prompt_tokens: 1280
output_tokens: 8
batch_size: 8
iterations: 3
"""


# Judged on wall-clock timings: each metric's 95% interval over 4 paired trials lies wholly beyond
# +-2% by chance, so with 7 metrics judged some one of them reads "helps" or "hurts" in about one
# A/A in seven (3 of 20 runs of this test on a quiet 2-core machine, never the primary metric;
# one CI-mode run read mean TTFT "helps" -8.9% [-10.9%, -6.9%] with one server in both arms). A
# known limit of per-metric verdicts, not of this test: the rerun makes a failure need two.
@pytest.mark.timing
@pytest.mark.timeout(600)
def test_one_engine_against_itself_shows_no_difference(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "run"
    # measured ahead of the lab groups, as every timing judged beside them (tests/measuring.py):
    # in a CI-mode run on a cold machine (the engine virtualenv installing, both lab groups
    # converging) the simulated engine sent its tokens 45-53% of its mean TTFT late, and one
    # A/A read total throughput "hurts" -47% [-70%, -6%] on both tries.
    with (
        ahead_of_the_lab_groups(),
        sim_server(None, tmp_path / "sim.log", "--time-scale", "0.2") as url,
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kvops", "ab-test", "--arm", f"a={url}", "--arm", f"b={url}",
             "--workload", str(workload), "--trials", "4", "--out", str(out)],
            capture_output=True, text=True, timeout=500,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    comparisons = doc["scenarios"]["aa"]["comparisons"]
    assert len(comparisons) == 8
    verdicts = {c["metric"]: c["verdict"] for c in comparisons}
    # 16 measured requests per trial: a trial's p99 is about its slowest request, so no verdict
    # on it (one stalled request made this run read p99 TTFT "hurts" +15% [4..28%] before).
    p99 = verdicts.pop("p99_ttft_ms")
    assert p99 == "too few requests (16 per trial; p99_ttft_ms needs 500)", p99
    assert set(verdicts.values()) == {"no significant difference"}, verdicts
    assert all(c["resample_unit"] == "paired trials (4)" for c in comparisons)
