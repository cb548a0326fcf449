"""The GPU block pool: prefix hits, sharing, tail-first LRU eviction, reset."""

from __future__ import annotations

from kvops.sim.kvcache import GpuKvCache


def test_shared_blocks_stay_until_last_user_and_evict_tail_first() -> None:
    cache = GpuKvCache(num_blocks=6, block_size=16)
    a = [101, 102, 103]
    assert cache.allocate(3) and cache.register_run(a) == 3
    cache.acquire(a[:2], evictable=0)  # a second request shares the first two blocks
    assert cache.allocate(1)  # ...and has one block of its own
    cache.release(a, unhashed=0)  # first request done: 103 evictable, 101/102 still shared
    assert cache.lookup(a, 3) == 3 and cache.available() == 3
    cache.release(a[:2], unhashed=1)
    assert cache.available() == 6 and cache.usage() == 0.0
    assert cache.allocate(4)  # 3 free + evicts the least recently freed block: 103
    assert cache.lookup(a, 3) == 2
    assert cache.allocate(1)  # then the tail of the later release (102) before its head (101)
    assert cache.lookup(a, 3) == 1
    assert cache.evictable_among(a) == 1


def test_duplicate_registration_stops_at_the_resident_hash() -> None:
    cache = GpuKvCache(num_blocks=8, block_size=16)
    cache.allocate(2)
    assert cache.register_run([1, 2]) == 2
    cache.allocate(3)
    assert cache.register_run([7, 2, 9]) == 1  # 2 is already resident: kept unhashed


def test_reset_refuses_while_blocks_are_in_use() -> None:
    cache = GpuKvCache(num_blocks=4, block_size=16)
    cache.allocate(2)
    cache.register_run([1, 2])
    assert cache.reset() is False
    cache.release([1, 2], unhashed=0)
    assert cache.reset() is True and cache.lookup([1, 2], 2) == 0 and cache.available() == 4
