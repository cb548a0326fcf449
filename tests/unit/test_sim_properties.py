"""Properties of the engine over generated workloads (hypothesis)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import EngineSettings, Request, build_engine
from kvops.sim.profiles import load_storage
from kvops.sim.records import SimRequestRecord

workloads = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "num_requests": st.integers(1, 10),
        "num_prefixes": st.integers(0, 4),
        "prefix_len": st.integers(1, 400),
        "suffix_len": st.integers(1, 200),
        "max_output": st.integers(1, 40),
    }
)


def make_requests(w: dict[str, int], gap_s: float) -> list[Request]:
    """Requests sharing a few prefixes, from a local seeded RNG."""
    rng = np.random.default_rng(w["seed"])
    prefixes = [rng.integers(0, 1000, w["prefix_len"]) for _ in range(w["num_prefixes"])]
    reqs = []
    for i in range(w["num_requests"]):
        suffix = rng.integers(0, 1000, int(rng.integers(1, w["suffix_len"] + 1)))
        if prefixes:
            prompt = np.concatenate([prefixes[int(rng.integers(len(prefixes)))], suffix])
        else:
            prompt = suffix
        out = int(rng.integers(1, w["max_output"] + 1))
        reqs.append(Request(f"r{i}", i * gap_s, prompt, out))
    return reqs


def offload_settings(**kw: object) -> EngineSettings:
    lm = LMCacheSettings(chunk_size=32, local_cpu=False, gds_path="/g", gds_buffer_size=0)
    return EngineSettings(offload=True, lmcache=lm, **kw)  # type: ignore[arg-type]


def gpu_hit_rate(records: list[SimRequestRecord]) -> float:
    return sum(r.gpu_hit_tokens for r in records) / sum(r.prompt_tokens for r in records)


@settings(max_examples=25, deadline=None)
@given(
    w=workloads, blocks=st.integers(40, 200), offload=st.booleans(), gap=st.sampled_from([0, 0.01])
)
def test_every_request_completes_with_its_token_counts(
    w: dict[str, int], blocks: int, offload: bool, gap: float
) -> None:
    s = offload_settings(num_gpu_blocks_override=blocks, max_num_batched_tokens=256)
    s.offload = offload
    reqs = make_requests(w, gap)
    records = build_engine(settings=s).run(reqs)
    for req, rec in zip(reqs, records, strict=True):
        assert len(rec.token_times_s) == req.output_tokens
        assert rec.prompt_tokens == len(req.prompt_tokens)
        assert rec.gpu_hit_tokens + rec.offload_hit_tokens + rec.computed_prompt_tokens == (
            rec.prompt_tokens
        )
        assert rec.finish_s is not None and rec.finish_s >= rec.arrival_s


@settings(max_examples=25, deadline=None)
@given(w=workloads, small=st.integers(40, 150), extra=st.integers(0, 300))
def test_more_gpu_memory_never_lowers_the_gpu_hit_rate(
    w: dict[str, int], small: int, extra: int
) -> None:
    """Requests one at a time (as a sequential trace): LRU's inclusion property must hold."""
    rates = []
    for blocks in (small, small + extra):
        s = EngineSettings(num_gpu_blocks_override=blocks)
        rates.append(gpu_hit_rate(build_engine(settings=s).run(make_requests(w, 100.0))))
    assert rates[1] >= rates[0]


@settings(max_examples=25, deadline=None)
@given(w=workloads, factor=st.floats(1.0, 8.0), blocking=st.booleans(), blocks=st.integers(40, 150))
def test_faster_storage_never_slows_the_offload_arm(
    w: dict[str, int], factor: float, blocking: bool, blocks: int
) -> None:
    base = load_storage("ontap-nfs-rdma-100g")
    faster = dataclasses.replace(
        base,
        read_bandwidth_gb_s=base.read_bandwidth_gb_s * factor,
        write_bandwidth_gb_s=base.write_bandwidth_gb_s * factor,
        io_latency_us=base.io_latency_us / factor,
    )
    finishes = []
    for storage in (base, faster):
        s = offload_settings(num_gpu_blocks_override=blocks, store_blocking=blocking)
        records = build_engine(storage=storage, settings=s).run(make_requests(w, 100.0))
        finishes.append([r.finish_s - r.arrival_s for r in records])  # type: ignore[operator]
    for slow_s, fast_s in zip(*finishes, strict=True):
        assert fast_s <= slow_s + 1e-12
