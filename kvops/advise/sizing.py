"""Closed-form sizing: does a set of shared prefixes fit the GPU, and is loading one from
storage faster than recomputing it?

Every figure comes from the profiles through the simulator's own cost model (`kvops.sim.costs`),
so `sizing` and the simulated arms cannot disagree on physics:
- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element
  (the per-token KV footprint of grouped-query attention: Ainslie et al., "GQA", arXiv:2305.13245;
  vLLM's `get_kv_cache_spec` sizes its pages the same way);
- GPU KV capacity = memory x `--gpu-memory-utilization` - weights - activation peak - runtime
  overhead, per tensor-parallel rank, divided by the rank's share of KV per token, rounded down to
  whole 16-token blocks (vLLM `determine_available_memory`, docs.vllm.ai "Engine arguments");
- prefill time of a prefix = (2 x params x n + 4 x layers x hidden x n x n/2) FLOPs at
  dense bf16 peak x MFU (Kaplan et al., arXiv:2001.08361 section 2.1, forward pass ~2N FLOPs/token
  plus the attention term);
- load time = stored bytes / read bandwidth + one I/O latency per round of `disk_io_threads`
  chunk files (LMCache GdsBackend, one file per chunk per rank);
- break-even read bandwidth = prefix bytes / prefill time: below it recomputing wins.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvops.errors import KvopsError
from kvops.sim.costs import CostModel, transfer_time_s
from kvops.sim.engine import EngineSettings
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile


@dataclass(frozen=True)
class SizingInputs:
    prefix_tokens: int
    num_prefixes: int
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    chunk_size: int = 256
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    disk_io_threads: int = 4


@dataclass(frozen=True)
class Sizing:
    """The answer, in the JSON names `kvops advise sizing --json` prints."""

    model: str
    gpu: str
    storage: str
    prefix_tokens: int
    num_prefixes: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    kv_bytes_per_token: int
    gpu_kv_capacity_tokens: int
    prefixes_fit_in_gpu: int
    storage_bytes_needed: int
    prefill_seconds_per_prefix: float
    load_seconds_per_prefix: float
    break_even_read_gb_s: float
    storage_read_gb_s: float

    @property
    def load_speedup(self) -> float:
        """How many times faster loading a prefix is than recomputing it (>1: loading wins)."""
        if self.load_seconds_per_prefix <= 0:
            return math.inf
        return self.prefill_seconds_per_prefix / self.load_seconds_per_prefix

    @property
    def overflows_gpu(self) -> bool:
        return self.prefixes_fit_in_gpu < self.num_prefixes

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "load_speedup": self.load_speedup,
            "overflows_gpu": self.overflows_gpu,
        }


class SizingError(KvopsError, ValueError):
    """Inputs the arithmetic cannot answer (e.g. a model whose weights do not fit the GPU)."""


def cost_model(model: ModelProfile, gpu: GpuProfile, tensor_parallel_size: int) -> CostModel:
    return CostModel(gpu, model, tensor_parallel_size)


def gpu_kv_capacity_tokens(costs: CostModel, inputs: SizingInputs) -> int:
    """Tokens of KV the GPU pool holds, in whole blocks, as the simulated engine allocates it."""
    tokens = costs.kv_capacity_tokens(
        inputs.gpu_memory_utilization, inputs.max_num_batched_tokens, inputs.max_num_seqs
    )
    return tokens // inputs.block_size * inputs.block_size


def stored_tokens(prefix_tokens: int, chunk_size: int) -> int:
    """Only full chunks are stored (`save_unfull_chunk` is False since LMCache 0.4.3)."""
    return prefix_tokens // chunk_size * chunk_size


def load_seconds(
    costs: CostModel, storage: StorageProfile, tokens: int, inputs: SizingInputs
) -> float:
    """Reading `tokens` of stored KV: bytes at the read bandwidth plus per-I/O latency."""
    chunks = tokens // inputs.chunk_size
    nbytes = tokens * costs.kv_bytes_per_token
    ios = chunks * inputs.tensor_parallel_size
    return transfer_time_s(storage, nbytes, ios, inputs.disk_io_threads, read=True)


def compute_sizing(
    model: ModelProfile, gpu: GpuProfile, storage: StorageProfile, inputs: SizingInputs
) -> Sizing:
    if inputs.prefix_tokens < 1 or inputs.num_prefixes < 1:
        raise SizingError("--prefix-tokens and --num-prefixes must be at least 1")
    if inputs.tensor_parallel_size < 1:
        raise SizingError("--tp must be at least 1")
    if not 0 < inputs.gpu_memory_utilization <= 1:
        raise SizingError("--gpu-memory-utilization must be in (0, 1]")
    costs = cost_model(model, gpu, inputs.tensor_parallel_size)
    capacity = gpu_kv_capacity_tokens(costs, inputs)
    if capacity <= 0:
        raise SizingError(
            f"no memory left for the KV cache: {model.name} needs "
            f"{costs.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU on {gpu.name} "
            f"(--tp {inputs.tensor_parallel_size}); raise --tp or --gpu-memory-utilization"
        )
    n = inputs.prefix_tokens
    stored = stored_tokens(n, inputs.chunk_size)
    return Sizing(
        model=model.name,
        gpu=gpu.name,
        storage=storage.name,
        prefix_tokens=n,
        num_prefixes=inputs.num_prefixes,
        tensor_parallel_size=inputs.tensor_parallel_size,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        kv_bytes_per_token=costs.kv_bytes_per_token,
        gpu_kv_capacity_tokens=capacity,
        prefixes_fit_in_gpu=min(inputs.num_prefixes, capacity // n),
        storage_bytes_needed=inputs.num_prefixes * stored * costs.kv_bytes_per_token,
        prefill_seconds_per_prefix=costs.prefill_compute_s(n),
        load_seconds_per_prefix=load_seconds(costs, storage, stored, inputs),
        break_even_read_gb_s=costs.break_even_read_bandwidth_gb_s(n),
        storage_read_gb_s=storage.read_bandwidth_gb_s,
    )


def inputs_from_settings(
    settings: EngineSettings, prefix_tokens: int, num_prefixes: int
) -> SizingInputs:
    """The sizing inputs that describe an engine configured with `settings`."""
    lm: LMCacheSettings = settings.lmcache
    return SizingInputs(
        prefix_tokens=prefix_tokens,
        num_prefixes=num_prefixes,
        tensor_parallel_size=settings.tensor_parallel_size,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        chunk_size=lm.chunk_size,
        block_size=settings.block_size,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs,
        disk_io_threads=lm.disk_io_threads,
    )
