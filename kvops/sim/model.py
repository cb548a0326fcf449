"""A discrete-event model of vLLM V1 serving with LMCache offload, in virtual time.

Pure and deterministic: no I/O, no wall clock, no randomness. `kvops sim serve` drives it in real
time; `kvops advise` and the tests drive it directly.

Python API::

    from kvops.sim.model import EngineSettings, Request, build_engine, simulate
    from kvops.sim.lmcache_config import LMCacheSettings

    settings = EngineSettings(
        offload=True,  # vLLM --kv-transfer-config with LMCacheConnectorV1
        lmcache=LMCacheSettings(local_cpu=False, gds_path="/mnt/gds", gds_buffer_size=8192),
    )
    engine = build_engine(model="llama-3.1-8b", gpu="h100-sxm-80gb",
                          storage="ontap-nfs-rdma-200g", settings=settings)
    records = engine.run([Request("r0", arrival_s=0.0, prompt_tokens=[1, 2, 3], output_tokens=8)])
    records[0].ttft_s, records[0].token_times_s, records[0].offload_hit_tokens, engine.stats

    # or in one call:
    records = simulate(requests, model="llama-3.1-8b", settings=settings)

Profiles may be names (see `kvops.sim.profiles.known_names`), paths to YAML files, or profile
objects (`dataclasses.replace(load_storage(...), read_bandwidth_gb_s=...)` for a sweep).
Closed-loop batches (each sent when the previous finished): `kvops.sim.seed_workloads.run_batches`.
Several engines sharing one storage export behind a router: `kvops.sim.fleet` (`build_engine(...,
export=SharedExport(...), instance=i)` makes one of them).
Physics helpers: `engine.costs` (`CostModel`: `kv_capacity_tokens`, `step_time_s`,
`break_even_read_bandwidth_gb_s(prefix_tokens)`), `engine.cache.num_blocks`, `engine.stats`.
Incremental use (the server): `engine.add_request(req)`, then `engine.step()` repeatedly while
`engine.has_work()`; each `StepResult` says which requests got a token at `end_s`. When nothing
is runnable, `step()` jumps virtual time to the next arrival.

What is modelled (see `costs.py`, `kvcache.py`, `offload.py`): vLLM V1 scheduling (running
requests first, then waiting ones FCFS; `max_num_seqs`; a `max_num_batched_tokens` budget shared
by decodes and chunked prefills; recompute preemption of the newest running request when blocks
run out), block-hashed prefix caching with LRU eviction, LMCache chunk store/lookup/load, and a
roofline step cost. Not modelled: EOS (every request generates exactly its output tokens),
speculative decoding, tensor-parallel communication, LMCache's async/layerwise loading,
`save_unfull_chunk` and `save_decode_cache` (only full prompt chunks are stored).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvops.sim.costs import GIB, MIB, CostModel
from kvops.sim.engine import Engine, EngineError, EngineSettings
from kvops.sim.export import SharedExport
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.offload import OffloadTier
from kvops.sim.profiles import (
    GpuProfile,
    ModelProfile,
    StorageProfile,
    load_gpu,
    load_model,
    load_storage,
)
from kvops.sim.records import EngineStats, Request, SimRequestRecord, StepResult

__all__ = [
    "Engine",
    "EngineError",
    "EngineSettings",
    "EngineStats",
    "LMCacheSettings",
    "Request",
    "SimRequestRecord",
    "StepResult",
    "build_engine",
    "simulate",
]


def build_engine(
    model: str | ModelProfile = "llama-3.1-8b",
    gpu: str | GpuProfile = "h100-sxm-80gb",
    storage: str | StorageProfile = "ontap-nfs-rdma-200g",
    settings: EngineSettings | None = None,
    export: SharedExport | None = None,
    instance: int = 0,
) -> Engine:
    """An engine from profiles (names, YAML paths, or profile objects, e.g. a storage profile
    with a swept bandwidth) and settings; ProfileError on a bad name. With `export`, the engine
    is instance `instance` of a fleet whose offload tiers share that export (`kvops.sim.fleet`)."""
    settings = settings or EngineSettings()
    model_p = load_model(model) if isinstance(model, str) else model
    gpu_p = load_gpu(gpu) if isinstance(gpu, str) else gpu
    storage_p = load_storage(storage) if isinstance(storage, str) else storage
    costs = CostModel(gpu_p, model_p, settings.tensor_parallel_size)
    lm = settings.lmcache
    offload = None
    reserved = 0.0
    if settings.offload:
        lm.validate()
        offload = OffloadTier(
            lm,
            storage_p,
            load_storage("host-dram"),
            costs.kv_bytes_per_token,
            settings.tensor_parallel_size,
            settings.kv_capacity_scale,
            export,
            instance,
        )
        reserved = settings.gds_buffer_reserved_mib * 1024**2
    if settings.kv_cache_memory_bytes:
        tokens = _fixed_kv_tokens(costs, settings)
    else:
        tokens = costs.kv_capacity_tokens(
            settings.gpu_memory_utilization,
            settings.max_num_batched_tokens,
            settings.max_num_seqs,
            reserved,
        )
    blocks = int(tokens // settings.block_size * settings.kv_capacity_scale)
    if settings.num_gpu_blocks_override is not None:
        blocks = min(blocks, settings.num_gpu_blocks_override) if blocks > 0 else 0
    if blocks <= 0:
        raise EngineError(
            f"no memory left for the KV cache: {model_p.name} needs "
            f"{costs.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU on {gpu_p.name} "
            f"(tensor_parallel_size={settings.tensor_parallel_size})"
        )
    max_len = settings.max_model_len or model_p.max_position
    return Engine(costs, settings, blocks, offload, max_len)


def shared_kv_memory_bytes(
    model: str | ModelProfile,
    gpu: str | GpuProfile,
    gds_buffer_mib: int,
    tensor_parallel_size: int = 1,
) -> int:
    """One GPU KV memory for a baseline and an offload arm (`kv_cache_memory_bytes`, per GPU):
    what vLLM's default utilisation leaves for KV once the offload arm's GDS buffer is also on
    the GPU, so both fit. The vllm_lmcache role gives every variant the same KV memory
    (`vllm_lmcache_kv_cache_memory_bytes`, roles/vllm_lmcache/README.md); arms with different
    KV capacity batch differently, and that would read as an offload effect. 0 when the
    weights leave no room."""
    model_p = load_model(model) if isinstance(model, str) else model
    gpu_p = load_gpu(gpu) if isinstance(gpu, str) else gpu
    costs = CostModel(gpu_p, model_p, tensor_parallel_size)
    d = EngineSettings()
    tokens = costs.kv_capacity_tokens(
        d.gpu_memory_utilization, d.max_num_batched_tokens, d.max_num_seqs, gds_buffer_mib * MIB
    )
    return int(tokens * costs.kv_bytes_per_token_per_gpu)


def _fixed_kv_tokens(costs: CostModel, settings: EngineSettings) -> int:
    """KV tokens per GPU for `--kv-cache-memory-bytes`; EngineError when that KV, the weights,
    the activations, the runtime and LMCache's GDS buffer together exceed the GPU's memory."""
    kv = int(settings.kv_cache_memory_bytes or 0)
    buffer = settings.lmcache.staging_buffer_mib * MIB if settings.offload else 0
    others = (
        costs.weight_bytes_per_gpu
        + costs.activation_bytes_per_gpu(settings.max_num_batched_tokens, settings.max_num_seqs)
        + costs.gpu.runtime_overhead_gib * GIB
        + buffer
    )
    total = costs.gpu.memory_mib * MIB
    if kv + others > total:
        raise EngineError(
            f"kv_cache_memory_bytes {kv / GIB:.1f} GiB does not fit on {costs.gpu.name}: with "
            f"weights, activations, runtime and a {buffer / MIB:.0f} MiB GDS buffer it needs "
            f"{(kv + others) / GIB:.1f} GiB of {total / GIB:.1f} GiB"
        )
    return int(kv // costs.kv_bytes_per_token_per_gpu)


def simulate(
    requests: Iterable[Request],
    model: str | ModelProfile = "llama-3.1-8b",
    gpu: str | GpuProfile = "h100-sxm-80gb",
    storage: str | StorageProfile = "ontap-nfs-rdma-200g",
    settings: EngineSettings | None = None,
) -> list[SimRequestRecord]:
    """Build an engine and run `requests` through it; per-request records in input order."""
    return build_engine(model, gpu, storage, settings).run(requests)
