"""The seed's three workload shapes as model requests, for tests, the speed benchmark and
`kvops sim run`. (The user-facing workload presets live in `kvops.workload`; these are the
model-side fixtures that prove the simulator reproduces the seed's outcomes.)

1. `unique`: one-shot prompts with nothing in common.
2. `one-prefix`: one shared prefix plus a unique suffix per prompt; the prefix stays resident.
3. `multi-prefix`: `num_prefixes` shared prefixes plus unique suffixes; together they overflow
   the GPU KV cache.
Each is a list of batches; a batch is sent all at once when the previous one has finished
(closed loop), which is how `kvops ab-test` drives the real server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from kvops.sim.model import Engine
from kvops.sim.records import Request, SimRequestRecord

SCENARIOS = ("unique", "one-prefix", "multi-prefix")


@dataclass(frozen=True)
class SeedShape:
    prefix_tokens: int = 28_000
    suffix_tokens: int = 2_000
    num_prefixes: int = 20
    batch_size: int = 40
    iterations: int = 4
    output_tokens: int = 64
    vocab_size: int = 128_256
    seed: int = 0
    request_order: str = "shuffled"  # or "cyclic": prefix 0, 1, ..., N-1, 0, ... (as ab-test)
    # virtual seconds between a batch's consecutive sends: a real client writes one body after
    # another, and a request arriving after the batch's first step began has its prefill put
    # between the others' decode steps (0: the whole batch at one instant, an ideal client)
    send_interval_s: float = 0.0


def seed_batches(scenario: str, shape: SeedShape = SeedShape()) -> list[list[Request]]:
    """Batches of requests for one scenario; token ids are drawn from a seeded local RNG."""
    return list(iter_seed_batches(scenario, shape))


def iter_seed_batches(scenario: str, shape: SeedShape = SeedShape()) -> Iterator[list[Request]]:
    """The same batches, generated one at a time (10,000 prompts of 30K tokens would need
    2.4 GB as one list)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(shape.seed)
    total = shape.prefix_tokens + shape.suffix_tokens
    n_prefixes = {"unique": 0, "one-prefix": 1, "multi-prefix": shape.num_prefixes}[scenario]
    prefixes = [
        rng.integers(0, shape.vocab_size, shape.prefix_tokens, dtype=np.int64)
        for _ in range(n_prefixes)
    ]
    for it in range(shape.iterations):
        batch = []
        shuffled = rng.permutation(shape.batch_size)
        order = shuffled if shape.request_order == "shuffled" else range(shape.batch_size)
        for j in order:
            rid = f"{scenario}-{it}-{j}"
            if n_prefixes == 0:
                tokens = rng.integers(0, shape.vocab_size, total, dtype=np.int64)
            else:
                suffix = rng.integers(0, shape.vocab_size, shape.suffix_tokens, dtype=np.int64)
                tokens = np.concatenate([prefixes[int(j) % n_prefixes], suffix])
            batch.append(Request(rid, 0.0, tokens, shape.output_tokens))
        yield batch


def run_batches(
    engine: Engine, batches: Iterable[list[Request]], send_interval_s: float = 0.0
) -> list[SimRequestRecord]:
    """Closed loop: each batch is sent when the engine has finished the previous one, its
    requests `send_interval_s` apart in send order."""
    records: list[SimRequestRecord] = []
    for batch in batches:
        start_s = engine.now_s
        for position, req in enumerate(batch):
            req.arrival_s = start_s + position * send_interval_s
        records.extend(engine.run(batch))
    return records


@dataclass(frozen=True)
class Summary:
    """vLLM `bench serve`-style figures over a run (virtual seconds)."""

    duration_s: float
    total_token_throughput_tok_s: float
    mean_ttft_ms: float
    gpu_hit_tokens: int
    offload_hit_tokens: int
    mean_itl_ms: float = 0.0


def summarize(records: list[SimRequestRecord], skip_first: int = 0) -> Summary:
    """Figures over the records, leaving out the first `skip_first` (a warm-up iteration's
    requests, as `kvops ab-test --warmup-iterations` leaves them out)."""
    records = records[skip_first:]
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s or r.arrival_s for r in records)
    tokens = sum(r.prompt_tokens + len(r.token_times_s) for r in records)
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    gaps = [b - a for r in records for a, b in itertools.pairwise(r.token_times_s)]
    return Summary(
        duration_s=end - start,
        total_token_throughput_tok_s=tokens / (end - start) if end > start else 0.0,
        mean_ttft_ms=1e3 * sum(ttfts) / len(ttfts) if ttfts else 0.0,
        gpu_hit_tokens=sum(r.gpu_hit_tokens for r in records),
        offload_hit_tokens=sum(r.offload_hit_tokens for r in records),
        mean_itl_ms=1e3 * sum(gaps) / len(gaps) if gaps else 0.0,
    )
