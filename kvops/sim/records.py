"""Inputs and outputs of the simulated engine: requests in, per-request records and counters out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass
class Request:
    """One request: when it arrives (virtual seconds), its prompt token ids, how many tokens it
    generates (the model never stops early: `max_tokens` is always reached)."""

    request_id: str
    arrival_s: float
    prompt_tokens: Sequence[int] | npt.NDArray[np.integer]
    output_tokens: int


@dataclass
class SimRequestRecord:
    """What happened to one request, in virtual seconds. Prompt tokens by source are from the
    request's first scheduling (what vLLM reports as cached tokens); recomputation after a
    preemption is counted in `num_preemptions`, not here."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    gpu_hit_tokens: int = 0
    offload_hit_tokens: int = 0
    computed_prompt_tokens: int = 0
    num_preemptions: int = 0
    aborted: bool = False

    @property
    def cached_tokens(self) -> int:
        """`usage.prompt_tokens_details.cached_tokens`: GPU prefix hits plus connector hits."""
        return self.gpu_hit_tokens + self.offload_hit_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass
class EngineStats:
    """Cumulative counters named after the vLLM metrics they feed (units: tokens, requests)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    request_success: int = 0
    num_steps: int = 0
    busy_s: float = 0.0
    offload_copied_tokens: int = 0  # copied from the paged KV cache to LMCache's buffer


@dataclass(frozen=True)
class FailedLoad:
    """A load whose stored chunks could not all be read (only where a reader checks them: the
    server over its chunk files): the request recomputes from the first unreadable chunk on,
    as vLLM does with `kv_load_failure_policy: recompute`."""

    request_id: str
    recomputed_tokens: int  # tokens scheduled to load that are recomputed instead
    why: dict[int, str]  # unreadable chunk hash -> what reading it said


@dataclass
class StepResult:
    """One engine step: when it ended, which requests got a token, which finished, and which
    offload chunks were newly stored (for the GDS file writer)."""

    start_s: float
    end_s: float
    token_request_ids: list[str]
    finished: list[SimRequestRecord]
    stored_chunk_hashes: list[int]
