"""`kvops gds prune` keeps a live GDS directory under its budget and loses no request.

Issue 28, "the store must not fill up": LMCache's GDS backend never evicts (LMCache #1724), so
an operator runs `kvops gds prune DIR --max-bytes N` from a timer while the engines write and
read the store. Here the timer is a thread that runs the real CLI again and again on the
embedded offload engine's GDS directory (`<run>/gds-offload`, kvops.abtest.embedded) while
`kvops ab-test` drives both embedded engines over HTTP. What must hold:

- the store was driven over its budget (the workload writes several times the budget) and
  prune really removed chunks, so the test can fail;
- after the last prune the directory holds at most the budget, measured here by summing the
  chunk files' sizes, not by prune's own report;
- no request failed: an engine that had indexed a chunk prune removed fails that load and
  recomputes it (vLLM `kv_load_failure_policy: recompute`), it does not fail the request;
- prune never touched a file that is not a chunk (a stray file put into the store).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kvops.gds.prune import DATA_SUFFIX, META_SUFFIX

# The multi-shared-prefix preset's shape (20 prefixes of 28,000 tokens) at --scale 0.05, as the
# deploy lab test runs it: the prefixes overflow the (equally scaled) GPU KV cache, so every
# reuse is read from the store, 5 chunks of 256 tokens (the embedded offload engine's LMCache
# chunk size) per prefix. In real time (--sim-time-scale 1) the store grows to many times the
# budget within seconds, prefixes are read back while prune removes them, and the offload
# segments last long enough for prune runs (each a fresh `kvops` process, as the role's timer
# starts it) to end among them.
WORKLOAD = """\
num_prefixes: 20
prefix_tokens: 28000
prompt_tokens: 30000
output_tokens: 4
batch_size: 20
iterations: 4
seed: 3
"""
# One chunk is a data file (4096-byte header + payload) and its .metadata copy of the header
# (kvops.sim.gds_files): ~8 KiB. 64 KiB holds 7 of the ~100 chunks each trial stores.
BUDGET = "64K"
BUDGET_BYTES = 64 * 1024


def _prune(directory: Path) -> dict[str, Any]:
    """One `kvops gds prune` run, as the role's timer runs it, but with --min-age 0s: in a
    test lasting seconds every chunk is younger than the production default of 5 minutes."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "gds", "prune", str(directory), "--max-bytes", BUDGET,
         "--min-age", "0s", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # 0: within budget after the run; 1: still over (a chunk written during the walk) — both
    # are normal while engines write; anything else (2: bad options, a traceback) is not.
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def _chunk_bytes(directory: Path) -> int:
    """Bytes of chunk files (data and metadata), what --max-bytes budgets."""
    return sum(
        p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file() and (p.name.endswith(DATA_SUFFIX) or p.name.endswith(META_SUFFIX))
    )


@pytest.mark.timeout(240)
def test_prune_keeps_a_live_store_under_budget_and_loses_no_request(tmp_path: Path) -> None:
    out = tmp_path / "run"
    gds = out / "gds-offload"
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    ab = subprocess.Popen(
        [sys.executable, "-m", "kvops", "ab-test", "--workload", str(workload), "--scale", "0.05",
         "--sim-time-scale", "1", "--trials", "2", "--seed", "5", "--out", str(out), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    reports: list[dict[str, Any]] = []
    failures: list[BaseException] = []
    finished = threading.Event()
    stray = gds / "operator-notes.txt"

    def prune_timer() -> None:
        """Prune whenever the store is over its budget, until the ab-test has finished; each
        report says whether the ab-test was still running when that prune ended."""
        try:
            while not finished.is_set():
                if gds.is_dir() and not stray.exists():
                    stray.write_text("not a chunk: prune must leave it\n")
                if gds.is_dir() and _chunk_bytes(gds) > BUDGET_BYTES:
                    report = _prune(gds)
                    report["during_ab_test"] = not finished.is_set()
                    reports.append(report)
                else:
                    finished.wait(0.05)
        except BaseException as exc:  # surfaced in the test's thread below
            failures.append(exc)

    pruner = threading.Thread(target=prune_timer, name="prune-timer", daemon=True)
    pruner.start()
    try:
        stdout, stderr = ab.communicate(timeout=200)
    finally:
        finished.set()
        pruner.join(timeout=90)
        if ab.poll() is None:
            ab.kill()
            ab.wait()
    assert not failures, failures
    assert ab.returncode == 0, stderr[-3000:]

    # The store went over its budget while the engines ran, and prune removed chunks then.
    live = [r for r in reports if r["during_ab_test"]]
    assert live, f"no prune ended while the ab-test ran ({len(reports)} in all)"
    assert all(r["bytes_found"] > BUDGET_BYTES for r in live), live
    assert sum(r["chunks_removed"] for r in live) > 0, live
    assert all(r["error_count"] == 0 for r in reports), [r["errors"] for r in reports]

    # The last prune, after the engines stopped (nothing writes any more): within budget,
    # measured by summing the files, not from prune's report.
    final = _prune(gds)
    assert final["over_budget"] is False and final["error_count"] == 0, final
    left = _chunk_bytes(gds)
    assert left <= BUDGET_BYTES, f"{left} bytes of chunks left, budget {BUDGET_BYTES}"

    # No request lost: every record completed, in both arms, in every scenario.
    doc = json.loads(stdout)
    assert json.loads((out / "results.json").read_text())["status"] == doc["status"]
    for scenario in doc["scenarios"].values():
        for name, arm in scenario["arms"].items():
            assert arm["errors_total"] == 0, (name, arm["errors_by_reason"])
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert records and all(not r.get("error") for r in records), [
        r["error"] for r in records if r.get("error")
    ][:5]
    # 2 arms x 2 trials x 4 iterations x 20 requests, warm-up included
    assert len(records) == 320
    # A reuse whose chunks prune removed after the engine indexed them is a failed load that the
    # engine recomputed (counted from its service log, kvops.abtest.failed_loads), never a
    # failed request. How many there are depends on how prune and the batches interleave: a
    # runs here had 12 to 36 in the offload arm; the count is reported, not asserted.
    offload = doc["scenarios"]["custom"]["arms"]["offload"]
    assert (offload.get("failed_loads") or {}).get("requests_failed") in (None, 0), offload

    # Only chunks went.
    assert stray.read_text() == "not a chunk: prune must leave it\n"
