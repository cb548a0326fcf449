"""No state leaks between runs: `unique-one-shot` twice against the same two simulated engines
(the offload one with an LMCache GDS directory, which keeps every chunk across runs and
`/reset_prefix_cache`) gains nothing the second time; repeating a run's `--seed` on purpose
repeats its prompts, and the warm tier is then named loudly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_server import sim_server

WORKLOAD = """\
name: unique-one-shot
num_prefixes: 0
prompt_tokens: 1024
output_tokens: 4
batch_size: 4
iterations: 2
"""


def _ab_test(tmp_path: Path, name: str, base: str, cand: str, *extra: str) -> dict:  # type: ignore[type-arg]
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={base}",
         "--arm", f"offload={cand}", "--workload", str(workload), "--trials", "2",
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict = json.loads((out / "results.json").read_text())  # type: ignore[type-arg]
    doc["stderr"] = proc.stderr
    return doc


def _offload_share(doc: dict) -> float:  # type: ignore[type-arg]
    metrics = doc["scenarios"]["unique-one-shot"]["arms"]["offload"]["metrics"]
    return float(metrics["cached_token_share"])


@pytest.mark.timeout(600)
def test_a_second_run_gains_nothing_and_a_repeated_seed_is_named(tmp_path: Path) -> None:
    fast = ("--time-scale", "0.2")
    with (
        sim_server(None, tmp_path / "base.log", *fast) as base,
        sim_server(tmp_path / "gds", tmp_path / "off.log", *fast) as cand,
    ):
        first = _ab_test(tmp_path, "first", base, cand)
        second = _ab_test(tmp_path, "second", base, cand)
        seed = first["options"]["seed"]
        repeat = _ab_test(tmp_path, "repeat", base, cand, "--seed", str(seed))
    assert any((tmp_path / "gds").rglob("*")), "the offload engine wrote no GDS chunk files"
    assert second["options"]["seed"] != seed
    for doc in (first, second):
        assert _offload_share(doc) < 0.05
        assert not any("WARM CACHE TIER" in w for w in doc["warnings"])
    assert _offload_share(repeat) > 0.5
    warned = [w for w in repeat["warnings"] if "WARM CACHE TIER" in w]
    assert warned and "arm offload" in warned[0] and "GDS directory" in warned[0]
    assert "WARM CACHE TIER" in repeat["stderr"]
