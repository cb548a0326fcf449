"""A storage fault mid-run costs no request and ab-test reports the failed loads (issue 25).

Two `kvops sim serve` engines over real HTTP, the offload one on a GDS directory. Once the
offload arm's first segment is done, every chunk file it has written is truncated as soon as it
is complete (what a lost or damaged export does to a running service). The sim reads a chunk's
files back before loading it, as LMCache's GDS backend does: an unreadable one is a failed load,
logged in LMCache's and vLLM's words and recomputed (`kv_load_failure_policy: recompute`). The
run must finish with zero failed requests, and results.json, report.md and the terminal summary
must say how many loads failed, in which trial, and that the verdict includes them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sim_server import sim_server
from test_abtest_preconditions import SMALL_GPU, WORKLOAD


def _truncate_chunks_once_offload_ran(run: Path, gds: Path, stop: threading.Event) -> list[Path]:
    """Wait for the offload arm's first finished segment, then truncate each complete chunk
    data file under `gds` until stopped; returns the files it truncated."""
    hit: list[Path] = []

    def offload_segment_done() -> bool:
        segments = run / "segments.jsonl"
        with contextlib.suppress(OSError):
            for line in segments.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    if json.loads(line).get("arm") == "offload":
                        return True
        return False

    def work() -> None:
        while not stop.wait(0.05):
            if offload_segment_done():
                break
        while not stop.wait(0.02):
            for path in gds.rglob("*.kvcache.safetensors"):
                with contextlib.suppress(OSError):
                    if path.stat().st_size > 0:
                        os.truncate(path, 0)
                        hit.append(path)

    threading.Thread(target=work, daemon=True).start()
    return hit


@pytest.mark.timeout(400)
def test_unreadable_chunk_files_mid_run_lose_no_request_and_are_reported(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "run"
    gds = tmp_path / "gds"
    log = tmp_path / "offload.log"
    stop = threading.Event()
    with (
        sim_server(None, tmp_path / "base.log", *SMALL_GPU) as base,
        sim_server(gds, log, *SMALL_GPU) as offload,
    ):
        truncated = _truncate_chunks_once_offload_ran(out, gds, stop)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={base}",
                 "--arm", f"offload={offload}", "--workload", str(workload), "--trials", "2",
                 "--out", str(out), "--service-log", f"offload={log}"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        finally:
            stop.set()
    assert truncated, "no chunk file was truncated"
    # zero failed requests: vLLM's recompute policy, as the sim models it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    sc = doc["scenarios"]["reuse"]
    assert all(sc["arms"][a]["errors_total"] == 0 for a in ("baseline", "offload"))
    assert "failed_loads" not in sc["arms"]["baseline"]  # no log, no counter: not reported
    failed = sc["arms"]["offload"]["failed_loads"]
    assert failed["failed_loads"] > 0, failed
    assert failed["requests_recomputed"] == failed["failed_loads"], failed
    assert failed["tokens_recomputed"] > 0, failed
    assert failed["lmcache_read_errors"] >= failed["failed_loads"], failed
    assert failed["sources"] == [f"service log {log}"]
    # per segment: the offload arm's first trial ran before the fault, its second after it
    per_trial = {t["trial"]: t["failed_loads"] for t in failed["per_trial"]}
    assert per_trial[0] == 0 and per_trial[1] == failed["failed_loads"], per_trial
    assert any("GDS read failed for" in x for x in failed["examples"]), failed["examples"]
    warning = next(w for w in doc["warnings"] if "failed KV load" in w)
    assert "arm offload" in warning and "verdict include" in warning, warning
    assert "failed KV loads, offload: at least" in (out / "report.md").read_text()
    assert "failed KV loads, offload: at least" in proc.stdout
    assert "Recovered from KV load failure" in log.read_text()
