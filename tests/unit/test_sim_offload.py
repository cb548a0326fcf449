"""The offload tier: write landing, lookup, fastest level first, bounded levels evict."""

from __future__ import annotations

from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.offload import OffloadTier
from kvops.sim.profiles import load_storage

KV_BYTES = 131_072  # Llama-3.1-8B per token
CHUNK_GB = 256 * KV_BYTES / 1e9


def tier(**settings: object) -> OffloadTier:
    lm = LMCacheSettings(**settings)  # type: ignore[arg-type]
    return OffloadTier(
        lm, load_storage("ontap-nfs-rdma-200g"), load_storage("host-dram"), KV_BYTES, 1
    )


def test_chunks_are_readable_only_after_their_write_lands() -> None:
    t = tier(local_cpu=False, gds_path="/g", gds_buffer_size=1)
    wait_s, new = t.store([1, 2, 3], step_end_s=1.0, blocking=False)
    assert wait_s == 0.0 and new == [1, 2, 3]
    assert t.store([2, 3, 4], 1.0, False)[1] == [4]  # LMCache skips puts it already has
    t.advance(1.0)
    assert t.lookup_tokens([1, 2, 3], 10_000) == 0  # still in flight
    t.advance(2.0)
    assert t.lookup_tokens([1, 2, 3, 9], 10_000) == 3 * 256
    assert t.lookup_tokens([1, 2, 3], 3 * 256) == 3 * 256 - 1  # never the whole prompt


def test_blocking_store_makes_the_step_wait_for_the_write() -> None:
    t = tier(local_cpu=False, gds_path="/g", gds_buffer_size=1)
    wait_s, _ = t.store([1, 2], 0.0, blocking=True)
    assert wait_s > 2 * 256 * KV_BYTES / (18.75e9)  # bytes at the write bandwidth, plus latency


def test_cpu_hot_cache_evicts_but_gds_keeps_everything() -> None:
    t = tier(local_cpu=True, max_local_cpu_size=2.5 * CHUNK_GB, gds_path="/g", gds_buffer_size=1)
    assert [lv.name for lv in t.levels] == ["local_cpu", "gds"]
    t.store([1, 2, 3, 4], 0.0, False)
    t.advance(10.0)
    assert t.stats.evictions == 2 and len(t.levels[0].landed) == 2
    assert t.lookup_tokens([1, 2, 3, 4], 10_000) == 4 * 256  # GDS still has chunks 1 and 2
    mixed = t.load_time_s([1, 2, 3, 4], 0, 4 * 256)
    only_cpu = t.load_time_s([1, 2, 3, 4], 2 * 256, 4 * 256)
    assert only_cpu < mixed


def test_lmcache_defaults_give_only_a_bounded_cpu_level() -> None:
    t = tier()
    assert [(lv.name, lv.capacity_chunks) for lv in t.levels] == [
        ("local_cpu", int(5.0e9 // (256 * KV_BYTES)))
    ]


def test_preloaded_chunks_from_a_previous_run_are_hits() -> None:
    t = tier(local_cpu=False, gds_path="/g", gds_buffer_size=1)
    t.preload([7, 8])
    assert t.lookup_tokens([7, 8], 10_000) == 512
    assert t.store([7], 0.0, False)[1] == []


def test_a_miss_finds_chunks_another_process_stored_on_disk() -> None:
    """LMCache's GDS `contains()` looks on disk when its index misses: a chunk stored by another
    engine sharing the directory is a hit, up to the first chunk no process has stored."""
    t = tier(local_cpu=False, gds_path="/g", gds_buffer_size=1)
    on_disk = {1, 2, 4}
    asked: list[int] = []

    def probe(h: int) -> bool:
        asked.append(h)
        return h in on_disk

    assert t.lookup_tokens([1, 2, 3, 4], 10_000) == 0  # no probe: the start-up scan only
    t.file_probe = probe
    assert t.lookup_tokens([1, 2, 3, 4], 10_000) == 2 * 256
    assert asked == [1, 2, 3]  # stops at the first chunk nobody stored
    assert t.store([1, 2, 3], 0.0, False)[1] == [3]  # found chunks are not written again
    asked.clear()
    t.advance(0.0)
    assert t.lookup_tokens([1, 2], 10_000) == 2 * 256 and asked == []  # now indexed


def test_a_chunk_this_tier_is_still_writing_is_not_probed() -> None:
    t = tier(local_cpu=False, gds_path="/g", gds_buffer_size=1)
    t.store([1], step_end_s=5.0, blocking=False)
    t.file_probe = lambda h: True
    t.advance(1.0)
    assert t.lookup_tokens([1, 2], 10_000) == 0  # lands when its modelled write ends
