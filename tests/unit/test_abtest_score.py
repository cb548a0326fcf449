"""The prediction's score (kvops.abtest.score, kvops.abtest.prediction): the error of the
predicted relative deltas in percentage points, verdict agreement counted only on measured
claims, the campaign's pooled score, and results.json with and without it (issue 27)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kvops.abtest.campaign import PointResult, campaign_score
from kvops.abtest.embedded import SimProfile
from kvops.abtest.experiment import Options
from kvops.abtest.prediction import (
    MAX_PREDICTED_REQUESTS,
    PredictionProfiles,
    RunPrediction,
    ScenarioPrediction,
    predict_deltas,
    predicted_verdict,
    score_run,
)
from kvops.abtest.result_types import Comparison, RunResults
from kvops.abtest.score import MetricScore, PredictionScore, Score, score_metrics, summarize
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.workload.spec import load_preset

pytestmark = pytest.mark.unit


def test_the_error_is_the_distance_between_deltas_in_points() -> None:
    m = MetricScore("total_token_throughput_tok_s", 40.0, 55.0, "helps", "helps")
    assert m.error_pp == pytest.approx(15.0)
    assert m.verdicts_agree is True
    worse = MetricScore("mean_ttft_ms", -10.0, 5.0, "helps", "no significant difference")
    assert worse.error_pp == pytest.approx(15.0) and worse.verdicts_agree is False
    assert MetricScore("mean_itl_ms", None, 3.0, "not enough data", "helps").error_pp is None


def test_only_measured_claims_count_as_verdicts() -> None:
    scores = [
        MetricScore("a", 10.0, 20.0, "helps", "helps"),
        MetricScore("b", 0.0, 4.0, "no significant difference", "hurts"),
        MetricScore("c", 1.0, 2.0, "no significant difference", "not enough trials"),
    ]
    s = summarize(scores)
    assert s.mean_abs_error_pp == pytest.approx((10 + 4 + 1) / 3)
    assert (s.deltas_compared, s.verdicts_compared) == (3, 2)
    assert s.verdict_agreement_share == pytest.approx(0.5)
    assert s.text() == "mean abs error 5.0 pp over 3 deltas; verdicts agree 1/2"
    assert summarize([]) == Score(None, 0, None, 0)


def test_a_deterministic_prediction_reads_a_verdict_beyond_the_smallest_effect() -> None:
    assert predicted_verdict(2.5, True) == "helps"
    assert predicted_verdict(-2.5, True) == "hurts"
    assert predicted_verdict(-2.5, False) == "helps"  # a TTFT that drops
    assert predicted_verdict(1.9, True) == "no significant difference"
    assert predicted_verdict(None, True) == "not enough data"


def _comparison(metric: str, delta: float, verdict: str, cand: str = "offload") -> Comparison:
    return Comparison(metric, "baseline", cand, 1.0, 1.0, delta, None, None, verdict,
                      metric.endswith("_s"), "paired trials (2)")  # fmt: skip


def _profiles() -> PredictionProfiles:
    return PredictionProfiles(
        load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
    )


def test_a_run_is_scored_against_its_first_candidate_only() -> None:
    pred = RunPrediction(_profiles(), {"s": ScenarioPrediction("baseline", "offload", {
        "total_token_throughput_tok_s": {"delta_pct": 100.0, "verdict": "helps"},
        "mean_ttft_ms": {"delta_pct": -50.0, "verdict": "helps"},
    })})  # fmt: skip
    measured = {"s": [
        _comparison("total_token_throughput_tok_s", 80.0, "helps"),
        _comparison("mean_ttft_ms", -60.0, "no significant difference"),
        _comparison("total_token_throughput_tok_s", -99.0, "hurts", cand="other"),
    ]}  # fmt: skip
    score = score_run(pred, measured)
    assert score is not None
    s = score.score
    assert s.mean_abs_error_pp == pytest.approx(15.0)  # (20 + 10) / 2, the other arm ignored
    assert (s.verdicts_compared, s.verdict_agreement_share) == (2, 0.5)
    assert score_run(RunPrediction(_profiles(), unavailable="rate mode"), measured) is None
    # metrics predicted but never measured are not scored
    assert score_metrics({"x": (1.0, "helps")}, {}) == []


def test_the_campaign_score_pools_every_points_deltas() -> None:
    a = PointResult(5, "a", "complete", "helps", prediction_error_pp=10.0, prediction_deltas=3,
                    prediction_verdicts_agree=3, prediction_verdicts=3)  # fmt: skip
    b = PointResult(10, "b", "complete", "helps", prediction_error_pp=40.0, prediction_deltas=1,
                    prediction_verdicts_agree=0, prediction_verdicts=2)  # fmt: skip
    s = campaign_score([a, b, PointResult(20, "c", "pending")])
    assert s is not None
    assert s.mean_abs_error_pp == pytest.approx((10 * 3 + 40) / 4)
    assert (s.deltas_compared, s.verdicts_compared) == (4, 5)
    assert s.verdict_agreement_share == pytest.approx(3 / 5)
    assert campaign_score([PointResult(5, "a", "pending")]) is None


def _doc() -> dict[str, object]:
    client = {"dispatch_lag_mean_ms": 0.0, "dispatch_lag_p99_ms": 0.0, "dispatch_lag_max_ms": 0.0,
              "loop_lag_mean_ms": 0.0, "loop_lag_p99_ms": 0.0, "max_in_flight": 1, "workers": 1,
              "ttft_error_share": None, "bottleneck": False, "bottleneck_reason": None}  # fmt: skip
    return {"schema_version": 1, "kvops_version": "0", "status": "complete", "status_detail": "",
            "run_dir": "r", "arms": [], "embedded_engines": True, "options": {}, "warnings": [],
            "scenarios": {}, "client": client}  # fmt: skip


def test_results_json_carries_the_score_and_older_documents_still_read() -> None:
    old = RunResults.from_json(_doc())  # written before predictions: no prediction_score
    assert old.prediction_score is None and "prediction_score" not in old.to_json()
    score = PredictionScore("model m", {})
    score.scenarios["s"] = score_run(
        RunPrediction(
            _profiles(),
            {
                "s": ScenarioPrediction(
                    "baseline",
                    "offload",
                    {"mean_ttft_ms": {"delta_pct": -50.0, "verdict": "helps"}},
                )
            },
        ),
        {"s": [_comparison("mean_ttft_ms", -45.0, "helps")]},
    ).scenarios["s"]  # type: ignore[union-attr]
    old.prediction_score = score
    text = old.to_text()
    back = RunResults.from_text(text)
    assert back.prediction_score is not None
    assert back.prediction_score.score.mean_abs_error_pp == pytest.approx(5.0)
    assert back.to_text() == text
    assert json.loads(text)["prediction_score"]["verdict_agreement_share"] == 1.0


def test_the_prediction_follows_the_storage_it_is_given() -> None:
    spec = load_preset("multi-shared-prefix").scaled(0.02)
    options = Options(trials=2, seed=7)
    arms = ["baseline", "offload"]
    fast = predict_deltas([spec], arms, options, _profiles(), SimProfile(), 0.02)
    primary = fast.scenarios[spec.name].metrics["total_token_throughput_tok_s"]
    assert primary["verdict"] == "helps"  # 20 prefixes overflow the GPU; storage is fast
    crawl = dataclasses.replace(_profiles(), storage=dataclasses.replace(
        _profiles().storage, read_bandwidth_gb_s=0.05))  # fmt: skip
    slow = predict_deltas([spec], arms, options, crawl, SimProfile(), 0.02)
    slow_primary = slow.scenarios[spec.name].metrics["total_token_throughput_tok_s"]
    assert slow_primary["delta_pct"] < primary["delta_pct"] and slow_primary["verdict"] == "hurts"
    huge = dataclasses.replace(spec, iterations=MAX_PREDICTED_REQUESTS)
    assert "more than" in str(
        predict_deltas([huge], arms, options, _profiles(), None, 1).unavailable
    )


def test_rate_mode_is_predicted_on_the_clients_arrival_schedule() -> None:
    """An open-loop rate below what either arm can serve: both arms keep up, throughput is the
    offered load and offload cannot raise it (only the prefill of each request is faster);
    at a rate past the baseline's capacity offload serves more."""
    spec = load_preset("multi-shared-prefix").scaled(0.02)
    options = Options(trials=2, seed=7)

    def throughput(rate: float) -> dict[str, Any]:
        point = dataclasses.replace(spec, rate=rate)
        prediction = predict_deltas(
            [point], ["baseline", "offload"], options, _profiles(), SimProfile(), 0.02
        )
        assert prediction.unavailable is None, prediction.unavailable
        return prediction.scenarios[spec.name].metrics["total_token_throughput_tok_s"]

    light, saturating = throughput(2.0), throughput(1000.0)
    assert light["verdict"] == "no significant difference" and abs(light["delta_pct"]) < 1, light
    assert saturating["verdict"] == "helps" and saturating["delta_pct"] > 10, saturating
