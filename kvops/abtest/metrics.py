"""Serving metrics with `vllm bench serve` definitions, bootstrap CIs and A/B verdicts.

Definitions (vllm/benchmarks/serve.py `calculate_metrics`, 0.34): TTFT = first `choices` chunk
- send; ITL = every gap between successive chunks, pooled over requests; TPOT per request =
(E2EL - TTFT)/(output tokens - 1) when output > 1; E2EL = last chunk - send; throughputs =
totals / benchmark duration; goodput = requests meeting every SLO / duration. Percentiles use
numpy's linear interpolation, as vLLM does. Failed requests count as errors, never as
completions, and contribute no tokens. The cached-token share is None when the server reports
no `cached_tokens` (absent is not zero).

Why paired trials: requests released together share the engine's fate (one slow prefill delays
the whole batch), and a whole segment (one arm's trial) shares the host's state, so neither
requests nor batches are independent draws. The unit of evidence is the trial: trial t of the
baseline against trial t of the candidate (ABBA order), and the interval comes from the spread
of those paired ratios. A verdict needs at least two paired trials and an interval that clears
the smallest effect worth calling; an arm with failed requests beyond 1% voids the verdicts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from kvops.abtest.result_types import ArmMetrics, Comparison
from kvops.workload.record import RequestRecord

PERCENTILES = (("median", 50.0), ("p90", 90.0), ("p99", 99.0))
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
# A tail percentile is judged only when every paired trial of both arms has at least this many
# requests beyond it on average: with fewer, a trial's p99 is its maximum or close to it, one
# stalled request moves it by tens of percent, and an A/A run reads "hurts" (seen: +15%
# [4..28%] on one server against itself, 16 measured requests per trial).
MIN_TAIL_REQUESTS = 5
_PERCENTILE_METRIC = re.compile(r"^p(\d+)_")


def min_requests_for(metric: str) -> int:
    """Requests a trial needs before its ``metric`` can carry a verdict (0: no such need)."""
    m = _PERCENTILE_METRIC.match(metric)
    if not m:
        return 0
    beyond = 1.0 - int(m.group(1)) / 100.0
    return math.ceil(MIN_TAIL_REQUESTS / beyond - 1e-9)


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


def _stats(values: Sequence[float]) -> tuple[float | None, ...]:
    """(mean, std, median, p90, p99) of one latency, all None without values."""
    arr = np.asarray(values, dtype=float)
    if not arr.size:
        return (None,) * (2 + len(PERCENTILES))
    return (
        float(arr.mean()),
        float(arr.std()),
        *(float(np.percentile(arr, q)) for _, q in PERCENTILES),
    )


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft:500,tpot:50,e2el:2000` (`vllm bench serve --goodput` syntax, which separates with
    spaces: both work) or `ttft_ms=500,...` -> {"ttft_ms": 500.0, ...}; values in ms."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.replace(",", " ").split():
        sep = ":" if ":" in part else "="
        key, _, value = part.partition(sep)
        key = key.strip()
        key = key if key.endswith("_ms") or sep == "=" else f"{key}_ms"
        if not value or key not in ("ttft_ms", "tpot_ms", "e2el_ms"):
            raise ValueError(f"bad SLO {part!r}: use ttft:N,tpot:N,e2el:N (ms, as vllm bench)")
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
) -> ArmMetrics:
    """Metrics over one or more run segments (e.g. one arm's trials): durations add up, so
    throughput is total tokens over total measured time."""
    segs = [list(s) for s in segments if s]
    records = [r for s in segs for r in s]
    ok = [r for r in records if r.ok]
    duration = sum(span_s(s) for s in segs)
    in_tok = sum(r.prompt_tokens or r.intended_prompt_tokens or 0 for r in ok)
    out_tok = sum(output_len(r) for r in ok)

    def per_s(x: int) -> float | None:
        return x / duration if duration > 0 else None

    ttft = _stats([r.ttft_ms for r in ok if r.ttft_ms is not None])
    tpot = _stats([t for r in ok if (t := tpot_ms(r)) is not None])
    itl = _stats([g for r in ok for g in r.itls_ms])
    e2el = _stats([r.e2el_ms for r in ok if r.e2el_ms is not None])
    return ArmMetrics(
        completed=len(ok),
        errors=len(records) - len(ok),
        duration_s=duration,
        total_input_tokens=in_tok,
        total_output_tokens=out_tok,
        request_throughput_req_s=per_s(len(ok)),
        output_throughput_tok_s=per_s(out_tok),
        total_token_throughput_tok_s=per_s(in_tok + out_tok),
        request_goodput_req_s=per_s(sum(1 for r in ok if _meets(r, slo))) if slo else None,
        mean_ttft_ms=ttft[0], std_ttft_ms=ttft[1], median_ttft_ms=ttft[2],
        p90_ttft_ms=ttft[3], p99_ttft_ms=ttft[4],
        mean_tpot_ms=tpot[0], std_tpot_ms=tpot[1], median_tpot_ms=tpot[2],
        p90_tpot_ms=tpot[3], p99_tpot_ms=tpot[4],
        mean_itl_ms=itl[0], std_itl_ms=itl[1], median_itl_ms=itl[2],
        p90_itl_ms=itl[3], p99_itl_ms=itl[4],
        mean_e2el_ms=e2el[0], std_e2el_ms=e2el[1], median_e2el_ms=e2el[2],
        p90_e2el_ms=e2el[3], p99_e2el_ms=e2el[4],
        cached_token_share=cached_token_share(ok),
        slo_given=bool(slo),
    )  # fmt: skip


def cached_token_share(records: Sequence[RequestRecord]) -> float | None:
    """Cached / prompt tokens over requests that report both (same source for numerator and
    denominator); None when no request reports cached tokens. Clamped to [0, 1]."""
    both = [r for r in records if r.cached_tokens is not None and r.prompt_tokens]
    if not both:
        return None
    share = sum(r.cached_tokens or 0 for r in both) / sum(r.prompt_tokens or 0 for r in both)
    return min(1.0, max(0.0, share))


# ---------------------------------------------------------------- paired inference and verdicts


# Student t 97.5% quantiles for 1..30 degrees of freedom (any statistics table, e.g. NIST/SEMATECH
# e-Handbook 1.3.6.7.2, https://www.itl.nist.gov/div898/handbook/eda/section3/eda3672.htm).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """Two-sided 95% Student t quantile; beyond the table, the Cornish-Fisher expansion
    (Abramowitz & Stegun 26.7.5), accurate to 1e-3 there."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_log_ci(
    baseline: np.ndarray, candidate: np.ndarray, center: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """95% interval of ln(candidate/baseline) from per-trial pairs along the last axis.

    Why per trial: the engine's state, the host's load and drift make whole segments (one arm's
    trial) differ, and requests within a segment share that fate; the trial-to-trial spread of the
    paired ratio is the noise a verdict must beat. Each trial is one observation, so the interval
    is Student's t on the paired log ratios (exact for normal noise even with 2 trials, where a
    bootstrap over 2 values is badly overconfident). `center` (default: mean paired log ratio)
    lets the interval sit on the pooled estimate the report shows. Leading axes are independent
    experiments (vectorised calibration). NaN where fewer than 2 trials pair up."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.asarray(candidate, float) / np.asarray(baseline, float))
    n = logs.shape[-1]
    if n < 2:
        nan = np.full(logs.shape[:-1], np.nan)
        return nan, nan.copy()
    mid = logs.mean(axis=-1) if center is None else np.asarray(center, float)
    half = t975(n - 1) * logs.std(axis=-1, ddof=1) / np.sqrt(n)
    return mid - half, mid + half


# verdict codes for the vectorised judge
NO_DIFFERENCE, HELPS, HURTS, NO_DATA = 0, 1, 2, 3
_VERDICT_TEXT = {
    NO_DIFFERENCE: "no significant difference",
    HELPS: "helps",
    HURTS: "hurts",
    NO_DATA: "not enough data",
}
NOT_ENOUGH_TRIALS = "not enough trials"


def judge(
    low_pct: np.ndarray, high_pct: np.ndarray, higher_is_better: bool, min_effect_pct: float
) -> np.ndarray:
    """Vectorised verdict codes: a change is claimed only when the whole interval lies beyond
    the smallest effect worth calling (so a 2.0% point estimate never passes a 2% gate)."""
    low, high = np.asarray(low_pct, float), np.asarray(high_pct, float)
    gate = min_effect_pct + 1e-6  # a delta printed as 2.0% is 2.0%, whatever its last bits
    up, down = low > gate, high < -gate
    out = np.full(low.shape, NO_DIFFERENCE)
    out[up] = HELPS if higher_is_better else HURTS
    out[down] = HURTS if higher_is_better else HELPS
    out[np.isnan(low) | np.isnan(high)] = NO_DATA
    return out


def verdict_for(
    low: float | None,
    high: float | None,
    higher_is_better: bool,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> str:
    """helps / hurts when the whole 95% interval lies beyond +-`min_effect_pct`; otherwise
    no significant difference; not enough data without an interval."""
    if low is None or high is None:
        return "not enough data"
    code = judge(np.asarray(low), np.asarray(high), higher_is_better, min_effect_pct)
    return _VERDICT_TEXT[int(code)]


# An arm whose measured requests failed beyond this share measured a broken server, not a
# configuration: its figures come from the survivors and say nothing about the arm.
MAX_ERROR_SHARE = 0.01


def broken_arm_errors(errors: int, completed: int) -> int | None:
    """The arm's error count when it voids a comparison (more than 1% of measured requests)."""
    return errors if errors and errors > MAX_ERROR_SHARE * (errors + completed) else None


def _per_trial(trials: Mapping[int, Sequence[RequestRecord]]) -> dict[int, ArmMetrics]:
    return {t: compute_metrics([recs]) for t, recs in trials.items() if recs}


ArmTrials = tuple[str, Mapping[int, Sequence[RequestRecord]], ArmMetrics]


def compare_arms(
    baseline: ArmTrials,
    candidate: ArmTrials,
    *,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> list[Comparison]:
    """Each compared metric: candidate vs baseline as a % delta of the pooled figures, with a
    95% interval from the paired trials (trial t of one arm against trial t of the other, the
    ABBA pairs), and a verdict. Arms are (name, {trial: measured records}, pooled metrics).

    Fewer than 2 paired trials give "not enough trials"; a tail percentile from trials too small
    to estimate it gives "too few requests ..." (`min_requests_for`); an arm with more than 1%
    failed requests gives "invalid: N errors" on every metric."""
    out: list[Comparison] = []
    (b_name, b_trials, b_m), (c_name, c_trials, c_m) = baseline, candidate
    b_per, c_per = _per_trial(b_trials), _per_trial(c_trials)
    paired = sorted(set(b_per) & set(c_per))
    broken = [e for m in (b_m, c_m) if (e := broken_arm_errors(m.errors, m.completed)) is not None]
    smallest_trial = min((per[t].completed for per in (b_per, c_per) for t in paired), default=0)
    for metric, higher in COMPARED_METRICS.items():
        b, c = b_m.value(metric), c_m.value(metric)
        delta = (c - b) / b * 100.0 if b and c is not None else None
        pairs = [
            (float(bv), float(cv))
            for t in paired
            if (bv := b_per[t].value(metric)) and (cv := c_per[t].value(metric))
        ]
        low = high = None
        if delta is not None and len(pairs) >= 2 and c:
            arr = np.asarray(pairs, float)
            lo, hi = paired_log_ci(arr[:, 0], arr[:, 1], center=np.log(c / b))  # type: ignore[operator]
            low, high = float(np.expm1(lo) * 100.0), float(np.expm1(hi) * 100.0)
        if broken:
            verdict = f"invalid: {sum(broken)} errors"
        elif delta is not None and len(pairs) < 2:
            verdict = NOT_ENOUGH_TRIALS
        elif smallest_trial < (needed := min_requests_for(metric)):
            verdict = f"too few requests ({smallest_trial} per trial; {metric} needs {needed})"
        else:
            verdict = verdict_for(low, high, higher, min_effect_pct)
        out.append(
            Comparison(
                metric, b_name, c_name, _f(b), _f(c), delta, low, high,
                verdict, higher, f"paired trials ({len(pairs)})",
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
