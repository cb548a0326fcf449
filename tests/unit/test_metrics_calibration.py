"""Calibration: replayed as A/A, the verdicts are wrong at most 5% of the time; a real 10%
effect is found in most runs.

How: a recorded run's measured batches (tokens, durations, latencies) serve as both arms; each
replay multiplies every batch's times by injected noise - per segment (one arm's trial: host
state, drift) and per batch - drawn from a seeded generator, many replays at once (vectorised).
The per-trial figures use the same definitions as `compute_metrics` (checked against it on one
replay), and the intervals and verdicts come from the production functions.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from kvops.abtest.metrics import (
    HELPS,
    HURTS,
    MIN_EFFECT_PCT,
    compare_arms,
    compute_metrics,
    judge,
    paired_log_ci,
)
from kvops.workload.record import RequestRecord, read_records

pytestmark = pytest.mark.unit
FIXTURE = (
    Path(__file__).parent.parent / "fixtures" / "abtest" / "multi-shared-prefix-baseline.jsonl"
)
REPLAYS = 2000
# sampling slack on a 5% rate over 2000 replays: 3 standard deviations ~ 1.5%
ALLOWED_FALSE_RATE = 0.05 + 0.015


def _batches() -> tuple[np.ndarray, dict[tuple[int, int], list[RequestRecord]]]:
    """[trial, batch, (tokens, span_s, ttft_sum_ms, n)] from the recorded run."""
    groups: dict[tuple[int, int], list[RequestRecord]] = defaultdict(list)
    for r in read_records(FIXTURE):
        groups[(r.trial, r.iteration)].append(r)
    trials = sorted({t for t, _ in groups})
    iters = sorted({i for _, i in groups})
    out = np.zeros((len(trials), len(iters), 4))
    for (t, i), recs in groups.items():
        m = compute_metrics([recs])
        out[t, iters.index(i)] = (
            m.total_input_tokens + m.total_output_tokens,
            m.duration_s,
            sum(r.ttft_ms or 0.0 for r in recs),
            len(recs),
        )
    return out, groups


BATCHES, GROUPS = _batches()


def _noise(rng: np.random.Generator, trials: int, seg_sd: float, batch_sd: float) -> np.ndarray:
    """Multiplicative time factors [replay, arm, trial, batch]."""
    shape = (REPLAYS, 2, trials, BATCHES.shape[1])
    seg = rng.standard_normal((*shape[:3], 1)) * seg_sd
    return np.exp(seg + rng.standard_normal(shape) * batch_sd)


def _per_trial(factors: np.ndarray) -> dict[str, np.ndarray]:
    """Per-trial throughput and mean TTFT [replay, arm, trial] plus pooled [replay, arm]."""
    trials = factors.shape[2]
    b = BATCHES[np.arange(trials) % BATCHES.shape[0]]  # more trials than recorded: reuse them
    tok, dur, ttft, n = (b[..., k] for k in range(4))
    return {
        "throughput": (tok.sum(-1) / (dur * factors).sum(-1)),
        "throughput_pooled": tok.sum() / (dur * factors).sum((-1, -2)),
        "ttft": (ttft * factors).sum(-1) / n.sum(-1),
        "ttft_pooled": (ttft * factors).sum((-1, -2)) / n.sum(),
    }


def _false_verdict_rate(values: dict[str, np.ndarray], effect: float = 1.0) -> dict[str, float]:
    rates = {}
    for metric, higher in (("throughput", True), ("ttft", False)):
        per, pooled = values[metric], values[f"{metric}_pooled"]
        base, cand = per[:, 0], per[:, 1] * (effect if higher else 1 / effect)
        b_pool, c_pool = pooled[:, 0], pooled[:, 1] * (effect if higher else 1 / effect)
        lo, hi = paired_log_ci(base, cand, center=np.log(c_pool / b_pool))
        codes = judge(np.expm1(lo) * 100, np.expm1(hi) * 100, higher, MIN_EFFECT_PCT)
        rates[metric] = float(np.isin(codes, (HELPS, HURTS)).mean())
        rates[f"{metric}_helps"] = float((codes == HELPS).mean())
    return rates


@pytest.mark.parametrize("trials", [2, 4, 6])
@pytest.mark.parametrize(("seg_sd", "batch_sd"), [(0.0, 0.03), (0.03, 0.01), (0.05, 0.03)])
def test_a_a_replays_rarely_claim_a_difference(trials: int, seg_sd: float, batch_sd: float) -> None:
    rng = np.random.default_rng([trials, int(seg_sd * 100), int(batch_sd * 100)])
    rates = _false_verdict_rate(_per_trial(_noise(rng, trials, seg_sd, batch_sd)))
    assert rates["throughput"] <= ALLOWED_FALSE_RATE, rates
    assert rates["ttft"] <= ALLOWED_FALSE_RATE, rates


def test_one_slow_segment_does_not_decide_the_verdict() -> None:
    """One arm's trial 4% slower (a background job during one segment): no verdict from it."""
    rng = np.random.default_rng(11)
    factors = _noise(rng, 4, 0.01, 0.01)
    slow = rng.integers(0, 4, REPLAYS)
    factors[np.arange(REPLAYS), 1, slow] *= 1.04
    rates = _false_verdict_rate(_per_trial(factors))
    assert rates["throughput"] <= ALLOWED_FALSE_RATE, rates


