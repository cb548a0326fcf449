"""The virtual-time prediction of an embedded ab-test run, and the fidelity warnings."""

from __future__ import annotations

from kvops.abtest.experiment import Options
from kvops.abtest.predict import FIDELITY_TOLERANCE, embedded_arms, fidelity_warnings, predict
from kvops.metrics import compute_metrics
from kvops.result_types import MeasuredArm, PredictedFigures, ScenarioResult
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
