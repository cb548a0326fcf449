"""The LMCache-like offload tier: full `chunk_size`-token chunks stored after they are computed,
the longest stored prefix loaded on a GPU miss.

Levels follow LMCache's backends: an optional CPU hot cache (`local_cpu`, capacity
`max_local_cpu_size` GB, at host-DRAM/PCIe speed), then the GDS path or local disk at the storage
profile's speed. The GDS backend has no capacity and never evicts; capacity-limited levels evict
least-recently-used chunks. Writes are queued on each level's write channel: a chunk becomes
loadable only once its write has finished. Loads block the engine step that needs them, as the
connector's `start_load_kv` does without async loading.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvops.sim.costs import transfer_time_s
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.profiles import StorageProfile


@dataclass
class _Level:
    name: str
    storage: StorageProfile
    capacity_chunks: int | None
    ready_s: OrderedDict[int, float] = field(default_factory=OrderedDict)  # LRU order
    write_free_s: float = 0.0


@dataclass
class OffloadStats:
    lookup_requests: int = 0
    lookup_tokens: int = 0
    lookup_hit_tokens: int = 0
    retrieve_requests: int = 0
    requested_tokens: int = 0
    hit_tokens: int = 0
    store_requests: int = 0
    stored_tokens: int = 0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    evictions: int = 0


class OffloadTier:
    def __init__(
        self,
        settings: LMCacheSettings,
        storage: StorageProfile,
        host_dram: StorageProfile,
        kv_bytes_per_token: int,
        world_size: int,
        capacity_scale: float = 1.0,
    ) -> None:
        self.settings = settings
        self.capacity_scale = capacity_scale
        self.chunk_size = settings.chunk_size
        self.chunk_bytes = float(kv_bytes_per_token * settings.chunk_size)
        self.files_per_chunk = world_size
        self.io_parallelism = settings.disk_io_threads
        self.stats = OffloadStats()
        self.levels: list[_Level] = []
        if settings.local_cpu and settings.max_local_cpu_size > 0:
            self.levels.append(
                _Level("local_cpu", host_dram, self._chunks(settings.max_local_cpu_size))
            )
        if settings.gds_path:
            cap = None if storage.capacity_gb is None else self._chunks(storage.capacity_gb)
            self.levels.append(_Level("gds", storage, cap))
        elif settings.local_disk and settings.max_local_disk_size > 0:
            self.levels.append(
                _Level("local_disk", storage, self._chunks(settings.max_local_disk_size))
            )
        if not self.levels and settings.max_local_cpu_size > 0:
            # LMCache creates its LocalCPUBackend whenever max_local_cpu_size > 0.
            self.levels.append(
                _Level("local_cpu", host_dram, self._chunks(settings.max_local_cpu_size))
            )

    def _chunks(self, size_gb: float) -> int:
        """Capacity in chunks; scaled like the GPU pool (`kv_capacity_scale`) so a scaled-down
        workload overflows every bounded level as the full-size one would."""
        return int(size_gb * 1e9 * self.capacity_scale // self.chunk_bytes)

    @property
    def persistent_level(self) -> _Level | None:
        """The level whose chunks are files (GDS path), if any."""
        return next((lv for lv in self.levels if lv.name == "gds"), None)

    def stored_chunks(self) -> int:
        return max((len(lv.ready_s) for lv in self.levels), default=0)

    def usage_bytes(self, level_name: str) -> float:
        level = next((lv for lv in self.levels if lv.name == level_name), None)
        return 0.0 if level is None else len(level.ready_s) * self.chunk_bytes

    def _where(self, h: int, now_s: float) -> _Level | None:
        for level in self.levels:
            ready = level.ready_s.get(h)
            if ready is not None and ready <= now_s:
                return level
        return None

    def lookup_tokens(self, chunk_hashes: list[int], num_tokens: int, now_s: float) -> int:
        """Tokens of the longest stored, fully written prefix (LMCache never reports the whole
        prompt: at least its last token is recomputed)."""
        n = 0
        for h in chunk_hashes:
            if self._where(h, now_s) is None:
                break
            n += 1
        hit = min(n * self.chunk_size, num_tokens - 1)
        self.stats.lookup_requests += 1
        self.stats.lookup_tokens += num_tokens
        self.stats.lookup_hit_tokens += max(0, hit)
        return max(0, hit)

    def load_time_s(
        self, chunk_hashes: list[int], start_token: int, end_token: int, now_s: float
    ) -> float:
        """Load tokens [start_token, end_token) from the levels holding their chunks."""
        if end_token <= start_token:
            return 0.0
        first, last = start_token // self.chunk_size, (end_token - 1) // self.chunk_size
        per_level: dict[int, int] = {}
        for h in chunk_hashes[first : last + 1]:
            level = self._where(h, now_s)
            if level is None:  # cannot happen after lookup_tokens; be safe
                continue
            level.ready_s.move_to_end(h)
            idx = self.levels.index(level)
            per_level[idx] = per_level.get(idx, 0) + 1
        tokens = end_token - start_token
        chunks = last - first + 1
        time_s = 0.0
        for idx, count in per_level.items():
            nbytes = self.chunk_bytes * count * tokens / (chunks * self.chunk_size)
            ios = count * self.files_per_chunk
            time_s += transfer_time_s(
                self.levels[idx].storage, nbytes, ios, self.io_parallelism, True
            )
            self.stats.read_bytes += nbytes
        self.stats.retrieve_requests += 1
        self.stats.requested_tokens += tokens
        self.stats.hit_tokens += tokens
        return time_s

    def is_stored(self, h: int) -> bool:
        return any(h in lv.ready_s for lv in self.levels)

    def store(
        self, chunk_hashes: list[int], step_end_s: float, blocking: bool
    ) -> tuple[float, list[int]]:
        """Queue writes of the chunks not stored yet at the end of a step. Returns the time the
        step itself must wait (the write time when blocking, else 0) and the new chunks."""
        new = [h for h in chunk_hashes if not self.is_stored(h)]
        if not new:
            return 0.0, new
        nbytes = self.chunk_bytes * len(new)
        waited = 0.0
        for level in self.levels:
            ios = len(new) * self.files_per_chunk
            write_s = transfer_time_s(level.storage, nbytes, ios, self.io_parallelism, False)
            start = step_end_s + waited if blocking else max(level.write_free_s, step_end_s)
            done = start + write_s
            level.write_free_s = done
            if blocking:
                waited += write_s
            for h in new:
                level.ready_s[h] = done
            self._evict(level)
        self.stats.store_requests += 1
        self.stats.stored_tokens += len(new) * self.chunk_size
        self.stats.write_bytes += nbytes
        return waited, new

    def _evict(self, level: _Level) -> None:
        if level.capacity_chunks is None:
            return
        while len(level.ready_s) > level.capacity_chunks:
            level.ready_s.popitem(last=False)
            self.stats.evictions += 1

    def preload(self, chunk_hashes: list[int]) -> None:
        """Chunks found on the persistent level at startup count as stored (LMCache's scan)."""
        level = self.persistent_level
        if level is None:
            return
        for h in chunk_hashes:
            level.ready_s[h] = 0.0
        self._evict(level)
