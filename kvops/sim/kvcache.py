"""The GPU KV cache: a pool of fixed-size blocks with vLLM-style automatic prefix caching.

Full prompt blocks are known by their prefix hash; a block stays cached after its last user
finishes and is evicted least-recently-freed first. A request's blocks are freed tail-first (as
vLLM's free queue does), so the end of a long prefix goes before its start. Blocks that are not
shareable (the partial last block, generated tokens, or a duplicate computed concurrently by two
requests) are counted without a hash. Blocks are counted, not materialised, which keeps a
30K-token request at a few hundred dictionary operations.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class GpuKvCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = num_blocks  # neither referenced nor cached
        self.cached: OrderedDict[int, None] = OrderedDict()  # evictable, LRU first
        self.refs: dict[int, int] = {}  # hashed blocks in use -> reference count

    def available(self) -> int:
        """Blocks a new allocation can take (free plus evictable)."""
        return self.free_blocks + len(self.cached)

    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's `kv_cache_usage_perc` (cached-free counts free)."""
        return 1.0 - self.available() / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: Sequence[int], limit: int) -> int:
        """Number of leading blocks (at most `limit`) whose hashes are resident."""
        refs, cached = self.refs, self.cached
        n = 0
        for h in hashes[:limit]:
            if h in refs or h in cached:
                n += 1
            else:
                break
        return n

    def evictable_among(self, hashes: Sequence[int]) -> int:
        cached = self.cached
        return sum(1 for h in hashes if h in cached)

    def acquire(self, hashes: Sequence[int]) -> None:
        """Take a reference on resident blocks (a prefix hit)."""
        refs, cached = self.refs, self.cached
        for h in hashes:
            if h in cached:
                del cached[h]
                refs[h] = 1
            else:
                refs[h] += 1

    def allocate(self, count: int) -> bool:
        """Take `count` unhashed blocks, evicting cached ones LRU-first; False if impossible."""
        if count <= 0:
            return True
        if self.available() < count:
            return False
        from_free = min(self.free_blocks, count)
        self.free_blocks -= from_free
        cached = self.cached
        for _ in range(count - from_free):
            cached.popitem(last=False)
        return True

    def register(self, h: int) -> bool:
        """Give an allocated block the hash of the prefix it now holds. False when that prefix
        is already resident elsewhere (the caller keeps the block as an unhashed duplicate)."""
        if h in self.refs or h in self.cached:
            return False
        self.refs[h] = 1
        return True

    def release(self, hashes: Sequence[int], unhashed: int) -> None:
        """Drop a request's references; blocks nobody uses become evictable, tail first."""
        refs, cached = self.refs, self.cached
        for h in reversed(hashes):
            count = refs[h] - 1
            if count:
                refs[h] = count
            else:
                del refs[h]
                cached[h] = None
        self.free_blocks += unhashed

    def reset(self) -> bool:
        """Drop every evictable cached block (vLLM `/reset_prefix_cache`); False while blocks
        are in use, as vLLM answers then."""
        if self.refs:
            return False
        self.free_blocks += len(self.cached)
        self.cached.clear()
        return True