def test_a_true_ten_percent_gain_is_found_in_most_runs() -> None:
    rng = np.random.default_rng(5)
    rates = _false_verdict_rate(_per_trial(_noise(rng, 6, 0.03, 0.01)), effect=1.10)
    assert rates["throughput_helps"] >= 0.8, rates
    assert rates["ttft_helps"] >= 0.8, rates


def test_the_replay_computes_what_compute_metrics_computes() -> None:
    """One replay as real records through compare_arms: the same per-trial figures and interval."""
    rng = np.random.default_rng(3)
    factors = _noise(rng, BATCHES.shape[0], 0.03, 0.01)[0]
    iters = sorted({i for _, i in GROUPS})
    arms: dict[str, dict[int, list[RequestRecord]]] = {"a": {}, "b": {}}
    for a, name in enumerate(arms):
        for (t, i), recs in sorted(GROUPS.items()):
            f = float(factors[a, t, iters.index(i)])
            start = min(r.send_perf_s for r in recs)
            # batches back to back, as the closed loop sends them: a trial's span adds up
            at = max((r.end_perf_s for r in arms[name].get(t, [])), default=0.0)
            arms[name].setdefault(t, []).extend(
                dataclasses.replace(
                    r,
                    arm=name,
                    send_perf_s=at + (r.send_perf_s - start) * f,
                    end_perf_s=at + (r.end_perf_s - start) * f,
                    chunk_offsets_ms=[x * f for x in r.chunk_offsets_ms],
                )
                for r in recs
            )
    cs = {
        c.metric: c
        for c in compare_arms(
            ("a", arms["a"], compute_metrics(arms["a"].values())),
            ("b", arms["b"], compute_metrics(arms["b"].values())),
        )
    }
    vec = _per_trial(factors[None])
    for metric, key in (("total_token_throughput_tok_s", "throughput"), ("mean_ttft_ms", "ttft")):
        lo, hi = paired_log_ci(
            vec[key][:, 0],
            vec[key][:, 1],
            center=np.log(vec[f"{key}_pooled"][:, 1] / vec[f"{key}_pooled"][:, 0]),
        )
        assert cs[metric].ci95_low_pct == pytest.approx(float(np.expm1(lo[0]) * 100), rel=1e-6)
        assert cs[metric].ci95_high_pct == pytest.approx(float(np.expm1(hi[0]) * 100), rel=1e-6)
