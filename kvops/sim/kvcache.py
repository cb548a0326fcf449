"""The GPU KV cache: a pool of fixed-size blocks with vLLM-style automatic prefix caching.

Full prompt blocks are known by their prefix hash; a block stays cached after its last user
finishes and is evicted least-recently-freed first. A request's blocks are freed tail-first (as
vLLM's free queue does), so the end of a long prefix goes before its start. Blocks that are not
shareable (the partial last block, generated tokens, or a duplicate computed concurrently by two
requests) are counted without a hash.

Blocks are counted, not materialised, and every bulk operation is a handful of numpy passes: a
30K-token request touches ~1,900 blocks several times over its life, and 10,000 such requests
were ~10 s of dict and Counter passes (~50 ns per block per pass). Each hashed block has a
small integer id (its row in the per-block arrays); a hash finds its id through a direct-mapped
table indexed by the hash's low bits (the hashes are well mixed), with the rare hash whose slot
is taken kept in a dict. The LRU order is a queue of (id, stamp) entries appended as blocks
become evictable; an entry is live while its block's stamp still equals it, so taking a block
back into use or evicting it just changes its stamp, and eviction takes the first live entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

Hashes = Sequence[int] | npt.NDArray[np.uint64]
Ids = npt.NDArray[np.int64]

_NO_ID = -1
_NOT_EVICTABLE = -1  # the stamp of a block in use (or without a hash)


class GpuKvCache:
    """Block pool with prefix caching. Block hashes come as sequences of ints or uint64 arrays,
    in chain order; block ids as int64 arrays."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = num_blocks  # neither hashed nor in use
        self.epoch = 0  # bumped whenever which blocks are resident or evictable changes
        self._num_hashed = 0  # resident hashed blocks, in use or evictable
        self._num_evictable = 0
        rows = max(num_blocks, 1)
        # Per-block-id state. A hashed block occupies a physical block, so ids never run out.
        self._key = np.zeros(rows, dtype=np.uint64)
        self._users = np.zeros(rows, dtype=np.int64)
        self._stamp = np.full(rows, _NOT_EVICTABLE, dtype=np.int64)
        self._free_ids = np.arange(rows, dtype=np.int64)  # a stack: the first `_num_free_ids`
        self._num_free_ids = rows
        # hash -> id: a direct-mapped table ~8x the pool (few slots are contended) plus spills.
        bits = max(10, (8 * rows - 1).bit_length())
        self._mask = (1 << bits) - 1
        self._slot_key = np.zeros(1 << bits, dtype=np.uint64)
        self._slot_id = np.full(1 << bits, _NO_ID, dtype=np.int64)
        self._spill_count = np.zeros(1 << bits, dtype=np.int64)  # spilled hashes per slot
        self._spilled: dict[int, int] = {}  # hash -> id, for hashes whose slot was taken
        # The LRU queue: entries [head, tail) in the order blocks became evictable.
        self._queue_ids = np.zeros(max(64, 2 * rows), dtype=np.int64)
        self._queue_stamps = np.zeros_like(self._queue_ids)
        self._head = self._tail = 0
        self._next_stamp = 0

    # ----- counts ------------------------------------------------------------------------
    def available(self) -> int:
        """Blocks a new allocation can take (free plus evictable)."""
        return self.free_blocks + self._num_evictable

    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's `kv_cache_usage_perc` (cached-free counts free)."""
        return 1.0 - self.available() / self.num_blocks if self.num_blocks else 0.0

    def in_use_hashed(self) -> int:
        """Hashed blocks some request holds."""
        return self._num_hashed - self._num_evictable

    # ----- hash -> id ----------------------------------------------------------------------
    def _slots(self, hashes: npt.NDArray[np.uint64]) -> Ids:
        """Table slots of hashes: their low bits, as int64 (indexing with uint64 is ~2x slower:
        numpy converts the index array first)."""
        slots: Ids = hashes.view(np.int64) & self._mask
        return slots

    def _ids(self, hashes: npt.NDArray[np.uint64]) -> Ids:
        """The id of each resident hash, _NO_ID for the others."""
        slots = self._slots(hashes)
        ids: Ids = np.where(self._slot_key[slots] == hashes, self._slot_id[slots], _NO_ID)
        if self._spilled:
            missing = (ids == _NO_ID).nonzero()[0]
            maybe = missing[self._spill_count[slots[missing]] > 0]
            if maybe.shape[0]:
                ids[maybe] = list(map(self._spilled.get, hashes[maybe].tolist(), repeat(_NO_ID)))
        return ids

    def _index(self, hashes: npt.NDArray[np.uint64], ids: Ids) -> None:
        """Record hash -> id for new hashes. Hashes whose slot is held, or that lose a slot to
        another of the same batch (the read-back tells which write landed), spill."""
        slots = self._slots(hashes)
        open_ = (self._slot_id[slots] == _NO_ID).nonzero()[0]
        spill = np.ones(hashes.shape[0], dtype=bool)
        if open_.shape[0]:
            targets, tags = slots[open_], ids[open_]
            self._slot_id[targets] = tags
            won = self._slot_id[targets] == tags
            self._slot_key[targets[won]] = hashes[open_[won]]
            spill[open_[won]] = False
        spilled = spill.nonzero()[0]
        if spilled.shape[0]:
            self._spilled.update(zip(hashes[spilled].tolist(), ids[spilled].tolist(), strict=True))
            np.add.at(self._spill_count, slots[spilled], 1)

    def _unindex(self, ids: Ids) -> None:
        """Forget the hashes of these (evicted) ids."""
        hashes = self._key[ids]
        slots = self._slots(hashes)
        in_table = self._slot_id[slots] == ids
        self._slot_id[slots[in_table]] = _NO_ID
        spilled = (~in_table).nonzero()[0]
        if spilled.shape[0]:
            for h in hashes[spilled].tolist():
                del self._spilled[h]
            np.subtract.at(self._spill_count, slots[spilled], 1)

    # ----- the LRU queue -------------------------------------------------------------------
    def _enqueue(self, ids: Ids) -> None:
        """Make blocks evictable, in this order after every block evictable now."""
        n = ids.shape[0]
        if self._tail + n > self._queue_ids.shape[0]:
            self._compact_queue(n)
        stamps = np.arange(self._next_stamp, self._next_stamp + n, dtype=np.int64)
        self._next_stamp += n
        self._stamp[ids] = stamps
        self._queue_ids[self._tail : self._tail + n] = ids
        self._queue_stamps[self._tail : self._tail + n] = stamps
        self._tail += n
        self._num_evictable += n

    def _compact_queue(self, room: int) -> None:
        """Drop dead entries (blocks taken back into use or evicted); grow if still short."""
        ids = self._queue_ids[self._head : self._tail]
        stamps = self._queue_stamps[self._head : self._tail]
        live = self._stamp[ids] == stamps
        ids, stamps = ids[live], stamps[live]
        n = ids.shape[0]
        if n + room > self._queue_ids.shape[0] // 2:
            size = 2 * max(n + room, self._queue_ids.shape[0])
            self._queue_ids = np.zeros(size, dtype=np.int64)
            self._queue_stamps = np.zeros(size, dtype=np.int64)
        self._queue_ids[:n] = ids
        self._queue_stamps[:n] = stamps
        self._head, self._tail = 0, n

    def _evict(self, count: int) -> None:
        """Drop the `count` least recently freed evictable blocks (count <= evictable)."""
        taken: list[Ids] = []
        head, need = self._head, count
        while need:
            end = min(self._tail, head + max(2 * need, 256))
            ids = self._queue_ids[head:end]
            live = (self._stamp[ids] == self._queue_stamps[head:end]).nonzero()[0][:need]
            taken.append(ids[live])
            need -= live.shape[0]
            head = head + int(live[-1]) + 1 if not need else end
        self._head = head
        victims = taken[0] if len(taken) == 1 else np.concatenate(taken)
        self._stamp[victims] = _NOT_EVICTABLE
        self._unindex(victims)
        self._free_ids[self._num_free_ids : self._num_free_ids + count] = victims
        self._num_free_ids += count
        self._num_hashed -= count
        self._num_evictable -= count

    # ----- operations ----------------------------------------------------------------------
    # Blocks are named by hash when looked up or registered, then by the ids those return, as
    # vLLM hands out block objects. An id stays valid while its block is held (acquired or
    # registered and not yet released); the ids `lookup` returns, until the cache next changes
    # (its `epoch`).
    def lookup(self, hashes: Hashes, limit: int) -> Ids:
        """Ids of the leading blocks (at most `limit`) whose hashes are resident."""
        ids = self._ids(np.asarray(hashes, dtype=np.uint64)[:limit])
        missing = (ids == _NO_ID).nonzero()[0]
        return ids[: missing[0]] if missing.shape[0] else ids

    def evictable_among(self, ids: Ids) -> int:
        """How many of these resident blocks are evictable (not in use)."""
        return int(np.count_nonzero(self._users[ids] == 0))

    def acquire(self, ids: Ids) -> None:
        """Take a reference on resident blocks (a prefix hit)."""
        self.epoch += 1
        users = self._users[ids]
        self._num_evictable -= int(np.count_nonzero(users == 0))
        self._stamp[ids] = _NOT_EVICTABLE  # the queue entries of evictable ones die
        self._users[ids] = users + 1

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
            self._evict(evict)
        return True

    def register_run(self, hashes: Hashes) -> Ids:
        """Give allocated blocks the hashes of the prefixes they now hold, in order, up to the
        first hash already resident elsewhere (a duplicate computed concurrently: the caller
        keeps that block and the rest unhashed). Returns the ids of those registered."""
        run = np.asarray(hashes, dtype=np.uint64)
        if not run.shape[0] or self._ids(run[:1])[0] != _NO_ID:
            # The usual retry of a request whose chain a duplicate broke: it tries every step
            # until that block is evicted, so check its head before the whole run.
            return run[:0].view(np.int64)
        resident = (self._ids(run) != _NO_ID).nonzero()[0]
        n = int(resident[0]) if resident.shape[0] else run.shape[0]
        if n > self._num_free_ids:
            raise ValueError("more hashed blocks than the pool holds")
        self._num_free_ids -= n
        ids = self._free_ids[self._num_free_ids : self._num_free_ids + n].copy()
        if n:
            self.epoch += 1
            run = run[:n]
            self._key[ids] = run
            self._users[ids] = 1
            self._index(run, ids)
            self._num_hashed += n
        return ids

    def release(self, ids: Ids, unhashed: int) -> None:
        """Drop a request's references (its hashed blocks' ids, in chain order, and a count of
        unhashed blocks); blocks nobody uses become evictable, tail first (vLLM frees a
        request's blocks in reverse so a prefix's tail is evicted first)."""
        self.epoch += 1
        if ids.shape[0]:
            users = self._users[ids] - 1
            self._users[ids] = users
            tail_first = ids[::-1]
            self._enqueue(tail_first[users[::-1] == 0])
        self.free_blocks += unhashed

    def reset(self) -> bool:
        """Drop every evictable cached block (vLLM `/reset_prefix_cache`); False while hashed
        blocks are in use, as vLLM answers then."""
        if self.in_use_hashed():
            return False
        self.epoch += 1
        self.free_blocks += self._num_evictable
        self._num_hashed = self._num_evictable = 0
        self._stamp.fill(_NOT_EVICTABLE)
        self._free_ids = np.arange(self._free_ids.shape[0], dtype=np.int64)
        self._num_free_ids = self._free_ids.shape[0]
        self._slot_id.fill(_NO_ID)
        self._spill_count.fill(0)
        self._spilled.clear()
        self._head = self._tail = 0
        return True
