"""Metrics follow `vllm bench serve` exactly; CIs are seeded; verdicts follow the interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.loadgen.record import RequestRecord
from kvops.metrics import (
    cached_token_share,
    compare_arms,
    compute_metrics,
    overall_verdict,
    parse_slo,
    tpot_ms,
    verdict_for,
)


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
    assert m["completed"] == 2 and m["errors"] == 0
    assert m["mean_ttft_ms"] == pytest.approx(75.0)
    assert m["median_ttft_ms"] == pytest.approx(75.0)
    assert m["mean_itl_ms"] == pytest.approx(50.0 / 3)  # pooled gaps: 10, 10, 30
    assert m["mean_tpot_ms"] == pytest.approx(20.0)
    assert m["mean_e2el_ms"] == pytest.approx(100.0)
    duration = 0.63  # first send 0.0 -> last end 0.5 + 0.13
    assert m["duration_s"] == pytest.approx(duration)
    assert m["output_throughput_tok_s"] == pytest.approx(5 / duration)
    assert m["total_token_throughput_tok_s"] == pytest.approx(205 / duration)
    assert m["request_throughput_req_s"] == pytest.approx(2 / duration)
    assert m["p99_ttft_ms"] == pytest.approx(float(np.percentile([50, 100], 99)))


def test_errors_count_but_add_no_tokens_and_durations_add_up() -> None:
    ok = rec(0.0, [10.0, 20.0])
    bad = rec(0.0, [5.0], error="HTTP 500: boom")
    m = compute_metrics([[ok, bad], [rec(10.0, [10.0, 20.0])]])
    assert (m["completed"], m["errors"]) == (2, 1)
    assert m["duration_s"] == pytest.approx(0.04)
    assert m["total_output_tokens"] == 4


def test_single_token_output_has_no_tpot() -> None:
    assert tpot_ms(rec(0.0, [10.0])) is None
    assert compute_metrics([[rec(0.0, [10.0])]])["mean_tpot_ms"] is None


def test_cached_share_none_when_not_reported_never_zero() -> None:
    assert cached_token_share([rec(0, [1.0]), rec(0, [1.0])]) is None
    assert cached_token_share([rec(0, [1.0], cached=50), rec(0, [1.0])]) == pytest.approx(0.5)
    assert cached_token_share([rec(0, [1.0], cached=0)]) == 0.0
    assert cached_token_share([rec(0, [1.0], cached=500)]) == 1.0  # clamped


def test_goodput_counts_requests_meeting_every_slo() -> None:
    a, b = rec(0.0, [40.0, 50.0]), rec(0.0, [80.0, 90.0])
    m = compute_metrics([[a, b]], parse_slo("ttft_ms=60,tpot_ms=20"))
    assert m["request_goodput_req_s"] == pytest.approx(1 / 0.09)


def test_parse_slo_rejects_unknown_keys() -> None:
    assert parse_slo("ttft_ms=5, e2el_ms=7") == {"ttft_ms": 5.0, "e2el_ms": 7.0}
    for bad in ("ttft=5", "ttft_ms=x", "ttft_ms"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def _arm(ttft: float, gap: float, n_batches: int = 8, seed: int = 0) -> list[list[RequestRecord]]:
    rng = np.random.default_rng(seed)
    clusters = []
    t = 0.0
    for b in range(n_batches):
        batch = []
        for _ in range(10):
            first = ttft * rng.uniform(0.9, 1.1)
            batch.append(rec(t, [first + gap * k for k in range(5)], batch=b))
        clusters.append(batch)
        t += 1.0
    return clusters


def _compare(base: list[list[RequestRecord]], cand: list[list[RequestRecord]], seed: int = 0):
    return compare_arms(
        ("baseline", base, compute_metrics([[r for c in base for r in c]])),
        ("offload", cand, compute_metrics([[r for c in cand for r in c]])),
        seed=seed,
        n_resamples=500,
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
    worse = {c.metric: c for c in _compare(_arm(50.0, 5.0), _arm(100.0, 10.0, seed=1))}
    assert worse["mean_ttft_ms"].verdict == "hurts"
    same = {c.metric: c for c in _compare(_arm(100.0, 10.0, seed=2), _arm(100.0, 10.0, seed=3))}
    assert same["mean_ttft_ms"].verdict == "no significant difference"
    assert overall_verdict(list(same.values())) in ("no significant difference", "helps", "hurts")


def test_bootstrap_is_seeded() -> None:
    a, b = _arm(100.0, 10.0), _arm(90.0, 10.0, seed=1)
    first = [c.to_dict() for c in _compare(a, b, seed=7)]
    assert first == [c.to_dict() for c in _compare(a, b, seed=7)]


def test_few_batches_resample_requests_and_throughput_needs_three() -> None:
    cs = {
        c.metric: c for c in _compare(_arm(100.0, 10.0, n_batches=2), _arm(50.0, 5.0, n_batches=2))
    }
    assert cs["mean_ttft_ms"].resample_unit == "request"
    assert cs["total_token_throughput_tok_s"].verdict == "not enough data"  # 2 batches < 4


@settings(max_examples=50, deadline=None)
@given(low=st.floats(-100, 100), width=st.floats(0, 100), higher=st.booleans())
def test_verdict_follows_the_interval(low: float, width: float, higher: bool) -> None:
    high = low + width
    v = verdict_for(low, high, higher)
    if low > 0:
        assert v == ("helps" if higher else "hurts")
    elif high < 0:
        assert v == ("hurts" if higher else "helps")
    else:
        assert v == "no significant difference"
    assert verdict_for(None, None, higher) == "not enough data"
    assert verdict_for(low, high, higher, delta=1.0) == "no significant difference"
    assert not math.isnan(low)
