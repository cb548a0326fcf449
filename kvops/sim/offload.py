"""The LMCache-like offload tier: full `chunk_size`-token chunks stored after they are computed,
the longest stored prefix loaded on a GPU miss.

Levels follow LMCache's backends: an optional CPU hot cache (`local_cpu`, capacity
`max_local_cpu_size` GB, at host-DRAM/PCIe speed), then the GDS path or local disk at the storage
profile's speed. The GDS backend has no capacity and never evicts; capacity-limited levels evict
least-recently-used chunks. Writes are queued on each level's write channel: a chunk becomes
loadable only once its write has finished (writes land in time order through a heap, and a
landed chunk joins a dict, so a lookup is one C-level pass). Loads block the engine step that
needs them, as the connector's `start_load_kv` does without async loading.

A tier given a `SharedExport` (one per fleet, see `export.py`) is one instance's view of a GDS
path several instances share: its index is the export's (a chunk another instance stored is a hit
once its file has landed), and its transfers also book the export's node bandwidth. Without one,
nothing here changes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice, takewhile

from kvops.sim.costs import transfer_time_s
from kvops.sim.export import ExportError, SharedExport
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.profiles import StorageProfile


@dataclass
class _Level:
    name: str
    storage: StorageProfile
    capacity_chunks: int | None
    landed: dict[int, None] = field(default_factory=dict)  # readable chunks, LRU first
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
        export: SharedExport | None = None,
        instance: int = 0,
    ) -> None:
        self.settings = settings
        self.capacity_scale = capacity_scale
        self.chunk_size = settings.chunk_size
        self.chunk_bytes = float(kv_bytes_per_token * settings.chunk_size)
        self.files_per_chunk = world_size
        self.io_parallelism = settings.disk_io_threads
        self.stats = OffloadStats()
        self.levels: list[_Level] = []
        cpu_cap = self._chunks(settings.max_local_cpu_size)
        if settings.local_cpu and settings.max_local_cpu_size > 0:
            self.levels.append(_Level("local_cpu", host_dram, cpu_cap))
        if settings.gds_path:
            cap = None if storage.capacity_gb is None else self._chunks(storage.capacity_gb)
            self.levels.append(_Level("gds", storage, cap))
        elif settings.local_disk and settings.max_local_disk_size > 0:
            disk_cap = self._chunks(settings.max_local_disk_size)
            self.levels.append(_Level("local_disk", storage, disk_cap))
        if not self.levels and settings.max_local_cpu_size > 0:
            # LMCache creates its LocalCPUBackend whenever max_local_cpu_size > 0.
            self.levels.append(_Level("local_cpu", host_dram, cpu_cap))
        self._readable: dict[int, int] = {}  # chunk -> number of levels it has landed in
        self._known: dict[int, int] = {}  # chunk -> levels holding it or writing it
        self._in_flight: list[tuple[float, int, int, list[int]]] = []  # (ready, seq, level, hashes)
        self._seq = 0
        self.epoch = 0
        self.export = export
        self.instance = instance
        self._now_s = 0.0
        self._read_free_s = 0.0  # when this host's link finishes its last read (export mode)
        # Whether a chunk's files are on the persistent level now, asked on a miss (the
        # server's GdsChunkWriter.has_chunk): another process sharing the GDS path may have
        # stored it since start-up. None in the pure model, whose fleet shares one index.
        self.file_probe: Callable[[int], bool] | None = None
        # Checks that the stored copies of chunks about to be loaded can be read, returning the
        # unreadable ones and why: set by a server that keeps LMCache's chunk files
        # (`kvops.sim.gds_files`); None in the pure model, whose chunks are never lost.
        self.reader: Callable[[list[int]], dict[int, str]] | None = None
        if export is not None:
            self._join(export)

    def _join(self, export: SharedExport) -> None:
        """Share the export's index: readable chunks, landed files, writes in flight."""
        if [lv.name for lv in self.levels] != ["gds"]:
            raise ExportError(
                "a fleet's offload tier is the shared GDS path alone (a CPU or local-disk tier "
                "in front of it is not modelled for several instances)"
            )
        self.levels[0].landed = export.landed
        self._readable = export.readable
        self._in_flight = export.in_flight

    def _chunks(self, size_gb: float) -> int:
        """Capacity in chunks; scaled like the GPU pool (`kv_capacity_scale`) so a scaled-down
        workload overflows every bounded level as the full-size one would."""
        return int(size_gb * 1e9 * self.capacity_scale // self.chunk_bytes)

    @property
    def persistent_level(self) -> _Level | None:
        """The level whose chunks are files (GDS path), if any."""
        return next((lv for lv in self.levels if lv.name == "gds"), None)

    def stored_chunks(self) -> int:
        return len(self._readable)

    def usage_bytes(self, level_name: str) -> float:
        level = next((lv for lv in self.levels if lv.name == level_name), None)
        return 0.0 if level is None else len(level.landed) * self.chunk_bytes

    def _land(self, now_s: float) -> None:
        """Writes finished by `now_s` become readable (and may evict on bounded levels)."""
        heap = self._in_flight
        while heap and heap[0][0] <= now_s:
            _, _, idx, hashes = heapq.heappop(heap)
            self.epoch += 1
            level = self.levels[idx]
            readable = self._readable
            for h in hashes:
                if h not in level.landed:
                    readable[h] = readable.get(h, 0) + 1
                level.landed[h] = None
            self._evict(level)

    def _evict(self, level: _Level) -> None:
        if level.capacity_chunks is None:
            return
        excess = len(level.landed) - level.capacity_chunks
        if excess <= 0:
            return
        readable, known = self._readable, self._known
        self.epoch += 1
        for h in list(islice(level.landed, excess)):
            del level.landed[h]
            self.stats.evictions += 1
            readable[h] -= 1
            if not readable[h]:
                del readable[h]
            known[h] -= 1
            if not known[h]:
                del known[h]

    def advance(self, now_s: float) -> int:
        """Land the writes finished by `now_s`; returns the epoch (changes whenever the set of
        readable chunks does)."""
        export = self.export
        if export is not None:
            self._now_s = now_s
            if export.in_flight and export.in_flight[0][0] <= now_s:
                export.land(now_s)
            return export.epoch
        if self._in_flight and self._in_flight[0][0] <= now_s:
            self._land(now_s)
        return self.epoch

    def lookup_tokens(self, chunk_hashes: list[int], num_tokens: int) -> int:
        """Tokens of the longest readable prefix as of the last `advance` (LMCache never
        reports the whole prompt: at least its last token is recomputed)."""
        n = len(list(takewhile(self._readable.__contains__, chunk_hashes)))
        probe = self.file_probe
        if probe is not None and n < len(chunk_hashes):
            # LMCache's GDS backend does the same: `contains()` misses in its index, then
            # looks for the chunk's metadata file on disk (GdsBackend._try_to_read_metadata,
            # https://github.com/LMCache/LMCache/blob/dev/lmcache/v1/storage_backend/gds_backend.py).
            # A chunk this tier is still writing itself is not probed: it lands when modelled.
            known = self._known
            found = list(takewhile(lambda h: h not in known and probe(h), chunk_hashes[n:]))
            if found:
                self.preload(found)
                n += len(found)
        return max(0, min(n * self.chunk_size, num_tokens - 1))

    def record_lookup(self, num_tokens: int, hit_tokens: int) -> None:
        """Count one lookup as LMCache's counters do (every scheduler attempt counts)."""
        self.stats.lookup_requests += 1
        self.stats.lookup_tokens += num_tokens
        self.stats.lookup_hit_tokens += hit_tokens

    def load_time_s(self, chunk_hashes: list[int], start_token: int, end_token: int) -> float:
        """Load tokens [start_token, end_token) from the fastest level holding each chunk
        (levels are ordered fastest first); call after `lookup_tokens` at the same time."""
        if end_token <= start_token:
            return 0.0
        if self.export is not None:
            return self._export_load_time_s(self.export, chunk_hashes, start_token, end_token)
        first, last = start_token // self.chunk_size, (end_token - 1) // self.chunk_size
        wanted = chunk_hashes[first : last + 1]
        per_level = [0] * len(self.levels)
        if len(self.levels) == 1:
            per_level[0] = len(wanted)
        else:
            for h in wanted:
                idx = next(i for i, lv in enumerate(self.levels) if h in lv.landed)
                per_level[idx] += 1
        for level in self.levels:
            if level.capacity_chunks is not None:  # refresh LRU position (order only)
                for h in wanted:
                    if level.landed.pop(h, 0) is None:
                        level.landed[h] = None
        tokens = end_token - start_token
        time_s = 0.0
        for idx, count in enumerate(per_level):
            if not count:
                continue
            nbytes = self.chunk_bytes * count * tokens / (len(wanted) * self.chunk_size)
            ios = count * self.files_per_chunk
            storage = self.levels[idx].storage
            time_s += transfer_time_s(storage, nbytes, ios, self.io_parallelism, True)
            self.stats.read_bytes += nbytes
        self.stats.retrieve_requests += 1
        self.stats.requested_tokens += tokens
        self.stats.hit_tokens += tokens
        return time_s

    def unreadable(
        self, chunk_hashes: list[int], start_token: int, end_token: int
    ) -> tuple[int, dict[int, str]]:
        """Of a load of tokens [start_token, end_token): how many tokens, from the start, come
        from readable chunks, and the unreadable chunks with why. Those are dropped from the
        index, as LMCache's GDS backend drops an entry whose read failed (0.5.6
        `gds_backend.py` `_load_gds` returns -1, "The caller will handle the error by removing
        the cache entry"), so a later lookup misses them and the recomputed KV is stored again."""
        if self.reader is None or end_token <= start_token or self.export is not None:
            return end_token - start_token, {}
        first, last = start_token // self.chunk_size, (end_token - 1) // self.chunk_size
        wanted = chunk_hashes[first : last + 1]
        bad = self.reader(wanted)
        if not bad:
            return end_token - start_token, {}
        first_bad = next(i for i, h in enumerate(wanted) if h in bad)
        loaded = max(0, (first + first_bad) * self.chunk_size - start_token)
        for h in bad:
            for level in self.levels:
                level.landed.pop(h, None)
            self._readable.pop(h, None)
            self._known.pop(h, None)
        self.epoch += 1
        self.stats.hit_tokens -= end_token - start_token - loaded  # LMCache counts retrieved
        return loaded, bad

    def is_stored(self, h: int) -> bool:
        """Stored or being written on some level (LMCache skips a put it already has). On a
        shared export: written by this instance, or landed from any (another instance's write
        in flight is not yet a file this one can see)."""
        if self.export is not None:
            return h in self._known or h in self._readable
        return h in self._known

    def store(
        self, chunk_hashes: list[int], step_end_s: float, blocking: bool
    ) -> tuple[float, list[int]]:
        """Queue writes of the chunks not stored yet at the end of a step. Returns the time the
        step itself must wait (the write time when blocking, else 0) and the new chunks."""
        if self.export is not None:
            return self._export_store(self.export, chunk_hashes, step_end_s, blocking)
        known = self._known
        new = [h for h in chunk_hashes if h not in known]
        if not new:
            return 0.0, new
        new = list(dict.fromkeys(new))
        nbytes = self.chunk_bytes * len(new)
        waited = 0.0
        for idx, level in enumerate(self.levels):
            ios = len(new) * self.files_per_chunk
            write_s = transfer_time_s(level.storage, nbytes, ios, self.io_parallelism, False)
            start = step_end_s + waited if blocking else max(level.write_free_s, step_end_s)
            done = start + write_s
            level.write_free_s = done
            if blocking:
                waited += write_s
            self._seq += 1
            heapq.heappush(self._in_flight, (done, self._seq, idx, new))
        for h in new:
            known[h] = len(self.levels)
        self.stats.store_requests += 1
        self.stats.stored_tokens += len(new) * self.chunk_size
        self.stats.write_bytes += nbytes
        return waited, new

    def preload(self, chunk_hashes: list[int]) -> None:
        """Chunks found on the persistent level at startup count as stored (LMCache's scan)."""
        level = self.persistent_level
        if level is None:
            return
        if self.export is not None:
            for h in chunk_hashes:
                self._known[h] = 1
            heapq.heappush(self._in_flight, (float("-inf"), -1, -1, list(chunk_hashes)))
            self.export.land(float("-inf"))
            return
        idx = self.levels.index(level)
        fresh = [h for h in chunk_hashes if h not in self._known]
        for h in fresh:
            self._known[h] = self._known.get(h, 0) + 1
        heapq.heappush(self._in_flight, (float("-inf"), -1, idx, fresh))
        self._land(float("-inf"))

    # ----- one instance of a fleet sharing an export (see export.py) -----------------------
    def _export_load_time_s(
        self, export: SharedExport, chunk_hashes: list[int], start_token: int, end_token: int
    ) -> float:
        """A load on a shared export: this host's link time, as for one engine, plus whatever the
        export's nodes add; the load starts when the host's previous read has ended."""
        first, last = start_token // self.chunk_size, (end_token - 1) // self.chunk_size
        wanted = chunk_hashes[first : last + 1]
        tokens = end_token - start_token
        count = len(wanted)  # the same float expression as one engine's `load_time_s`
        nbytes = self.chunk_bytes * count * tokens / (count * self.chunk_size)
        level = self.levels[0]
        ios = len(wanted) * self.files_per_chunk
        link_s = transfer_time_s(level.storage, nbytes, ios, self.io_parallelism, True)
        start_s = max(self._now_s, self._read_free_s)
        wait_s = export.transfer(export.read_nodes, wanted, nbytes, start_s, link_s)
        self._read_free_s = start_s + link_s + wait_s
        io = export.io[self.instance]
        io.read_bytes += nbytes
        io.loaded_chunks += len(wanted)
        me = self.instance
        writer = export.writer
        io.cross_instance_chunks += sum(1 for h in wanted if writer.get(h, me) != me)
        io.export_wait_s += wait_s
        self.stats.read_bytes += nbytes
        self.stats.retrieve_requests += 1
        self.stats.requested_tokens += tokens
        self.stats.hit_tokens += tokens
        return link_s + wait_s

    def _export_store(
        self, export: SharedExport, chunk_hashes: list[int], step_end_s: float, blocking: bool
    ) -> tuple[float, list[int]]:
        """Writes on a shared export: queued on this host's link as for one engine, and booked
        on the nodes holding the files; a chunk already landed from any instance is skipped."""
        new = list(dict.fromkeys(h for h in chunk_hashes if not self.is_stored(h)))
        if not new:
            return 0.0, new
        level = self.levels[0]
        nbytes = self.chunk_bytes * len(new)
        ios = len(new) * self.files_per_chunk
        write_s = transfer_time_s(level.storage, nbytes, ios, self.io_parallelism, False)
        start = step_end_s if blocking else max(level.write_free_s, step_end_s)
        write_s += export.transfer(export.write_nodes, new, nbytes, start, write_s)
        done = start + write_s
        level.write_free_s = done
        export.seq += 1
        heapq.heappush(export.in_flight, (done, export.seq, self.instance, new))
        for h in new:
            self._known[h] = 1
        export.io[self.instance].write_bytes += nbytes
        self.stats.store_requests += 1
        self.stats.stored_tokens += len(new) * self.chunk_size
        self.stats.write_bytes += nbytes
        return (write_s if blocking else 0.0), new
