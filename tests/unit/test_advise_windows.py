"""A long trace replayed as sampled windows: one window per slice, seeded; each warm-up reaches
back far enough to rebuild the GPU cache, so a window's counted requests see the same cache
hits as in the whole replay; and the report says what was sampled and what that costs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from kvops.advise.analysis import AdviseOptions, analyse
from kvops.advise.arms import Profiles
from kvops.advise.recommend import advise
from kvops.advise.render import report_dict
from kvops.advise.trace import ReadOptions, read_lines, word_tokenizer
from kvops.advise.windows import WindowReplay, plan_windows, spread_indices
from kvops.advise.workload import PromptBuilder, Workload, request_units
from kvops.sim.engine import EngineSettings
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import build_engine
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.sim.records import Request

VOCAB = 128_256
BLOCK = 512
PROFILES = Profiles(
    load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
)


def _trace(n: int, gap_s: float, prefixes: int = 12, seed: int = 3) -> Workload:
    """Each prompt: one of `prefixes` shared 2-block prefixes plus a unique block."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        p = int(rng.integers(0, prefixes))
        ids = [2 * p, 2 * p + 1, 10_000 + i]
        lines.append(
            json.dumps(
                {
                    "arrival_s": i * gap_s,
                    "input_length": 3 * BLOCK,
                    "output_tokens": 2,
                    "hash_ids": ids,
                }
            )
        )
    return read_lines(lines, "t.jsonl", ReadOptions(), word_tokenizer(VOCAB))


def test_one_window_per_slice_seeded_with_warmups_that_fill_the_gpu_cache() -> None:
    w = _trace(400, 1.0)
    units = list(request_units(w, PromptBuilder(VOCAB, BLOCK), 256))
    plan = plan_windows(units, 4, 20, capacity_tokens=12 * BLOCK, seed=7)
    assert plan == plan_windows(units, 4, 20, capacity_tokens=12 * BLOCK, seed=7)
    assert plan.windows != plan_windows(units, 4, 20, 12 * BLOCK, seed=8).windows
    for k, win in enumerate(plan.windows):
        assert 100 * k <= win.start and win.stop <= 100 * (k + 1) and win.stop - win.start == 20
        assert not win.warmup_capped
        # The warm-up touches at least the GPU capacity in distinct tokens (shared blocks once).
        distinct = {key for _, keys, _ in units[win.warmup_start : win.start] for key in keys}
        tails = sum(
            r.prompt_len + r.output_tokens for r, _, _ in units[win.warmup_start : win.start]
        )
        footprint = tails - sum(len(keys) * u for _, keys, u in units[win.warmup_start : win.start])
        assert footprint + len(distinct) * BLOCK >= 12 * BLOCK or win.warmup_start == 0
    assert plan.counted_requests == 80
    assert spread_indices(2, 8) == [0, 7] and spread_indices(3, 3) == [0, 1, 2]


def test_a_warmed_window_sees_the_hits_of_the_whole_replay() -> None:
    """Sparse arrivals (each request done before the next): the cache state at a window's start
    is all that carries over, so hits per counted request match the whole replay exactly."""
    w = _trace(240, 5.0, prefixes=30)
    builder = PromptBuilder(VOCAB, BLOCK)
    blocks = 200  # 3,200 tokens: about one prompt's worth, so the GPU cache keeps few prefixes
    lm = LMCacheSettings(chunk_size=256, local_cpu=False, gds_path="(virtual)", gds_buffer_size=0)
    base = EngineSettings(num_gpu_blocks_override=blocks)
    off = dataclasses.replace(base, offload=True, lmcache=lm)
    units = list(request_units(w, builder, 256))
    plan = plan_windows(units, 3, 30, capacity_tokens=blocks * 16, seed=1)
    replay = WindowReplay(w, units, plan, builder, 16, 256)
    reqs = list(w.requests())
    for settings, name in ((base, "baseline"), (off, "offload")):
        engine = build_engine(PROFILES.model, PROFILES.gpu, PROFILES.storage, settings)
        records = engine.run(
            Request(str(r.line), r.arrival_s, builder.tokens(r), r.output_tokens) for r in reqs
        )
        windows = replay.run(name, PROFILES, settings, [0, 1, 2])
        for win, got in zip(plan.windows, windows, strict=True):
            whole = records[win.start : win.stop]
            assert got.completed == win.stop - win.start
            assert got.gpu_hit_tokens == sum(r.gpu_hit_tokens for r in whole)
            assert got.offload_hit_tokens == sum(r.offload_hit_tokens for r in whole)
            assert got.offload_hit_tokens > 0 or name == "baseline"


def test_a_long_trace_is_sampled_and_the_report_says_so() -> None:
    w = _trace(600, 0.05, prefixes=40)
    options = AdviseOptions(sample_requests=160, window_requests=40, flips=False)
    a = analyse(w, PROFILES, options, PromptBuilder(VOCAB, BLOCK))
    s = a.sampling
    assert s is not None and len(s.plan.windows) == 4 and s.plan.counted_requests == 160
    assert a.baseline.completed == 160 and a.sample_requests == s.range_requests == 80
    for d in a.deltas:  # the sampling interval widens each range around the nominal delta
        half = s.half_width_pct[d.metric]
        assert 0 <= half < float("inf")
        assert d.low_pct <= d.pct - half and d.high_pct >= d.pct + half
    assert s.half_width_pct["mean_ttft_ms"] > 0
    data = report_dict(a, advise(a))
    assert data["sampling"]["counted_requests"] == 160
    assert data["sampling"]["total_requests"] == 600
    assert any(n.startswith("sampled: the arms replayed 4 windows of 40") for n in data["notes"])
    # 600 short prompts never fill an H100's KV cache: the warm-ups stop at their limit, and
    # the report says so.
    assert s.capped_warmups > 0
    assert any("warm-up capped" in n for n in data["notes"])


def test_a_trace_within_the_sample_is_replayed_whole() -> None:
    w = _trace(60, 0.5)
    a = analyse(w, PROFILES, AdviseOptions(corners=False, flips=False), PromptBuilder(VOCAB, BLOCK))
    assert a.sampling is None and a.sample_requests is None and a.baseline.completed == 60
