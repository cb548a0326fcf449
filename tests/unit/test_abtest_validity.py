"""Preconditions of an A/B verdict (issue 27): offload engaged, working set against GPU KV
capacity, the baseline's cached-token share, arms with different KV capacity."""

from __future__ import annotations

import pytest

from kvops.abtest.arms import emission_lag_of
from kvops.abtest.engine_counters import counter_delta, read_counters
from kvops.abtest.result_types import Comparison
from kvops.abtest.validity import (
    FITS_NOTE,
    HOST_OVERLOADED,
    NEVER_ENGAGED,
    NO_REUSE_NOTE,
    NOT_FROM_OFFLOAD,
    ScenarioChecks,
    TokenSources,
    attribute_gains,
    check_scenario,
    overloaded_arms,
    withhold_when_overloaded,
    working_set_tokens,
)
from kvops.workload.spec import WorkloadSpec

pytestmark = pytest.mark.unit

MULTI = WorkloadSpec(name="multi", num_prefixes=20, prefix_tokens=2800, prompt_tokens=3000,
                     output_tokens=6, batch_size=40, iterations=4)  # fmt: skip
SINGLE = WorkloadSpec(name="single", num_prefixes=1, prefix_tokens=2800, prompt_tokens=3000,
                      output_tokens=6, batch_size=40, iterations=4)  # fmt: skip
UNIQUE = WorkloadSpec(name="unique", prompt_tokens=3000, output_tokens=6, batch_size=40,
                      iterations=4)  # fmt: skip


def cache(blocks: int) -> dict[str, str]:
    return {"num_gpu_blocks": str(blocks), "block_size": "16"}


def infos(base_blocks: int = 2376, off_blocks: int = 2376, connector: str | None = "lmcache"):
    return {
        "baseline": {"name": "baseline", "cache_config": cache(base_blocks)},
        "offload": {"name": "offload", "cache_config": cache(off_blocks), "connector": connector},
    }


BASE_COUNTERS = {"gpu_query_tokens": 360_000.0, "gpu_hit_tokens": 0.0, "prompt_tokens": 360_000.0}


def off_counters(loaded: float) -> dict[str, float]:
    return {
        "gpu_query_tokens": 360_000.0,
        "gpu_hit_tokens": 10_000.0,
        "external_query_tokens": 360_000.0,
        "external_hit_tokens": loaded,
        "lmcache_stored_tokens": 50_000.0,
    }


def run(spec: WorkloadSpec, loaded: float, **kw: object):
    return check_scenario(
        spec,
        ["baseline", "offload"],
        infos(**kw),  # type: ignore[arg-type]
        {"baseline": BASE_COUNTERS, "offload": off_counters(loaded)},
        {"baseline": 0.05, "offload": 0.05 + loaded / 360_000},
    )


def test_an_offload_arm_that_loaded_nothing_reads_never_engaged() -> None:
    checks = run(MULTI, loaded=0.0)
    assert checks.verdict == NEVER_ENGAGED
    failed = [p for p in checks.preconditions if p.status == "failed"]
    assert [p.check for p in failed] == ["offload_engaged"]
    assert "loaded nothing" in failed[0].message
    assert checks.caveats["offload"]["mean_ttft_ms"] == NEVER_ENGAGED
    engaged = run(MULTI, loaded=200_000.0)
    assert engaged.verdict is None
    assert any(p.check == "offload_engaged" and p.status == "ok" for p in engaged.preconditions)


def test_a_working_set_that_fits_is_said_beside_the_verdict() -> None:
    # 2,800 + 40 x 206 = 11,040 tokens against 2,376 x 16 = 38,016
    assert working_set_tokens(SINGLE) == 11_040
    checks = run(SINGLE, loaded=0.0)
    assert checks.verdict is None and checks.verdict_note == FITS_NOTE
    assert checks.working_set_tokens == 11_040 and checks.gpu_kv_capacity_tokens == 38_016
    # the multi-prefix working set (20 x 2,800 + 40 x 206 = 64,240) does not fit
    assert run(MULTI, loaded=1.0).verdict_note is None


def _judged(verdict: str, metric: str = "total_token_throughput_tok_s") -> Comparison:
    return Comparison(
        metric, "baseline", "offload", 100.0, 110.0, 10.1, 2.9, 17.8, verdict, True,
        "paired trials (2)",
    )  # fmt: skip


