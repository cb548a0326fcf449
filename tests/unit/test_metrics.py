"""Metrics follow `vllm bench serve` exactly; CIs are seeded; verdicts follow the interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.abtest.metrics import (
    cached_token_share,
    compare_arms,
    compute_metrics,
    min_requests_for,
    overall_verdict,
    parse_slo,
    t975,
    tpot_ms,
    verdict_for,
)
from kvops.workload.record import RequestRecord


def rec(
    send: float, chunks: list[float], *, prompt: int = 100, out: int | None = None,
    cached: int | None = None, error: str | None = None, batch: int = 0, trial: int = 0,
) -> RequestRecord:  # fmt: skip
    r = RequestRecord(
        request_id="x", send_perf_s=send, chunk_offsets_ms=chunks, batch=batch, trial=trial
    )
    r.end_perf_s = send + (chunks[-1] if chunks else 0.0) / 1000.0
    r.prompt_tokens, r.output_tokens, r.cached_tokens, r.error = (
        prompt,
        out or len(chunks),
        cached,
        error,
    )
    return r


def test_vllm_definitions_on_known_records() -> None:
    a = rec(0.0, [50.0, 60.0, 70.0])  # TTFT 50, ITL 10,10, E2EL 70, TPOT (70-50)/2 = 10
    b = rec(0.5, [100.0, 130.0])  # TTFT 100, ITL 30, E2EL 130, TPOT 30
    m = compute_metrics([[a, b]])
    assert m.completed == 2 and m.errors == 0
    assert m.mean_ttft_ms == pytest.approx(75.0)
    assert m.median_ttft_ms == pytest.approx(75.0)
    assert m.mean_itl_ms == pytest.approx(50.0 / 3)  # pooled gaps: 10, 10, 30
    assert m.mean_tpot_ms == pytest.approx(20.0)
    assert m.mean_e2el_ms == pytest.approx(100.0)
    duration = 0.63  # first send 0.0 -> last end 0.5 + 0.13
    assert m.duration_s == pytest.approx(duration)
    assert m.output_throughput_tok_s == pytest.approx(5 / duration)
    assert m.total_token_throughput_tok_s == pytest.approx(205 / duration)
    assert m.request_throughput_req_s == pytest.approx(2 / duration)
    assert m.p99_ttft_ms == pytest.approx(float(np.percentile([50, 100], 99)))


def test_errors_count_but_add_no_tokens_and_durations_add_up() -> None:
    ok = rec(0.0, [10.0, 20.0])
    bad = rec(0.0, [5.0], error="HTTP 500: boom")
    m = compute_metrics([[ok, bad], [rec(10.0, [10.0, 20.0])]])
    assert (m.completed, m.errors) == (2, 1)
    assert m.duration_s == pytest.approx(0.04)
    assert m.total_output_tokens == 4


def test_single_token_output_has_no_tpot() -> None:
    assert tpot_ms(rec(0.0, [10.0])) is None
    assert compute_metrics([[rec(0.0, [10.0])]]).mean_tpot_ms is None


def test_cached_share_none_when_not_reported_never_zero() -> None:
    assert cached_token_share([rec(0, [1.0]), rec(0, [1.0])]) is None
    assert cached_token_share([rec(0, [1.0], cached=50), rec(0, [1.0])]) == pytest.approx(0.5)
    assert cached_token_share([rec(0, [1.0], cached=0)]) == 0.0
    assert cached_token_share([rec(0, [1.0], cached=500)]) == 1.0  # clamped


def test_goodput_counts_requests_meeting_every_slo() -> None:
    a, b = rec(0.0, [40.0, 50.0]), rec(0.0, [80.0, 90.0])
    m = compute_metrics([[a, b]], parse_slo("ttft_ms=60,tpot_ms=20"))
    assert m.request_goodput_req_s == pytest.approx(1 / 0.09)


def test_parse_slo_rejects_unknown_keys() -> None:
    assert parse_slo("ttft_ms=5, e2el_ms=7") == {"ttft_ms": 5.0, "e2el_ms": 7.0}
    assert parse_slo("ttft:500,tpot:50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert parse_slo("ttft:500 e2el:2000") == {"ttft_ms": 500.0, "e2el_ms": 2000.0}
    for bad in ("ttft=5", "ttft_ms=x", "ttft_ms", "itl:5", "ttft:"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def _arm(
    ttft: float, gap: float, n_trials: int = 4, seed: int = 0, trial_noise: float = 0.03
) -> dict[int, list[RequestRecord]]:
    """Trials of 3 batches x 10 requests; each trial (segment) has its own speed factor."""
    rng = np.random.default_rng(seed)
    trials: dict[int, list[RequestRecord]] = {}
    t = 0.0
    for trial in range(n_trials):
        factor = 1.0 + trial_noise * rng.standard_normal()
        recs = []
        for b in range(3):
            for _ in range(10):
                first = ttft * factor * rng.uniform(0.95, 1.05)
                chunks = [first + gap * factor * k for k in range(5)]
                recs.append(rec(t, chunks, batch=b, trial=trial))
            t += 1.0
        trials[trial] = recs
    return trials


def _compare(base: dict[int, list[RequestRecord]], cand: dict[int, list[RequestRecord]]):
    return compare_arms(
        ("baseline", base, compute_metrics(base.values())),
        ("offload", cand, compute_metrics(cand.values())),
    )


def test_clear_gain_is_helps_and_identical_is_no_difference() -> None:
    better = {c.metric: c for c in _compare(_arm(100.0, 10.0), _arm(50.0, 5.0, seed=1))}
    assert better["mean_ttft_ms"].verdict == "helps"
    assert better["mean_ttft_ms"].delta_pct == pytest.approx(-50.0, abs=3)
    assert (
        better["mean_ttft_ms"].ci95_low_pct
        < better["mean_ttft_ms"].delta_pct
        < better["mean_ttft_ms"].ci95_high_pct
    )  # type: ignore[operator]
    assert better["mean_itl_ms"].verdict == "helps"
    assert better["mean_ttft_ms"].resample_unit == "paired trials (4)"
    worse = {c.metric: c for c in _compare(_arm(50.0, 5.0), _arm(100.0, 10.0, seed=1))}
    assert worse["mean_ttft_ms"].verdict == "hurts"
    same = {c.metric: c for c in _compare(_arm(100.0, 10.0, seed=2), _arm(100.0, 10.0, seed=3))}
    p99 = same.pop("p99_ttft_ms")  # 30 requests per trial: see the test below
    assert p99.verdict.startswith("too few requests")
    assert {c.verdict for c in same.values()} == {"no significant difference"}
    assert overall_verdict(list(same.values())) == "no significant difference"


def test_a_tail_percentile_needs_enough_requests_per_trial() -> None:
    """One server against itself, one stalled request in each trial of one arm: with 30 requests
    a trial's p99 is that request, so p99 would read "hurts" on an A/A run. It gets no verdict
    until every trial has 5 requests beyond the percentile on average; the means still judge."""
    assert (min_requests_for("p99_ttft_ms"), min_requests_for("p90_itl_ms")) == (500, 50)
    assert min_requests_for("mean_ttft_ms") == 0
    base, cand = _arm(100.0, 10.0, seed=2), _arm(100.0, 10.0, seed=3)
    for recs in cand.values():
        recs[0].chunk_offsets_ms = [x * 3 for x in recs[0].chunk_offsets_ms]
    cs = {c.metric: c for c in _compare(base, cand)}
    assert cs["p99_ttft_ms"].ci95_low_pct is not None and cs["p99_ttft_ms"].ci95_low_pct > 2
    assert cs["p99_ttft_ms"].verdict == "too few requests (30 per trial; p99_ttft_ms needs 500)"
    assert cs["median_ttft_ms"].verdict == "no significant difference"


def test_one_trial_is_not_enough_for_a_verdict() -> None:
    cs = _compare(_arm(100.0, 10.0, n_trials=1), _arm(50.0, 5.0, n_trials=1, seed=1))
    assert {c.verdict for c in cs} == {"not enough trials"}
    assert all(c.ci95_low_pct is None and c.delta_pct is not None for c in cs)


def test_a_two_percent_point_delta_does_not_pass_the_two_percent_gate() -> None:
    """Noise-free trials: the interval collapses on the point, which sits exactly on the gate."""
    base = _arm(100.0, 10.0, trial_noise=0.0)
    for factor, verdict in ((1.02, "no significant difference"), (1.03, "hurts")):
        cand = {
            t: [rec(r.send_perf_s, [x * factor for x in r.chunk_offsets_ms], trial=t) for r in rs]
            for t, rs in base.items()
        }
        ttft = next(c for c in _compare(base, cand) if c.metric == "mean_ttft_ms")
        assert ttft.delta_pct == pytest.approx((factor - 1) * 100)
        assert ttft.verdict == verdict


def test_an_arm_with_failed_requests_gets_no_verdict() -> None:
    base, cand = _arm(100.0, 10.0), _arm(50.0, 5.0, seed=1)
    for r in cand[1][:3]:  # 3 of 120 measured requests: 2.5% > 1%
        r.error, r.chunk_offsets_ms = "HTTP 500", []
    cs = _compare(base, cand)
    assert {c.verdict for c in cs} == {"invalid: 3 errors"}
    cand[1][1].error, cand[1][2].error = None, None  # 1 of 120: under 1%, still judged
    cand[1][1].chunk_offsets_ms = cand[1][2].chunk_offsets_ms = [50.0, 55.0, 60.0, 65.0, 70.0]
    assert next(c for c in _compare(base, cand) if c.metric == "mean_ttft_ms").verdict == "helps"


@settings(max_examples=50, deadline=None)
@given(low=st.floats(-100, 100), width=st.floats(0, 100), higher=st.booleans())
def test_verdict_needs_the_whole_interval_beyond_the_gate(
    low: float, width: float, higher: bool
) -> None:
    high = low + width
    v = verdict_for(low, high, higher, min_effect_pct=2.0)
    if low > 2.0:
        assert v == ("helps" if higher else "hurts")
    elif high < -2.0:
        assert v == ("hurts" if higher else "helps")
    else:
        assert v == "no significant difference"
    assert verdict_for(None, None, higher) == "not enough data"
    assert not math.isnan(low)


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(30) == pytest.approx(2.042)
    assert t975(31) == pytest.approx(2.040, abs=1e-3)
    assert t975(1000) == pytest.approx(1.962, abs=1e-3)
