"""Serving metrics with `vllm bench serve` definitions, bootstrap CIs and A/B verdicts.

Definitions (vllm/benchmarks/serve.py `calculate_metrics`, 0.34): TTFT = first `choices` chunk
- send; ITL = every gap between successive chunks, pooled over requests; TPOT per request =
(E2EL - TTFT)/(output tokens - 1) when output > 1; E2EL = last chunk - send; throughputs =
totals / benchmark duration; goodput = requests meeting every SLO / duration. Percentiles use
numpy's linear interpolation, as vLLM does. Failed requests count as errors, never as
completions, and contribute no tokens. The cached-token share is None when the server reports
no `cached_tokens` (absent is not zero).

Why cluster bootstrap: requests released together share the engine's fate (one slow prefill
delays the whole batch), so they are not independent draws. Confidence intervals resample the
release groups (batches) and fall back to single requests only when there are too few groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvops.loadgen.record import RequestRecord

PERCENTILES = (("median", 50.0), ("p90", 90.0), ("p99", 99.0))
MIN_CLUSTERS = 6
# metric name -> True when a higher value is better
COMPARED_METRICS: dict[str, bool] = {
    "total_token_throughput_tok_s": True,
    "output_throughput_tok_s": True,
    "mean_ttft_ms": False,
    "median_ttft_ms": False,
    "p99_ttft_ms": False,
    "mean_itl_ms": False,
    "mean_tpot_ms": False,
    "mean_e2el_ms": False,
}
PRIMARY_METRIC = "total_token_throughput_tok_s"
# Smallest change called helps/hurts: run-to-run noise between identical servers on a shared
# host (A/A runs) reaches ~2%, and a bootstrap over a handful of batches cannot see all of it.
MIN_EFFECT_PCT = 2.0

Metrics = dict[str, float | int | None]


def output_len(rec: RequestRecord) -> int:
    return rec.output_tokens if rec.output_tokens is not None else len(rec.chunk_offsets_ms)


def tpot_ms(rec: RequestRecord) -> float | None:
    n = output_len(rec)
    if n <= 1 or rec.e2el_ms is None or rec.ttft_ms is None:
        return None
    return (rec.e2el_ms - rec.ttft_ms) / (n - 1)


def span_s(records: Sequence[RequestRecord]) -> float:
    """Benchmark duration of one run segment: first send to last completion (vLLM's dur_s)."""
    if not records:
        return 0.0
    return max(r.end_perf_s for r in records) - min(r.send_perf_s for r in records)


def _stats(prefix: str, values: Sequence[float]) -> Metrics:
    out: Metrics = {}
    arr = np.asarray(values, dtype=float)
    out[f"mean_{prefix}_ms"] = float(arr.mean()) if arr.size else None
    out[f"std_{prefix}_ms"] = float(arr.std()) if arr.size else None
    for label, q in PERCENTILES:
        out[f"{label}_{prefix}_ms"] = float(np.percentile(arr, q)) if arr.size else None
    return out


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50,e2el_ms=2000` -> {"ttft_ms": 500.0, ...} (keys as vLLM's)."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("ttft_ms", "tpot_ms", "e2el_ms"):
            raise ValueError(f"bad SLO {part!r}: use ttft_ms=N,tpot_ms=N,e2el_ms=N")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"bad SLO value in {part!r}: not a number") from None
    return slo


def _meets(rec: RequestRecord, slo: dict[str, float]) -> bool:
    got = {"ttft_ms": rec.ttft_ms, "tpot_ms": tpot_ms(rec) or 0.0, "e2el_ms": rec.e2el_ms}
    return all((got[k] is not None and got[k] <= v) for k, v in slo.items())  # type: ignore[operator]


def compute_metrics(
    segments: Iterable[Sequence[RequestRecord]], slo: dict[str, float] | None = None
) -> Metrics:
    """Metrics over one or more run segments (e.g. one arm's trials): durations add up, so
    throughput is total tokens over total measured time."""
    segs = [list(s) for s in segments if s]
    records = [r for s in segs for r in s]
    ok = [r for r in records if r.ok]
    duration = sum(span_s(s) for s in segs)
    in_tok = sum(r.prompt_tokens or r.intended_prompt_tokens or 0 for r in ok)
    out_tok = sum(output_len(r) for r in ok)
    m: Metrics = {
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "duration_s": duration,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
    }
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    m["request_throughput_req_s"] = per_s(len(ok))
    m["output_throughput_tok_s"] = per_s(out_tok)
    m["total_token_throughput_tok_s"] = per_s(in_tok + out_tok)
    if slo:
        m["request_goodput_req_s"] = per_s(sum(1 for r in ok if _meets(r, slo)))
    m.update(_stats("ttft", [r.ttft_ms for r in ok if r.ttft_ms is not None]))
    m.update(_stats("tpot", [t for r in ok if (t := tpot_ms(r)) is not None]))
    m.update(_stats("itl", [g for r in ok for g in r.itls_ms]))
    m.update(_stats("e2el", [r.e2el_ms for r in ok if r.e2el_ms is not None]))
    m["cached_token_share"] = cached_token_share(ok)
    return m


def cached_token_share(records: Sequence[RequestRecord]) -> float | None:
    """Cached / prompt tokens over requests that report both (same source for numerator and
    denominator); None when no request reports cached tokens. Clamped to [0, 1]."""
    both = [r for r in records if r.cached_tokens is not None and r.prompt_tokens]
    if not both:
        return None
    share = sum(r.cached_tokens or 0 for r in both) / sum(r.prompt_tokens or 0 for r in both)
    return min(1.0, max(0.0, share))


# ---------------------------------------------------------------- bootstrap and verdicts


@dataclass
class Comparison:
    metric: str
    baseline_arm: str
    candidate_arm: str
    baseline: float | None
    candidate: float | None
    delta_pct: float | None
    ci95_low_pct: float | None
    ci95_high_pct: float | None
    verdict: str
    higher_is_better: bool
    resample_unit: str

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _cluster_sums(clusters: Sequence[Sequence[RequestRecord]], metric: str) -> np.ndarray:
    """Per cluster (numerator, denominator) so a resample's statistic is a ratio of sums."""
    rows: list[tuple[float, float]] = []
    for c in clusters:
        ok = [r for r in c if r.ok]
        if metric in ("total_token_throughput_tok_s", "output_throughput_tok_s"):
            tok = sum(output_len(r) for r in ok)
            if metric.startswith("total"):
                tok += sum(r.prompt_tokens or r.intended_prompt_tokens or 0 for r in ok)
            rows.append((float(tok), span_s(c)))
        elif metric == "mean_itl_ms":
            gaps = [g for r in ok for g in r.itls_ms]
            rows.append((float(sum(gaps)), float(len(gaps))))
        else:
            vals = _values(ok, metric)
            rows.append((float(sum(vals)), float(len(vals))))
    return np.asarray(rows, dtype=float).reshape(-1, 2)


def _values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    kind = metric.split("_")[1]
    get: Callable[[RequestRecord], float | None] = {
        "ttft": lambda r: r.ttft_ms,
        "tpot": tpot_ms,
        "e2el": lambda r: r.e2el_ms,
    }[kind]
    return [v for r in records if (v := get(r)) is not None]


def _resampled(
    clusters: Sequence[Sequence[RequestRecord]], metric: str, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, str]:
    """`n` bootstrap replicates of `metric` for one arm, and the unit that was resampled."""
    if metric.startswith(("median_", "p99_")):
        vals = np.asarray(_values([r for c in clusters for r in c if r.ok], metric))
        if vals.size < 2:
            return np.full(n, np.nan), "request"
        q = 50.0 if metric.startswith("median") else 99.0
        idx = rng.integers(0, vals.size, (n, vals.size))
        return np.percentile(vals[idx], q, axis=1), "request"
    unit = "batch"
    if metric.endswith("_tok_s"):
        # throughput exists only per release group; with fewer than 4 there is no interval
        if len(clusters) < 4:
            return np.full(n, np.nan), unit
    elif len(clusters) < MIN_CLUSTERS:
        unit = "request"
        clusters = [[r] for c in clusters for r in c]
    sums = _cluster_sums(clusters, metric)
    if len(sums) < 2:
        return np.full(n, np.nan), unit
    idx = rng.integers(0, len(sums), (n, len(sums)))
    num, den = sums[idx, 0].sum(axis=1), sums[idx, 1].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan), unit


def verdict_for(
    low: float | None,
    high: float | None,
    higher_is_better: bool,
    delta: float | None = None,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> str:
    """helps / hurts when the whole 95% interval lies on one side of zero and the change is at
    least `min_effect_pct`; otherwise no significant difference."""
    if low is None or high is None:
        return "not enough data"
    if delta is not None and abs(delta) < min_effect_pct:
        return "no significant difference"
    if low > 0 or high < 0:
        better = (low > 0) == higher_is_better
        return "helps" if better else "hurts"
    return "no significant difference"


def compare_arms(
    baseline: tuple[str, Sequence[Sequence[RequestRecord]], Metrics],
    candidate: tuple[str, Sequence[Sequence[RequestRecord]], Metrics],
    *,
    seed: int = 0,
    n_resamples: int = 2000,
) -> list[Comparison]:
    """Each compared metric: candidate vs baseline as a % delta with a seeded bootstrap CI.

    Arms are (name, clusters, metrics); clusters are the release groups of measured records."""
    out: list[Comparison] = []
    (b_name, b_clusters, b_m), (c_name, c_clusters, c_m) = baseline, candidate
    for i, (metric, higher) in enumerate(COMPARED_METRICS.items()):
        b, c = b_m.get(metric), c_m.get(metric)
        delta = (c - b) / b * 100.0 if b and c is not None else None
        rng = np.random.default_rng([seed, 3, i])
        rb, unit = _resampled(b_clusters, metric, rng, n_resamples)
        rc, _ = _resampled(c_clusters, metric, rng, n_resamples)
        with np.errstate(divide="ignore", invalid="ignore"):
            deltas = (rc - rb) / rb * 100.0
        deltas = deltas[np.isfinite(deltas)]
        low = high = None
        if delta is not None and deltas.size >= n_resamples // 2:
            low, high = (float(x) for x in np.percentile(deltas, [2.5, 97.5]))
        out.append(
            Comparison(
                metric, b_name, c_name, _f(b), _f(c), delta, low, high,
                verdict_for(low, high, higher, delta), higher, unit,
            )
        )  # fmt: skip
    return out


def _f(x: float | int | None) -> float | None:
    return float(x) if x is not None else None


def overall_verdict(comparisons: Sequence[Comparison]) -> str:
    """The scenario's one-line answer, read from the primary metric (total token throughput)."""
    for c in comparisons:
        if c.metric == PRIMARY_METRIC:
            return c.verdict
    return "not enough data"
