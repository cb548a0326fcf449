"""The engine proper: vLLM V1-style scheduling over the GPU KV cache and the offload tier, one
step at a time in virtual seconds. `kvops.sim.model` builds it from profiles; see its docstring
for the API and for what is and is not modelled."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvops.errors import KvopsError
from kvops.sim.costs import CostModel
from kvops.sim.hashing import PromptHasher, as_token_array
from kvops.sim.kvcache import GpuKvCache, Ids
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.offload import OffloadTier
from kvops.sim.records import EngineStats, FailedLoad, Request, SimRequestRecord, StepResult

_NO_BLOCKS: Ids = np.zeros(0, dtype=np.int64)


class EngineError(KvopsError, ValueError):
    """A configuration the real engine would refuse (e.g. weights larger than the GPU)."""


@dataclass
class EngineSettings:
    """vLLM serve settings (same names and defaults as `vllm serve` on a high-end GPU) plus
    the kvops-only `kv_capacity_scale` and the LMCache settings."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # default: the model's max_position
    num_gpu_blocks_override: int | None = None
    # vLLM's `--kv-cache-memory-bytes` (per GPU): the KV cache gets exactly this much and
    # `gpu_memory_utilization` no longer sizes it (vllm/config/cache.py, CacheConfig
    # `kv_cache_memory_bytes`); how the vllm_lmcache role gives every variant the same KV memory.
    kv_cache_memory_bytes: int | None = None
    kv_capacity_scale: float = 1.0
    enable_prefix_caching: bool = True
    offload: bool = False
    lmcache: LMCacheSettings = field(default_factory=LMCacheSettings)
    # LMCache's GDS backend writes chunk files from its own event-loop thread, so a step waits
    # only for the on-GPU copy into the staging buffer; True makes the step wait for the write.
    store_blocking: bool = False

    @property
    def gds_buffer_reserved_mib(self) -> int:
        """GPU memory (MiB) LMCache's GDS staging buffer takes out of the KV cache: the buffer
        (`gds_buffer_size`, MiB of VRAM) lives inside the same `gpu_memory_utilization` share
        as the KV blocks, so the pool shrinks by it; 0 without a GDS tier, and 0 when
        `kv_cache_memory_bytes` fixes the KV cache's size (the buffer then lives beside it).
        Set the buffer size to 0 to model a deployment that gave it memory outside that share."""
        if not self.offload or not self.lmcache.gds_path or self.kv_cache_memory_bytes:
            return 0
        return self.lmcache.staging_buffer_mib


class _Seq:
    """Scheduler state of one request."""

    __slots__ = (
        "anon_blocks", "block_hashes", "chunk_hashes", "chunks_saved", "generated", "held_ids",
        "lookup", "lookup_key", "num_computed", "num_full_blocks", "num_full_chunks", "num_held",
        "output_tokens", "prompt_len", "record", "scheduled_once",
    )  # fmt: skip

    def __init__(self, req: Request, hasher: PromptHasher) -> None:
        tokens = as_token_array(req.prompt_tokens)
        self.prompt_len = int(tokens.shape[0])
        self.output_tokens = req.output_tokens
        self.block_hashes, self.chunk_hashes = hasher(tokens)
        self.num_full_blocks = int(self.block_hashes.shape[0])
        self.num_full_chunks = len(self.chunk_hashes)
        self.record = SimRequestRecord(
            req.request_id, req.arrival_s, self.prompt_len, req.output_tokens
        )
        self.num_computed = 0
        self.generated = 0
        # The hashed blocks a request holds are always the first `num_held` of its prompt's;
        # their cache ids, in the same order.
        self.num_held = 0
        self.held_ids: Ids = np.empty(self.num_full_blocks, dtype=np.int64)
        self.anon_blocks = 0
        self.chunks_saved = 0
        self.scheduled_once = False
        self.lookup_key: tuple[int, int, int] = (-1, -1, -1)
        self.lookup: tuple[Ids, int, int] = (_NO_BLOCKS, 0, 0)

    def total_len(self) -> int:
        return self.prompt_len + self.generated


