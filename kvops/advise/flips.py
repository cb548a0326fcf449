"""Where the answer flips, found by simulation: the read bandwidth at which loading a prefix
takes as long as recomputing it (one request, the physics alone), and the read bandwidth at
which the offload arm's throughput meets the baseline's on the workload itself.

Both searches use the secant method in x = 1 / bandwidth: a load's time is bytes / bandwidth
plus fixed costs, so the quantity compared is close to linear in x and the search converges in
a few replays (each replay is one arm over the sample, the expensive part).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvops.advise.arms import Profiles
from kvops.advise.ranges import with_read_bandwidth
from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.records import Request

TOLERANCE = 0.005  # relative gap between the two sides at which a crossing counts as found
MAX_STEPS = 8


def secant_crossing(
    gap: Callable[[float], float], first_gb_s: float, second_gb_s: float
) -> float | None:
    """The bandwidth where `gap(bandwidth)` (a relative difference, offload minus baseline)
    is zero, or None when the search leaves the physical range (no crossing)."""
    x0, x1 = 1.0 / first_gb_s, 1.0 / second_gb_s
    g0, g1 = gap(first_gb_s), gap(second_gb_s)
    for _ in range(MAX_STEPS):
        if abs(g1) <= TOLERANCE:
            return 1.0 / x1
        if g1 == g0:
            return None
        x2 = x1 - g1 * (x1 - x0) / (g1 - g0)
        if not 0 < x2 < 1e3:  # slower than 1 MB/s, or negative: no crossing
            return None
        x0, g0 = x1, g1
        x1 = x2
        g1 = gap(1.0 / x1)
    return 1.0 / x1 if abs(g1) <= 4 * TOLERANCE else None


def _ttft_s(profiles: Profiles, settings: EngineSettings, prefix: np.ndarray) -> float:
    """TTFT of a request whose prefix was computed by an earlier request and then dropped from
    the GPU prefix cache (so it is either recomputed or, with offload, loaded)."""
    engine = build_engine(profiles.model, profiles.gpu, profiles.storage, settings)
    first = np.concatenate((prefix, np.arange(1, 17, dtype=np.int64)))
    second = np.concatenate((prefix, np.arange(101, 117, dtype=np.int64)))
    engine.run([Request("warm", 0.0, first, 1)])
    engine.reset_prefix_cache()
    # Arrive long after the warm-up's chunk writes have landed.
    record = engine.run([Request("probe", engine.now_s + 60.0, second, 1)])[0]
    assert record.ttft_s is not None
    return record.ttft_s


def simulated_break_even_gb_s(
    profiles: Profiles,
    baseline: EngineSettings,
    offload: EngineSettings,
    prefix_tokens: int,
    guess_gb_s: float,
) -> float | None:
    """Read bandwidth at which loading a stored `prefix_tokens` prefix gives the same TTFT as
    recomputing it, by simulation (the closed form's counterpart)."""
    chunk = offload.lmcache.chunk_size
    n = max(chunk, prefix_tokens // chunk * chunk)
    prefix = np.arange(n, dtype=np.int64) % (profiles.model.vocab_size - 200) + 200
    recompute_s = _ttft_s(profiles, baseline, prefix)

    def gap(bandwidth: float) -> float:
        return _ttft_s(with_read_bandwidth(profiles, bandwidth), offload, prefix) / recompute_s - 1

    return secant_crossing(gap, guess_gb_s, guess_gb_s * 2)


def throughput_flip_gb_s(
    replay_offload_s: Callable[[Profiles], float],
    profiles: Profiles,
    baseline_duration_s: float,
    nominal_gap: float,
    guess_gb_s: float,
) -> float | None:
    """Read bandwidth at which the offload arm takes as long as the baseline over the replayed
    requests (its throughput equals the baseline's). `replay_offload_s(profiles)` replays the
    offload arm with those profiles over the same requests as `baseline_duration_s` and returns
    its duration; `nominal_gap` is the relative duration gap already measured at the profile's
    bandwidth (saves one replay)."""
    nominal = profiles.storage.read_bandwidth_gb_s

    def gap(bandwidth: float) -> float:
        if bandwidth == nominal:
            return nominal_gap
        duration_s = replay_offload_s(with_read_bandwidth(profiles, bandwidth))
        return duration_s / baseline_duration_s - 1

    if guess_gb_s <= 0 or abs(guess_gb_s / nominal - 1) < 0.05:
        guess_gb_s = nominal / 2
    return secant_crossing(gap, nominal, guess_gb_s)
