"""The GPU block pool: prefix hits, sharing, tail-first LRU eviction, reset."""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.sim.kvcache import GpuKvCache


def test_shared_blocks_stay_until_last_user_and_evict_tail_first() -> None:
    cache = GpuKvCache(num_blocks=6, block_size=16)
    a = [101, 102, 103]
    assert cache.allocate(3)
    ids = cache.register_run(a)
    assert len(ids) == 3
    cache.acquire(cache.lookup(a, 2))  # a second request shares the first two blocks
    assert cache.allocate(1)  # ...and has one block of its own
    cache.release(ids, unhashed=0)  # first request done: 103 evictable, 101/102 still shared
    assert len(cache.lookup(a, 3)) == 3 and cache.available() == 3
    cache.release(ids[:2], unhashed=1)
    assert cache.available() == 6 and cache.usage() == 0.0
    assert cache.allocate(4)  # 3 free + evicts the least recently freed block: 103
    assert len(cache.lookup(a, 3)) == 2
    assert cache.allocate(1)  # then the tail of the later release (102) before its head (101)
    assert len(cache.lookup(a, 3)) == 1
    assert cache.evictable_among(cache.lookup(a, 3)) == 1


def test_duplicate_registration_stops_at_the_resident_hash() -> None:
    cache = GpuKvCache(num_blocks=8, block_size=16)
    cache.allocate(2)
    assert len(cache.register_run([1, 2])) == 2
    cache.allocate(3)
    assert len(cache.register_run([7, 2, 9])) == 1  # 2 is already resident: kept unhashed


def test_reset_refuses_while_blocks_are_in_use() -> None:
    cache = GpuKvCache(num_blocks=4, block_size=16)
    cache.allocate(2)
    ids = cache.register_run([1, 2])
    assert cache.reset() is False
    cache.release(ids, unhashed=0)
    assert cache.reset() is True and len(cache.lookup([1, 2], 2)) == 0 and cache.available() == 4


class _ReferenceCache:
    """The pool's rules written plainly (dicts, one block at a time), to check the vectorised
    `GpuKvCache` against."""

    def __init__(self, num_blocks: int) -> None:
        self.free = num_blocks
        self.users: dict[int, int] = {}
        self.lru: dict[int, None] = {}  # evictable, least recently freed first

    def available(self) -> int:
        return self.free + len(self.lru)

    def lookup(self, hashes: list[int], limit: int) -> int:
        n = 0
        while n < min(limit, len(hashes)) and hashes[n] in self.users:
            n += 1
        return n

    def acquire(self, hashes: list[int]) -> None:
        for h in hashes:
            if self.users[h] == 0:
                del self.lru[h]
            self.users[h] += 1

    def allocate(self, count: int) -> bool:
        if self.available() < count:
            return False
        take = min(self.free, count)
        self.free -= take
        for _ in range(count - take):
            h = next(iter(self.lru))
            del self.lru[h], self.users[h]
        return True

    def register_run(self, hashes: list[int]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] not in self.users:
            self.users[hashes[n]] = 1
            n += 1
        return n

    def release(self, hashes: list[int], unhashed: int) -> None:
        for h in reversed(hashes):
            self.users[h] -= 1
            if not self.users[h]:
                self.lru[h] = None
        self.free += unhashed

    def reset(self) -> bool:
        if any(self.users.values()):
            return False
        self.free += len(self.lru)
        self.users.clear()
        self.lru.clear()
        return True


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(4, 80),
    slot_bits=st.sampled_from([2, 6, 64]),  # 2 and 6: hashes crowd a few table slots
    steps=st.integers(1, 120),
)
def test_matches_the_plain_reference_model(
    seed: int, num_blocks: int, slot_bits: int, steps: int
) -> None:
    rng = random.Random(seed)

    def block_hash() -> int:
        low = rng.getrandbits(slot_bits) if slot_bits < 64 else rng.getrandbits(20)
        return (rng.getrandbits(40) << 24 | low) if slot_bits < 64 else rng.getrandbits(64)

    chains = [[block_hash() for _ in range(rng.randint(1, num_blocks))] for _ in range(6)]
    cache, ref = GpuKvCache(num_blocks, 16), _ReferenceCache(num_blocks)
    held: list[tuple[npt.NDArray[np.int64], list[int], int]] = []  # ids, hashes, unhashed
    for _ in range(steps):
        op = rng.random()
        if op < 0.5 or not held:  # a request: prefix hit, allocation, registration
            chain = rng.choice(chains)
            want = rng.randint(1, len(chain))
            ids = cache.lookup(chain, want)
            hits = ref.lookup(chain, want)
            assert len(ids) == hits
            assert cache.evictable_among(ids) == sum(ref.users[h] == 0 for h in chain[:hits])
            need = want - hits
            if cache.available() - cache.evictable_among(ids) < need:
                continue
            cache.acquire(ids)
            ref.acquire(chain[:hits])
            assert cache.allocate(need) and ref.allocate(need)
            new = cache.register_run(chain[hits:want])
            assert len(new) == ref.register_run(chain[hits:want])
            all_ids = np.concatenate((ids, new))
            held.append((all_ids, chain[: len(all_ids)], want - len(all_ids)))
        elif op < 0.9:
            ids, hashes, unhashed = held.pop(rng.randrange(len(held)))
            cache.release(ids, unhashed)
            ref.release(hashes, unhashed)
        elif op < 0.95:
            got = cache.allocate(1)  # a decode's new block
            assert got == ref.allocate(1)
            if got:
                held.append((np.zeros(0, dtype=np.int64), [], 1))
        else:
            assert cache.reset() == ref.reset()
        assert cache.available() == ref.available()
        assert cache.in_use_hashed() == sum(1 for u in ref.users.values() if u)
        for chain in chains:
            assert len(cache.lookup(chain, len(chain))) == ref.lookup(chain, len(chain))