class Engine:
    def __init__(
        self,
        costs: CostModel,
        settings: EngineSettings,
        num_gpu_blocks: int,
        offload: OffloadTier | None,
        max_model_len: int,
    ) -> None:
        self.costs = costs
        self.settings = settings
        self.block_size = settings.block_size
        self.cache = GpuKvCache(num_gpu_blocks, settings.block_size)
        self.offload = offload
        self.max_model_len = max_model_len
        self.now_s = 0.0
        self.stats = EngineStats()
        self._pending: list[tuple[float, int, _Seq]] = []
        self._counter = 0
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._by_id: dict[str, _Seq] = {}
        chunk = offload.chunk_size if offload else settings.lmcache.chunk_size
        self._hasher = PromptHasher(settings.block_size, chunk)
        # loads that found unreadable chunks since the caller last took them (`take_failed`)
        self.failed_loads: list[FailedLoad] = []

    # ----- requests in -------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; it is admitted once virtual time reaches its arrival. Raises
        ValueError when it can never fit (longer than max_model_len or the whole KV pool)."""
        n = len(req.prompt_tokens)
        if n == 0:
            raise ValueError("prompt must contain at least one token")
        if n + req.output_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {n + req.output_tokens} tokens ({n} in the messages, "
                f"{req.output_tokens} in the completion)."
            )
        if math.ceil((n + req.output_tokens) / self.block_size) > self.cache.num_blocks:
            raise ValueError(
                f"request needs {n + req.output_tokens} tokens of KV cache but the GPU pool holds "
                f"only {self.cache.num_blocks * self.block_size}"
            )
        seq = _Seq(req, self._hasher)
        self._counter += 1
        heapq.heappush(self._pending, (req.arrival_s, self._counter, seq))
        self._by_id[req.request_id] = seq

    def abort(self, request_id: str) -> SimRequestRecord | None:
        """Drop a request (client went away); its blocks are freed as on finish."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq in self._running:
            self._running.remove(seq)
            self._free(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)
        else:
            self._pending = [p for p in self._pending if p[2] is not seq]
            heapq.heapify(self._pending)
        seq.record.aborted = True
        return seq.record

    def has_work(self) -> bool:
        return bool(self._pending or self._waiting or self._running)

    def next_step_start_s(self) -> float:
        """Virtual time at which the next `step` would start (it jumps to the first arrival
        when nothing is runnable), so a real-time driver knows which arrivals belong in it."""
        if not self._running and not self._waiting and self._pending:
            return max(self.now_s, self._pending[0][0])
        return self.now_s

    def num_running(self) -> int:
        return len(self._running)

    def num_waiting(self) -> int:
        return len(self._waiting) + sum(1 for p in self._pending if p[0] <= self.now_s)

    def reset_prefix_cache(self) -> bool:
        return self.cache.reset()

    def take_failed(self) -> list[FailedLoad]:
        """The failed loads since the last call (a server logs them as vLLM and LMCache do)."""
        out, self.failed_loads = self.failed_loads, []
        return out

    # ----- the step ----------------------------------------------------------------------
    def _free(self, seq: _Seq) -> None:
        self.cache.release(seq.held_ids[: seq.num_held], seq.anon_blocks)
        seq.num_held, seq.anon_blocks, seq.num_computed = 0, 0, 0

    def _preempt(self, seq: _Seq) -> None:
        self._free(seq)
        seq.record.num_preemptions += 1
        self.stats.num_preemptions += 1
        self._waiting.appendleft(seq)

    def _admit(self, seq: _Seq, budget: int) -> tuple[int, float] | None:
        """Prefix-cache lookup, LMCache lookup, block allocation for a waiting request.
        Returns (new tokens to compute this step, blocking load time) or None if it does not
        fit now."""
        bs = self.block_size
        total = seq.total_len()
        limit = (total - 1) // bs  # vLLM always recomputes at least the last token
        caching = self.settings.enable_prefix_caching
        offload = self.offload
        # A request that did not fit is retried every step; its lookups are reused until the
        # GPU cache or the offload tier changed (their epochs), which is most steps' case.
        key = (self.cache.epoch, offload.advance(self.now_s) if offload else -1, total)
        if seq.lookup_key != key:
            hit_ids = self.cache.lookup(seq.block_hashes, limit) if caching else _NO_BLOCKS
            evictable = self.cache.evictable_among(hit_ids)
            stored = offload.lookup_tokens(seq.chunk_hashes, seq.prompt_len) if offload else 0
            seq.lookup_key, seq.lookup = key, (hit_ids, evictable, stored)
        hit_ids, evictable, stored = seq.lookup
        gpu_blocks = hit_ids.shape[0]
        if offload is not None:
            offload.record_lookup(seq.prompt_len, stored)
        gpu_hit = gpu_blocks * bs
        ext = max(0, min(stored, total - 1) - gpu_hit) if offload else 0
        new = min(total - gpu_hit - ext, budget)
        if new <= 0:
            return None
        need = -(-(gpu_hit + ext + new) // bs) - gpu_blocks
        if self.cache.available() - evictable < need:
            return None
        self.cache.acquire(hit_ids)  # the ids are current: the cache is as when looked up
        self.cache.allocate(need)
        seq.num_held = gpu_blocks
        seq.held_ids[:gpu_blocks] = hit_ids
        seq.anon_blocks = need
        seq.num_computed = gpu_hit + ext
        load_s = 0.0
        loaded = ext
        if ext:
            assert self.offload is not None
            load_s = self.offload.load_time_s(seq.chunk_hashes, gpu_hit, gpu_hit + ext)
            load_s += self.costs.device_copy_s(ext)
            loaded, why = self.offload.unreadable(seq.chunk_hashes, gpu_hit, gpu_hit + ext)
            if why:
                # vLLM (scheduler `_handle_invalid_blocks`, policy recompute) rewinds the request
                # to its last valid token and recomputes the rest into the blocks it holds; the
                # read already cost its time. vLLM counted the hit when it scheduled the load.
                seq.num_computed = gpu_hit + loaded
                self.failed_loads.append(FailedLoad(seq.record.request_id, ext - loaded, why))
            if caching:
                self._register_full_blocks(seq)
        st = self.stats
        st.prefix_cache_queries += total
        st.prefix_cache_hits += gpu_hit
        if self.offload is not None:
            st.external_prefix_cache_queries += total
            st.external_prefix_cache_hits += ext
        if not seq.scheduled_once:
            seq.scheduled_once = True
            seq.record.gpu_hit_tokens = gpu_hit
            seq.record.offload_hit_tokens = loaded
            seq.record.computed_prompt_tokens = seq.prompt_len - gpu_hit - loaded
            st.prompt_tokens += seq.prompt_len
        return new, load_s

    def _register_full_blocks(self, seq: _Seq) -> None:
        """Blocks now full of prompt KV get their prefix hash (shareable from now on). After a
        duplicate broke the chain, later blocks stay unhashed until the earlier one is free."""
        start = seq.num_held
        upto = min(
            min(seq.num_computed, seq.prompt_len) // self.block_size, start + seq.anon_blocks
        )
        if upto <= start:
            return
        run = seq.block_hashes[start:upto]
        ids = self.cache.register_run(run)
        n = ids.shape[0]
        if n:
            seq.held_ids[start : start + n] = ids
            seq.num_held += n
            seq.anon_blocks -= n

    def _next_arrivals(self) -> None:
        while self._pending and self._pending[0][0] <= self.now_s:
            self._waiting.append(heapq.heappop(self._pending)[2])

    def step(self) -> StepResult | None:
        """Run one engine step; None when there is nothing left to do."""
        self._next_arrivals()
        if not self._running and not self._waiting:
            if not self._pending:
                return None
            self.now_s = max(self.now_s, self._pending[0][0])
            self._next_arrivals()
        s = self.settings
        budget = s.max_num_batched_tokens
        scheduled: list[tuple[_Seq, int]] = []
        preempted = False
        load_s = 0.0
        running = self._running
        cache = self.cache
        bs = self.block_size
        # The step's cost inputs, summed as requests are scheduled (in schedule order, so the
        # float sum is the same on every run): context tokens read, new tokens, and the
        # attention term of prefill FLOPs, sum of n x (context + n/2).
        context = 0
        new_tokens = 0
        attention = 0.0
        # This loop runs once per running request per step (most of a long run's iterations):
        # attributes are read once into locals, and the block arithmetic is inline.
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = seq.prompt_len + seq.generated - c
            if n > budget:
                n = budget
            need = -(-(c + n) // bs) - seq.num_held - seq.anon_blocks
            if need > 0:  # decodes need a new block only every block_size tokens
                while need > cache.available():
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if i >= len(running) or running[i] is not seq:
                    break
                cache.allocate(need)
                seq.anon_blocks += need
            scheduled.append((seq, n))
            context += c
            new_tokens += n
            attention += n * (c + n / 2.0)
            budget -= n
            i += 1
        if not preempted:
            waiting = self._waiting
            while waiting and budget > 0 and len(running) < s.max_num_seqs:
                admitted = self._admit(waiting[0], budget)
                if admitted is None:
                    break
                seq = waiting.popleft()
                n, seq_load_s = admitted
                load_s += seq_load_s
                running.append(seq)
                scheduled.append((seq, n))
                c = seq.num_computed
                context += c
                new_tokens += n
                attention += n * (c + n / 2.0)
                budget -= n
        if not scheduled:
            if not preempted and not self._pending:
                raise EngineError("scheduler stalled: no request fits the KV cache")
            if not preempted:
                self.now_s = max(self.now_s, self._pending[0][0])
            return StepResult(self.now_s, self.now_s, [], [], [])
        return self._execute(scheduled, load_s, context, new_tokens, attention)

    def _execute(
        self,
        scheduled: list[tuple[_Seq, int]],
        load_s: float,
        context: int,
        new_tokens: int,
        attention: float,
    ) -> StepResult:
        costs = self.costs
        flops = costs.prefill_flops_total(new_tokens, attention)
        start_s = self.now_s
        compute_s = costs.step_time_s(flops, context, new_tokens)
        end_s = start_s + load_s + compute_s
        to_store: list[int] = []
        emitting: list[_Seq] = []  # requests whose prompt is done: each gets a token
        offload = self.offload
        chunk_size = offload.chunk_size if offload is not None else 0
        caching = self.settings.enable_prefix_caching
        for seq, n in scheduled:
            computed = seq.num_computed + n
            seq.num_computed = computed
            prompt_len = seq.prompt_len
            if computed >= prompt_len + seq.generated:
                emitting.append(seq)
            if caching and seq.num_held < seq.num_full_blocks:
                self._register_full_blocks(seq)
            if offload is not None and seq.chunks_saved < seq.num_full_chunks:
                full = (computed if computed < prompt_len else prompt_len) // chunk_size
                if full > seq.chunks_saved:
                    to_store.extend(seq.chunk_hashes[seq.chunks_saved : full])
                    seq.chunks_saved = full
        stored: list[int] = []
        if offload is not None and to_store:
            # LMCache asks its storage which chunks it already holds and copies only the others
            # out of the paged KV cache (LMCacheEngine.store: `contains` before allocate/copy,
            # https://github.com/LMCache/LMCache lmcache/v1/cache_engine.py): a shared prefix
            # is copied once, not once per request.
            fresh = list(dict.fromkeys(h for h in to_store if not offload.is_stored(h)))
            if fresh:
                copy_s = costs.device_copy_s(len(fresh) * chunk_size)
                self.stats.offload_copied_tokens += len(fresh) * chunk_size
                wait_s, stored = offload.store(fresh, end_s + copy_s, self.settings.store_blocking)
                end_s += copy_s + wait_s
        token_ids: list[str] = []
        finished: list[SimRequestRecord] = []
        for seq in emitting:
            rec = seq.record
            seq.generated += 1
            if rec.first_token_s is None:
                rec.first_token_s = end_s
            rec.token_times_s.append(end_s)
            token_ids.append(rec.request_id)
            if seq.generated >= seq.output_tokens:
                rec.finish_s = end_s
                finished.append(rec)
        st = self.stats
        st.generation_tokens += len(token_ids)
        st.num_steps += 1
        st.busy_s += end_s - start_s
        for rec in finished:
            seq = self._by_id.pop(rec.request_id)
            self._running.remove(seq)
            self._free(seq)
            st.request_success += 1
        self.now_s = end_s
        return StepResult(start_s, end_s, token_ids, finished, stored)

    def run(self, requests: Iterable[Request]) -> list[SimRequestRecord]:
        """Simulate requests to completion; records in the order the requests were given."""
        seqs = []
        for req in requests:
            self.add_request(req)
            seqs.append(self._by_id[req.request_id])
        while self.step() is not None:
            pass
        return [seq.record for seq in seqs]
