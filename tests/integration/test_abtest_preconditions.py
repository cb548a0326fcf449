"""An offload arm whose connector never loads reads "offload never engaged", not "no
significant difference" (issue 27), on real HTTP against `kvops sim serve`, and `kvops explain`
names why. The arm declares LMCache but its chunks (4096 tokens) are longer than every prompt:
LMCache stores only full chunks, so nothing is ever stored or loaded. A third arm with
LMCache's default 256-token chunks on a GDS directory is the control: it does load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_server import sim_server

WORKLOAD = """\
name: reuse
num_prefixes: 8
prefix_tokens: 1024
prompt_tokens: 1280
output_tokens: 4
batch_size: 8
iterations: 3
"""
# 400 blocks of 16 tokens: 6,400 tokens of GPU KV against a working set of 8 x 1,024 prefix
# tokens + 8 requests x 260 of their own = 10,272 tokens, so reuse must come from offload
SMALL_GPU = ("--time-scale", "0.2", "--num-gpu-blocks-override", "400")
LONG_CHUNKS = json.dumps({
    "kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
    "kv_connector_extra_config": {"lmcache.chunk_size": 4096},
})  # fmt: skip


@pytest.mark.timeout(400)
def test_an_offload_arm_that_never_loads_reads_never_engaged(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "run"
    with (
        sim_server(None, tmp_path / "base.log", *SMALL_GPU) as base,
        sim_server(None, tmp_path / "never.log", *SMALL_GPU, "--kv-transfer-config",
                   LONG_CHUNKS) as never,
        sim_server(tmp_path / "gds", tmp_path / "good.log", *SMALL_GPU) as good,
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={base}",
             "--arm", f"never={never}", "--arm", f"good={good}", "--workload", str(workload),
             "--trials", "2", "--out", str(out)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offload never engaged" in proc.stdout
    sc = json.loads((out / "results.json").read_text())["scenarios"]["reuse"]
    assert sc["verdict"] == "offload never engaged"
    status = {(p["check"], p["arm"]): p["status"] for p in sc["checks"]["preconditions"]}
    assert status[("working_set", "baseline")] == "ok"  # it does not fit: offload could help
    assert status[("offload_engaged", "never")] == "failed"
    assert status[("offload_engaged", "good")] == "ok"
    tokens = sc["checks"]["token_sources"]
    assert tokens["never"]["offload_tokens"] == 0 and tokens["never"]["stored_tokens"] == 0
    assert tokens["good"]["offload_tokens"] > 0
    # the good arm's own comparison keeps its measured verdict
    good = {c["metric"]: c for c in sc["comparisons"] if c["candidate_arm"] == "good"}
    assert "never engaged" not in good["mean_ttft_ms"]["verdict"]
    assert "## reuse: offload never engaged" in (out / "report.md").read_text()
    explained = subprocess.run(
        [sys.executable, "-m", "kvops", "explain", str(out), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert explained.returncode == 0, explained.stderr
    why = json.loads(explained.stdout)["scenarios"]["reuse"]["explanations"]
    never_why = next(e for e in why if e["arm"] == "never")
    assert never_why["cause"] == "never_engaged"
    assert "stored nothing either" in never_why["line"]
