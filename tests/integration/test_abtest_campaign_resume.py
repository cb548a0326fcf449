"""A campaign (`kvops ab-test --sweep`) stopped midway resumes point by point: the finished
point is not measured again, the interrupted one continues after its last complete segment,
and campaign.json ends with every point's verdict and the crossover (issue 27)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

# Runs in the lab-own group's process (tests/tiers.py): no timing verdict.
pytestmark = pytest.mark.beside_lab_own

CAMPAIGN = [sys.executable, "-m", "kvops", "ab-test", "--scenario", "multi-shared-prefix",
            "--scale", "0.02", "--trials", "2", "--seed", "7"]  # fmt: skip


def _done_segments(point: Path) -> Counter[tuple[int, str]]:
    lines = (point / "segments.jsonl").read_text().splitlines()
    docs = [json.loads(line) for line in lines]
    return Counter((d["trial"], d["arm"]) for d in docs if d.get("status") == "done")


@pytest.mark.timeout(400)
def test_a_campaign_killed_midway_resumes_without_measuring_a_point_twice(tmp_path: Path) -> None:
    out = tmp_path / "camp"
    first, second = out / "num_prefixes=1", out / "num_prefixes=20"
    proc = subprocess.Popen(
        [*CAMPAIGN, "--sweep", "num_prefixes=1,20", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 200
    while not (second / "records.jsonl").is_file() or not (second / "records.jsonl").stat().st_size:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the second point never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C while the second point is being measured
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "--resume" in stderr
    kept = (first / "records.jsonl").read_bytes()
    assert json.loads((first / "results.json").read_text())["status"] == "complete"
    assert json.loads((second / "results.json").read_text())["status"] == "interrupted"
    measured_before = _done_segments(second)

    resumed = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--resume", str(out), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (first / "records.jsonl").read_bytes() == kept  # the finished point: untouched
    for point in (first, second):  # every segment measured exactly once
        segments = _done_segments(point)
        assert set(segments) == {(t, a) for t in (0, 1) for a in ("baseline", "offload")}
        assert set(segments.values()) == {1}, segments
    assert measured_before <= _done_segments(second)
    doc = json.loads(resumed.stdout)
    assert [p["status"] for p in doc["points"]] == ["complete", "complete"]
    assert all(p["verdict"] for p in doc["points"]) and doc["crossover"]["text"]
    # one shared prefix fits in GPU memory; twenty of them do not
    assert doc["points"][0]["verdict_note"] == "fits in GPU memory: offload cannot help here"
    assert doc["points"][1]["working_set_tokens"] > doc["points"][1]["gpu_kv_capacity_tokens"]
    assert doc["gpu_capacity"].startswith(
        "the working set outgrows the GPU KV capacity between num_prefixes = 1 and 20"
    )
    md = (out / "campaign.md").read_text()
    assert "Crossover" in md and "plots/throughput-vs-p99-ttft.png" in md
    assert (out / "plots" / "throughput-vs-mean-ttft.png").stat().st_size > 1000
