"""The engine's mechanics, and the seed's three outcomes reproduced from physics."""

from __future__ import annotations

import numpy as np
import pytest

from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import EngineError, EngineSettings, Request, build_engine, simulate
from kvops.sim.seed_workloads import SeedShape, run_batches, seed_batches, summarize


def gds(**overrides: object) -> LMCacheSettings:
    base: dict[str, object] = {"local_cpu": False, "gds_path": "/gds", "gds_buffer_size": 8192}
    base.update(overrides)
    return LMCacheSettings(**base)  # type: ignore[arg-type]


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128_256, n).tolist()


@pytest.fixture(scope="module")
def seed_results() -> dict[str, dict[bool, object]]:
    shape = SeedShape(batch_size=40, iterations=4, output_tokens=64)
    out: dict[str, dict[bool, object]] = {}
    for scenario in ("unique", "one-prefix", "multi-prefix"):
        out[scenario] = {}
        for offload in (False, True):
            engine = build_engine(settings=EngineSettings(offload=offload, lmcache=gds()))
            out[scenario][offload] = summarize(run_batches(engine, seed_batches(scenario, shape)))
    return out


def test_unique_prompts_gain_nothing(seed_results: dict) -> None:
    base, off = seed_results["unique"][False], seed_results["unique"][True]
    assert off.offload_hit_tokens == 0
    assert off.total_token_throughput_tok_s <= base.total_token_throughput_tok_s * 1.03
    assert off.mean_ttft_ms >= base.mean_ttft_ms * 0.97


def test_one_resident_prefix_gains_nothing(seed_results: dict) -> None:
    base, off = seed_results["one-prefix"][False], seed_results["one-prefix"][True]
    assert base.gpu_hit_tokens > 0  # the prefix stays on the GPU in both arms
    assert off.total_token_throughput_tok_s <= base.total_token_throughput_tok_s * 1.03
    assert off.mean_ttft_ms >= base.mean_ttft_ms * 0.97


def test_many_long_prefixes_overflowing_the_gpu_gain_clearly(seed_results: dict) -> None:
    base, off = seed_results["multi-prefix"][False], seed_results["multi-prefix"][True]
    assert off.offload_hit_tokens > 0
    assert off.total_token_throughput_tok_s >= base.total_token_throughput_tok_s * 1.3
    assert off.mean_ttft_ms <= base.mean_ttft_ms * 0.8


def test_h100_llama8b_pool_is_smaller_than_twenty_prefixes() -> None:
    engine = build_engine()
    pool_gb = engine.cache.num_blocks * 16 * 131_072 / 1e9
    assert 45 < pool_gb < 65
    assert pool_gb < 20 * 28_000 * 131_072 / 1e9


def test_every_request_gets_its_tokens_and_times_are_ordered() -> None:
    reqs = [Request(f"r{i}", 0.01 * i, tokens(i, 300 + 50 * i), 5 + i) for i in range(6)]
    records = simulate(reqs)
    for req, rec in zip(reqs, records, strict=True):
        assert len(rec.token_times_s) == req.output_tokens
        assert rec.first_token_s is not None and rec.first_token_s > rec.arrival_s
        assert rec.token_times_s == sorted(rec.token_times_s)
        assert rec.computed_prompt_tokens == rec.prompt_tokens


def test_second_identical_prompt_hits_gpu_prefix_cache_in_whole_blocks() -> None:
    prompt = tokens(1, 1000)
    records = simulate([Request("a", 0.0, prompt, 2), Request("b", 10.0, prompt, 2)])
    assert records[1].gpu_hit_tokens == 992  # 62 full blocks; the last token is recomputed
    assert records[1].ttft_s is not None and records[0].ttft_s is not None
    assert records[1].ttft_s < records[0].ttft_s


def test_offload_serves_an_evicted_prefix() -> None:
    prompt, filler = tokens(1, 2048), tokens(2, 2048)
    settings = EngineSettings(num_gpu_blocks_override=200, offload=True, lmcache=gds())
    engine = build_engine(settings=settings)
    records = engine.run(
        [Request("a", 0.0, prompt, 1), Request("f", 5.0, filler, 1), Request("b", 10.0, prompt, 1)]
    )
    # The filler evicted the prefix's tail (vLLM frees tail blocks first); LMCache has the rest.
    assert 0 < records[2].gpu_hit_tokens < 2047
    assert records[2].offload_hit_tokens > 0
    assert records[2].gpu_hit_tokens + records[2].offload_hit_tokens == 2047
    assert engine.offload is not None and engine.offload.stats.stored_tokens == 2 * 2048


