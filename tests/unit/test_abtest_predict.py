"""The virtual-time prediction of an embedded ab-test run, and the fidelity warnings."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from kvops.abtest.embedded import EmbeddedEngines, SimProfile
from kvops.abtest.experiment import Options
from kvops.abtest.metrics import compute_metrics
from kvops.abtest.predict import (
    FIDELITY_TOLERANCE,
    embedded_arms,
    fidelity_warnings,
    predict,
    run_capped,
)
from kvops.abtest.result_types import MeasuredArm, PredictedFigures, ScenarioResult
from kvops.report.abtest_files import kv_memory_note
from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.records import Request
from kvops.workload.generate import Alphabet
from kvops.workload.spec import load_preset, spec_from_dict

PROFILE = {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "storage": "ontap-nfs-rdma-200g"}


def test_prediction_reproduces_the_multi_prefix_gain_in_wall_units() -> None:
    scale = 0.05
    spec = load_preset("multi-shared-prefix").scaled(scale)
    alphabet = Alphabet.from_vocab_size(128_256)
    options = Options(trials=2, warmup_iterations=1)
    slow = predict([spec], embedded_arms(scale), options, alphabet, PROFILE, 1.0)
    fast = predict([spec], embedded_arms(scale), options, alphabet, PROFILE, 0.5)
    assert slow is not None and fast is not None
    base, off = slow[spec.name]["baseline"], slow[spec.name]["offload"]
    assert off.total_token_throughput_tok_s is not None
    assert base.total_token_throughput_tok_s is not None
    assert off.mean_ttft_ms is not None and base.mean_ttft_ms is not None
    assert off.total_token_throughput_tok_s > 1.5 * base.total_token_throughput_tok_s
    assert off.mean_ttft_ms < base.mean_ttft_ms
    # wall units: half the time scale halves the latencies and doubles the throughput
    fast_ttft = fast[spec.name]["baseline"].mean_ttft_ms
    assert fast_ttft is not None and abs(fast_ttft * 2 - base.mean_ttft_ms) < 1e-6
    assert base.completed == spec.batch_size * (spec.iterations - 1) * 2


def test_text_prompts_are_not_predicted() -> None:
    spec = load_preset("unique-one-shot").scaled(0.01)
    text = Alphabet(words=("a", "b"))
    assert predict([spec], embedded_arms(0.01), Options(), text, PROFILE, 1.0) is None


def test_fidelity_warning_only_beyond_the_tolerance() -> None:
    pred = {"s": {"baseline": PredictedFigures(1000.0, mean_ttft_ms=100.0, mean_itl_ms=None)}}

    def measured(ttft: float) -> dict[str, ScenarioResult]:
        metrics = compute_metrics([])
        metrics.mean_ttft_ms, metrics.total_token_throughput_tok_s = ttft, 1000.0
        arm = MeasuredArm(metrics, 0, {}, 0, [], [])
        return {"s": ScenarioResult(spec_from_dict({"name": "s"}), "", {"baseline": arm}, [])}

    inside = 100.0 * (1 + FIDELITY_TOLERANCE) - 1
    assert fidelity_warnings(measured(inside), pred) == []
    (warning,) = fidelity_warnings(measured(150.0), pred)
    assert "baseline mean_ttft_ms" in warning and "+50%" in warning


def test_the_embedded_offload_engine_follows_the_sim_profile(tmp_path: Path) -> None:
    """--sim-cpu-tier-gb / --sim-gds-buffer-mib reach the offload engine's LMCache file and
    the prediction's engine alike (one configuration, two readers)."""
    profile = SimProfile(cpu_tier_gb=2.5, gds_buffer_mib=1024)
    written = yaml.safe_load(EmbeddedEngines(tmp_path, 0.1, profile).lmcache_config().read_text())
    assert written["local_cpu"] is True and written["max_local_cpu_size"] == 2.5
    assert written["gds_buffer_size"] == 1024 and written["gds_path"]
    baseline, offload = embedded_arms(0.1, profile)
    assert offload.settings.lmcache.local_cpu and offload.settings.lmcache.max_local_cpu_size == 2.5
    assert offload.settings.lmcache.staging_buffer_mib == 1024
    # both arms have the same fixed KV memory; the buffer lives beside it, not inside it
    assert offload.settings.gds_buffer_reserved_mib == 0
    assert baseline.settings.gds_buffer_reserved_mib == 0
    assert offload.settings.kv_cache_memory_bytes == baseline.settings.kv_cache_memory_bytes
    default = yaml.safe_load(EmbeddedEngines(tmp_path, 0.1).lmcache_config().read_text())
    assert default["local_cpu"] is False and default["gds_buffer_size"] == 8192


def test_the_report_names_each_arms_kv_memory() -> None:
    offload = {"num_gpu_blocks": "2376", "block_size": "16", "lmcache_gds_buffer_mib": "8192",
               "lmcache_local_cpu_gb": "2.5"}  # fmt: skip
    note = kv_memory_note(offload)
    assert "2376 GPU KV blocks of 16 tokens" in note
    assert "GDS buffer 8192 MiB taken from the KV cache" in note and "CPU tier 2.5 GB" in note
    baseline = {"num_gpu_blocks": "2786", "block_size": "16", "lmcache_gds_buffer_mib": "0",
                "lmcache_local_cpu_gb": "0"}  # fmt: skip
    plain = kv_memory_note(baseline)
    assert "GDS" not in plain and "CPU" not in plain


def _engine_and_requests(arrivals_s: list[float]) -> tuple[Any, list[Request]]:
    engine = build_engine(PROFILE["model"], PROFILE["gpu"], PROFILE["storage"], EngineSettings())
    reqs = [Request(f"r{i}", t, list(range(1, 513)), 8) for i, t in enumerate(arrivals_s)]
    return engine, reqs


def test_a_capped_client_releases_the_next_request_when_one_finishes() -> None:
    engine, reqs = _engine_and_requests([0.0, 0.0, 0.0, 5.0])
    one_at_a_time = run_capped(engine, reqs, 1)
    for before, after in itertools.pairwise(one_at_a_time):
        assert before.finish_s is not None
        assert after.arrival_s >= before.finish_s  # waited for the slot
    assert one_at_a_time[-1].arrival_s == 5.0  # a slot was free before its own release time
    engine, reqs = _engine_and_requests([0.0, 0.0, 0.0, 5.0])
    uncapped = run_capped(engine, reqs, None)
    assert [r.arrival_s for r in uncapped] == [0.0, 0.0, 0.0, 5.0]
