"""Arrival schedules: when each request of an iteration is released.

Batch mode releases `batch_size` requests at once and the next group when the previous one has
completed (the reference experiment's "large simultaneous batches"). Rate mode follows `vllm
bench serve`: gamma-distributed gaps with shape `burstiness` and mean 1/rate (Poisson when
burstiness is 1), all at once when the rate is infinite, drawn from a local seeded generator.
"""

from __future__ import annotations

import math

import numpy as np

from kvops.workload.spec import WorkloadSpec


def batch_groups(n_requests: int, batch_size: int) -> list[range]:
    """Request indices per batch, in release order."""
    return [range(i, min(i + batch_size, n_requests)) for i in range(0, n_requests, batch_size)]


def arrival_offsets_s(spec: WorkloadSpec, n_requests: int, *, key: tuple[int, ...]) -> list[float]:
    """Release offsets (seconds from the iteration start) for rate mode."""
    rate = spec.rate if spec.rate is not None else math.inf
    if math.isinf(rate):
        return [0.0] * n_requests
    rng = np.random.default_rng([spec.seed, 2, *key])
    shape = spec.burstiness
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n_requests)
    gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]