def test_preemption_under_a_tiny_cache_still_completes() -> None:
    settings = EngineSettings(num_gpu_blocks_override=70)
    reqs = [Request(f"r{i}", 0.0, tokens(i, 400), 200) for i in range(4)]
    engine = build_engine(settings=settings)
    records = engine.run(reqs)
    assert engine.stats.num_preemptions > 0
    assert all(len(r.token_times_s) == 200 for r in records)


def test_prompt_longer_than_max_model_len_is_rejected() -> None:
    engine = build_engine(settings=EngineSettings(max_model_len=100))
    with pytest.raises(ValueError, match="maximum context length is 100"):
        engine.add_request(Request("x", 0.0, tokens(0, 98), 5))


def test_model_too_big_for_gpu_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match=r"llama-3\.1-70b"):
        build_engine(model="llama-3.1-70b", gpu="h100-sxm-80gb")
    tp2 = build_engine(model="llama-3.1-70b", settings=EngineSettings(tensor_parallel_size=2))
    assert tp2.cache.num_blocks > 0


def test_capacity_knobs() -> None:
    full = build_engine().cache.num_blocks
    assert build_engine(settings=EngineSettings(kv_capacity_scale=0.25)).cache.num_blocks == (
        int(full * 0.25)
    )
    assert build_engine(settings=EngineSettings(num_gpu_blocks_override=40)).cache.num_blocks == 40
    # LMCache's GDS buffer lives in VRAM: the offload arm's pool is smaller by that much.
    off = build_engine(settings=EngineSettings(offload=True, lmcache=gds())).cache.num_blocks
    assert full - off == pytest.approx(8192 * 1024**2 / 131_072 / 16, abs=1)


def test_blocking_store_is_slower_than_overlapped() -> None:
    reqs = [Request("a", 0.0, tokens(3, 8192), 4)]
    fast = simulate(reqs, settings=EngineSettings(offload=True, lmcache=gds()))
    reqs = [Request("a", 0.0, tokens(3, 8192), 4)]
    slow = simulate(reqs, settings=EngineSettings(offload=True, lmcache=gds(), store_blocking=True))
    assert slow[0].finish_s is not None and fast[0].finish_s is not None
    assert slow[0].finish_s > fast[0].finish_s


def test_abort_frees_the_request() -> None:
    engine = build_engine(settings=EngineSettings(num_gpu_blocks_override=100))
    engine.add_request(Request("a", 0.0, tokens(0, 500), 50))
    engine.step()
    record = engine.abort("a")
    assert record is not None and record.aborted
    assert not engine.has_work()
    assert engine.cache.available() == 100


def test_break_even_bandwidth_from_physics() -> None:
    costs = build_engine().costs
    short, long = (costs.break_even_read_bandwidth_gb_s(n) for n in (1_000, 28_000))
    # KV bytes per token x (peak x MFU) / (2 x params), ~4 GB/s for Llama-3.1-8B on an H100.
    assert 3.0 < short < 5.5
    assert long < short  # attention makes long prefixes favour loading even more


def test_a_shared_prefix_is_copied_to_the_offload_buffer_once() -> None:
    """LMCache skips the chunks it already holds before copying: with one shared prefix, copies
    equal the chunks written, not every prompt's full chunks."""
    shape = SeedShape(
        prefix_tokens=2_048, suffix_tokens=512, batch_size=8, iterations=2, output_tokens=2
    )
    engine = build_engine(settings=EngineSettings(offload=True, lmcache=gds()))
    run_batches(engine, seed_batches("one-prefix", shape))
    assert engine.offload is not None
    stored_tokens = engine.offload.stats.stored_tokens
    assert engine.stats.offload_copied_tokens == stored_tokens
    prompts = shape.batch_size * shape.iterations
    full_chunks_sent = prompts * ((shape.prefix_tokens + shape.suffix_tokens) // 256) * 256
    assert stored_tokens < full_chunks_sent / 3


def test_spread_sends_put_late_prefills_between_decode_steps() -> None:
    """A batch sent over time instead of at one instant: requests arrive `send_interval_s`
    apart in send order, and a late arrival's prefill lands between the early requests'
    decode steps, so their inter-token gaps grow (what a real client's sends do to mean ITL)."""
    shape = SeedShape(
        prefix_tokens=2_048, suffix_tokens=512, batch_size=8, iterations=1, output_tokens=32
    )

    def records(interval_s: float) -> list:
        engine = build_engine()
        return run_batches(engine, seed_batches("unique", shape), interval_s)

    at_once, spread = records(0.0), records(0.05)
    assert {r.arrival_s for r in at_once} == {0.0}
    assert [r.arrival_s for r in spread] == pytest.approx([i * 0.05 for i in range(8)])
    # 15.3 ms -> 16.7 ms here: each arrival's 2,560-token prefill delays the decode steps
    assert summarize(spread).mean_itl_ms > 1.05 * summarize(at_once).mean_itl_ms