@pytest.mark.parametrize("spec", [SINGLE, UNIQUE, MULTI], ids=["fits", "no-reuse", "overflows"])
def test_a_gain_of_an_arm_that_loaded_nothing_is_not_offloads(spec: WorkloadSpec) -> None:
    """Seen on embedded engines under load: +10% throughput [+3..+18%] from two trials where
    the prefixes fit in GPU memory and the offload arm loaded 0 tokens. Loading KV is the only
    way offload helps, so that "helps" is noise or drift: it must not reach the verdict. A
    "hurts" stands (storing costs without loading), and so does the interval."""
    checks = run(spec, loaded=0.0)
    assert checks.nothing_loaded == ["offload"]
    helps, hurts, same = (
        _judged("helps"),
        _judged("hurts", "mean_itl_ms"),
        _judged("no significant difference", "mean_ttft_ms"),
    )
    hurts.caveat = "KV capacity -16%: likely cause"
    attribute_gains([helps, hurts, same], checks)
    assert helps.verdict == NOT_FROM_OFFLOAD
    assert helps.caveat is not None and "loaded no KV from offload" in helps.caveat
    assert (helps.ci95_low_pct, helps.ci95_high_pct) == (2.9, 17.8)
    assert hurts.verdict == "hurts" and hurts.caveat == "KV capacity -16%: likely cause"
    assert same.verdict == "no significant difference"


def test_an_overloaded_host_voids_every_claim_and_keeps_the_interval() -> None:
    """Seen in a CI-mode run: one simulated server in both arms (an A/A) read total throughput
    "hurts" -47% [-70%, -6%] while both arms' tokens left 45-53% of their mean TTFT late. Such
    a run measured the host's contention, so no claim (a difference or none) may stand."""
    overloaded = overloaded_arms({"baseline": 0.45, "offload": 0.53})
    assert overloaded == {"baseline": 0.45, "offload": 0.53}
    claims = [
        _judged("hurts"),
        _judged("helps", "mean_ttft_ms"),
        _judged("no significant difference", "mean_itl_ms"),
        _judged(NOT_FROM_OFFLOAD, "output_throughput_tok_s"),
    ]
    claims[0].caveat = "KV capacity -16%: likely cause"
    withhold_when_overloaded(claims, overloaded)
    assert [c.verdict for c in claims] == [HOST_OVERLOADED] * 4
    assert claims[0].caveat == (
        "measured as hurts, but simulated engines ran late (baseline 45%, offload 53% of mean "
        "TTFT); KV capacity -16%: likely cause"
    )
    assert (claims[0].ci95_low_pct, claims[0].ci95_high_pct) == (2.9, 17.8)


def test_a_broken_arm_and_too_few_trials_stand_on_an_overloaded_host() -> None:
    invalid, few = _judged("invalid: 12 errors"), _judged("not enough trials", "mean_ttft_ms")
    withhold_when_overloaded([invalid, few], {"offload": 0.9})
    assert (invalid.verdict, few.verdict) == ("invalid: 12 errors", "not enough trials")


def test_a_host_that_kept_up_or_a_server_without_lag_keeps_its_verdicts() -> None:
    """Up to a quarter of the mean TTFT late the verdict stands (a quiet host: 0.2-3%); a real
    vLLM reports no lag at all."""
    assert overloaded_arms({"baseline": 0.25, "offload": 0.03, "vllm": None}) == {}
    helps = _judged("helps")
    withhold_when_overloaded([helps], {})
    assert helps.verdict == "helps" and helps.caveat is None


def test_a_gain_of_an_arm_that_loaded_kv_stands() -> None:
    checks = run(MULTI, loaded=200_000.0)
    assert checks.nothing_loaded == []
    helps = _judged("helps")
    attribute_gains([helps], checks)
    assert helps.verdict == "helps" and helps.caveat is None


def test_unique_prompts_keep_their_verdict_as_store_overhead() -> None:
    checks = run(UNIQUE, loaded=0.0)
    assert checks.verdict is None and checks.verdict_note == NO_REUSE_NOTE


