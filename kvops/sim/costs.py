"""Roofline costs of one engine step, KV capacity, and storage transfer times.

All figures come from the GPU, model and storage profiles (the roofline model: Williams,
Waterman, Patterson, CACM 52(4), 2009, https://doi.org/10.1145/1498765.1498785):
- prefill of n new tokens after c context tokens costs
  2 x params x n + 4 x layers x hidden x n x (c + n/2) FLOPs, at peak x MFU;
- every step streams the weights once plus the KV of every scheduled request's context, at HBM
  bandwidth x efficiency;
- a step costs the larger of compute and memory time plus a fixed per-step overhead;
- a stored prefix loads at the storage read bandwidth plus a per-I/O latency per chunk file.
Tensor parallelism splits FLOPs, weights and KV evenly over ranks (communication is not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class CostModel:
    gpu: GpuProfile
    model: ModelProfile
    tensor_parallel_size: int = 1

    @property
    def kv_bytes_per_token(self) -> int:
        """Whole-model KV bytes per token (what is stored and loaded, summed over ranks)."""
        return self.model.kv_bytes_per_token()

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        return self.kv_bytes_per_token / self.tensor_parallel_size

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.params_b * 1e9 * self.model.dtype_bytes / self.tensor_parallel_size

    def activation_bytes_per_gpu(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak activation reserve vLLM's profiling run finds: the MLP and attention buffers of
        one full token budget plus fp32 logits for every sequence."""
        m = self.model
        per_token = (2 * m.intermediate_size / self.tensor_parallel_size + 4 * m.hidden_size) * (
            m.dtype_bytes
        )
        logits = max_num_seqs * m.vocab_size * 4
        return max_num_batched_tokens * per_token + logits

    def kv_capacity_tokens(
        self,
        gpu_memory_utilization: float,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        reserved_bytes_per_gpu: float = 0.0,
    ) -> int:
        """Tokens of KV the GPU pool holds: memory x utilisation - weights - activations -
        runtime overhead - other reservations (e.g. LMCache's GDS buffer), per rank."""
        budget = self.gpu.memory_mib * MIB * gpu_memory_utilization
        free = (
            budget
            - self.weight_bytes_per_gpu
            - self.activation_bytes_per_gpu(max_num_batched_tokens, max_num_seqs)
            - self.gpu.runtime_overhead_gib * GIB
            - reserved_bytes_per_gpu
        )
        return max(0, int(free // self.kv_bytes_per_token_per_gpu))

    def prefill_flops(self, new_tokens: int, context_tokens: int) -> float:
        m = self.model
        dense = 2.0 * m.params_b * 1e9 * new_tokens
        attention = (
            4.0 * m.num_layers * m.hidden_size * new_tokens * (context_tokens + new_tokens / 2.0)
        )
        return dense + attention

    def prefill_flops_total(self, new_tokens: int, attention_token_pairs: float) -> float:
        """FLOPs of a whole step: dense over all new tokens plus attention, where
        `attention_token_pairs` is the sum over requests of n x (c + n/2)."""
        m = self.model
        return 2.0 * m.params_b * 1e9 * new_tokens + 4.0 * m.num_layers * m.hidden_size * (
            attention_token_pairs
        )

    def step_time_s(self, flops: float, kv_tokens_read: int, new_tokens: int) -> float:
        """One forward pass: max(compute, memory) + overhead, on one rank."""
        g = self.gpu
        compute_s = flops / self.tensor_parallel_size / (g.bf16_dense_tflops * 1e12 * g.prefill_mfu)
        bytes_moved = (
            self.weight_bytes_per_gpu
            + (kv_tokens_read + new_tokens) * self.kv_bytes_per_token_per_gpu
        )
        memory_s = bytes_moved / (g.hbm_bandwidth_gb_s * 1e9 * g.hbm_efficiency)
        return max(compute_s, memory_s) + g.step_overhead_ms / 1e3

    def prefill_compute_s(self, tokens: int, context_tokens: int = 0) -> float:
        """Compute-bound time to prefill `tokens` after `context_tokens`, without overhead."""
        g = self.gpu
        peak = g.bf16_dense_tflops * 1e12 * g.prefill_mfu * self.tensor_parallel_size
        return self.prefill_flops(tokens, context_tokens) / peak

    def break_even_read_bandwidth_gb_s(self, prefix_tokens: int) -> float:
        """Storage read bandwidth at which loading a stored prefix takes as long as
        recomputing it; faster storage makes offload hits pay."""
        nbytes = prefix_tokens * self.kv_bytes_per_token
        return nbytes / self.prefill_compute_s(prefix_tokens) / 1e9

    def device_copy_s(self, tokens: int) -> float:
        """Copying KV between the paged cache and LMCache's staging buffer, on HBM."""
        g = self.gpu
        nbytes = tokens * self.kv_bytes_per_token_per_gpu * 2  # read + write
        return nbytes / (g.hbm_bandwidth_gb_s * 1e9 * g.hbm_efficiency)


def transfer_time_s(
    storage: StorageProfile, nbytes: float, num_ios: int, io_parallelism: int, read: bool
) -> float:
    """Moving `nbytes` in `num_ios` chunk files: bytes at the link's bandwidth plus one I/O
    latency per round of `io_parallelism` concurrent files."""
    if num_ios <= 0:
        return 0.0
    bandwidth = storage.read_bandwidth_gb_s if read else storage.write_bandwidth_gb_s
    rounds = math.ceil(num_ios / max(1, io_parallelism))
    return nbytes / (bandwidth * 1e9) + rounds * storage.io_latency_us / 1e6
