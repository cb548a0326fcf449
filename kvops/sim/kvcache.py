"""The GPU KV cache: a pool of fixed-size blocks with vLLM-style automatic prefix caching.

Full prompt blocks are known by their prefix hash; a block stays cached after its last user
finishes and is evicted least-recently-freed first. A request's blocks are freed tail-first (as
vLLM's free queue does), so the end of a long prefix goes before its start. Blocks that are not
shareable (the partial last block, generated tokens, or a duplicate computed concurrently by two
requests) are counted without a hash. Blocks are counted, not materialised, which keeps a
30K-token request at a few hundred dictionary operations.
"""

from __future__ import annotations

import collections
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, islice, repeat, takewhile
from operator import not_, sub

# Counter.update's C helper, called directly: Counter.update itself adds an ABC isinstance check
# and a Python frame per call.
_count_elements: Callable[[Mapping[int, int], Iterable[int]], None] = collections._count_elements  # type: ignore[attr-defined]


def _consume(iterator: object) -> None:
    """Run a C-level map for its side effects."""
    deque(iterator, maxlen=0)  # type: ignore[call-overload]


class GpuKvCache:
    """Block pool with prefix caching. Bulk operations run as C-level dict/Counter operations
    (about 30 ns per block rather than a Python loop's ~150 ns)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = num_blocks  # neither hashed nor in use
        self.epoch = 0  # bumped whenever which blocks are resident or evictable changes
        self.resident: Counter[int] = Counter()  # hashed blocks -> users (0 = evictable)
        # The evictable ones, LRU first. A plain dict keeps insertion order and bulk-updates
        # several times faster than OrderedDict; a block is re-appended after every use.
        self.lru: dict[int, None] = {}

    def available(self) -> int:
        """Blocks a new allocation can take (free plus evictable)."""
        return self.free_blocks + len(self.lru)

    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's `kv_cache_usage_perc` (cached-free counts free)."""
        return 1.0 - self.available() / self.num_blocks if self.num_blocks else 0.0

    def in_use_hashed(self) -> int:
        return len(self.resident) - len(self.lru)

    def lookup(self, hashes: Sequence[int], limit: int) -> int:
        """Number of leading blocks (at most `limit`) whose hashes are resident."""
        return len(list(takewhile(self.resident.__contains__, islice(hashes, limit))))

    def evictable_among(self, hashes: Sequence[int]) -> int:
        return sum(map(self.lru.__contains__, hashes))

    def acquire(self, hashes: Sequence[int], evictable: int = -1) -> None:
        """Take a reference on resident blocks (a prefix hit); `evictable` (how many of them
        are evictable, if the caller knows) lets a hit on in-use blocks skip the LRU pass."""
        self.epoch += 1
        if evictable:
            _consume(map(self.lru.pop, hashes, repeat(None)))
        _count_elements(self.resident, hashes)

    def allocate(self, count: int) -> bool:
        """Take `count` unhashed blocks, evicting cached ones LRU-first; False if impossible."""
        if count <= 0:
            return True
        if self.available() < count:
            return False
        from_free = min(self.free_blocks, count)
        self.free_blocks -= from_free
        evict = count - from_free
        if evict:
            self.epoch += 1
            victims = list(islice(self.lru, evict))
            _consume(map(self.lru.pop, victims))
            _consume(map(self.resident.pop, victims))
        return True

    def register_run(self, hashes: Sequence[int]) -> int:
        """Give allocated blocks the hashes of the prefixes they now hold, in order, up to the
        first hash already resident elsewhere (a duplicate computed concurrently: the caller
        keeps that block and the rest unhashed). Returns how many were registered."""
        resident = self.resident
        if resident.keys().isdisjoint(hashes):
            n = len(hashes)
            _count_elements(resident, hashes)
        else:
            n = len(list(takewhile(lambda h: h not in resident, hashes)))
            _count_elements(resident, hashes[:n])
        if n:
            self.epoch += 1
        return n

    def release(self, hashes: Sequence[int], unhashed: int) -> None:
        """Drop a request's references; blocks nobody uses become evictable, tail first
        (vLLM frees a request's blocks in reverse so a prefix's tail is evicted first).
        All C-level passes: a fast path when no block is shared, else a general one."""
        resident, lru = self.resident, self.lru
        self.epoch += 1
        if hashes and max(map(resident.__getitem__, hashes)) == 1:
            dict.update(resident, dict.fromkeys(hashes, 0))  # Counter.update would loop
            lru.update(dict.fromkeys(reversed(hashes)))
        elif hashes:
            counts = list(map(sub, map(resident.__getitem__, hashes), repeat(1)))
            dict.update(resident, zip(hashes, counts, strict=True))
            lru.update(dict.fromkeys(compress(reversed(hashes), map(not_, reversed(counts)))))
        self.free_blocks += unhashed

    def reset(self) -> bool:
        """Drop every evictable cached block (vLLM `/reset_prefix_cache`); False while hashed
        blocks are in use, as vLLM answers then."""
        if self.in_use_hashed():
            return False
        self.epoch += 1
        self.free_blocks += len(self.lru)
        self.lru.clear()
        self.resident.clear()
        return True