def test_an_a_a_run_without_a_connector_keeps_its_verdict() -> None:
    """Both arms the same plain server: no arm claims to offload, so nothing is replaced, and
    nothing says the candidate should have loaded: its gains are not attributed (an A/A run's
    "helps" is left to the interval's 5%)."""
    checks = check_scenario(
        MULTI, ["a", "b"],
        {"a": {"cache_config": cache(2376)}, "b": {"cache_config": cache(2376)}},
        {"a": BASE_COUNTERS, "b": BASE_COUNTERS},
        {"a": 0.05, "b": 0.05},
    )  # fmt: skip
    assert checks.verdict is None and checks.nothing_loaded == []
    engaged = [p for p in checks.preconditions if p.check == "offload_engaged"]
    assert engaged[0].status == "unknown" and "shows no KV connector" in engaged[0].message


def test_a_baseline_with_no_cache_hits_on_shared_prefixes_is_named() -> None:
    checks = check_scenario(
        MULTI, ["baseline", "offload"], infos(),
        {"baseline": BASE_COUNTERS, "offload": off_counters(100.0)},
        {"baseline": 0.0, "offload": 0.3},
    )  # fmt: skip
    warn = [p for p in checks.preconditions if p.check == "baseline_cache"]
    assert warn[0].status == "warn" and "0%" in warn[0].message


def test_different_kv_capacity_is_named_beside_every_latency_verdict() -> None:
    checks = run(MULTI, loaded=200_000.0, off_blocks=2000)
    caveat = checks.caveats["offload"]["mean_itl_ms"]
    assert "KV capacity -16%" in caveat
    assert any(p.check == "kv_capacity" and p.status == "warn" for p in checks.preconditions)
    assert "offload" not in run(MULTI, loaded=200_000.0).caveats


def test_without_load_counters_the_cached_share_decides() -> None:
    checks = check_scenario(
        MULTI, ["baseline", "offload"], infos(),
        {"baseline": {}, "offload": {}},
        {"baseline": 0.05, "offload": 0.05},
    )  # fmt: skip
    assert checks.verdict == NEVER_ENGAGED


def test_token_sources_come_from_the_engine_counters() -> None:
    before = read_counters(
        'vllm:prefix_cache_queries_total{engine="0"} 100\n'
        'vllm:prefix_cache_hits_total{engine="0"} 10\n'
        'vllm:external_prefix_cache_hits_total{engine="0"} 0\n'
        'lmcache:num_stored_tokens_total{worker_id="0"} 0\n'
    )
    after = read_counters(
        'vllm:prefix_cache_queries_total{engine="0"} 1100\n'
        'vllm:prefix_cache_hits_total{engine="0"} 210\n'
        'vllm:external_prefix_cache_hits_total{engine="0"} 512\n'
        'lmcache:num_stored_tokens_total{worker_id="0"} 256\n'
        'vllm:prompt_tokens_cached_by_source_total{engine="0",source="disk"} 512\n'
    )
    src = TokenSources.of(counter_delta(before, after))
    assert (src.looked_up_tokens, src.gpu_cache_tokens, src.offload_tokens) == (1000, 200, 512)
    assert src.computed_tokens == 288 and src.stored_tokens == 256
    assert "cached_by_source:disk" not in counter_delta(before, after)  # absent before


def test_nothing_loaded_reads_back_from_old_and_malformed_documents() -> None:
    """results.json from before the field, or with a hostile value there, reads back without an
    error: the names of arms that are strings, else none."""
    doc = run(SINGLE, loaded=0.0).to_json()
    assert ScenarioChecks.from_json(doc).nothing_loaded == ["offload"]
    for value, names in ((None, []), (5, []), ("offload", []), (["offload", 3, {}], ["offload"])):
        assert ScenarioChecks.from_json({**doc, "nothing_loaded": value}).nothing_loaded == names
    del doc["nothing_loaded"]
    assert ScenarioChecks.from_json(doc).nothing_loaded == []


@pytest.mark.parametrize(
    ("sum_s", "count", "read"),
    [("1.5", "30", (1.5, 30)), ("NaN", "30", None), ("+Inf", "30", None), ("1.5", "+Inf", None),
     ("-2", "30", None), ("1.5", "-1", None)],
)  # fmt: skip
def test_an_emission_lag_that_is_not_a_finite_count_is_no_lag(
    sum_s: str, count: str, read: tuple[float, int] | None
) -> None:
    """A server's /metrics decides whether verdicts are withheld, so a NaN, infinite or
    negative histogram counts as none (and never as an exception mid-run)."""
    page = (
        f"kvops:sim_emission_lag_seconds_sum {sum_s}\n"
        f"kvops:sim_emission_lag_seconds_count {count}\n"
    )
    assert emission_lag_of(page) == read
