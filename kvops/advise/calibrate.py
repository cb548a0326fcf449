"""Calibration: refit the few uncertain figures of a site's profiles from measured A/B points.

Why these three: everything else in a profile is a datasheet or config.json figure (memory
size, HBM bandwidth, layers, KV heads), but three are estimates that decide whether offload
pays (`kvops/sim/profiles/*.yaml` say so in their comments): the storage path's effective
read bandwidth (`read_bandwidth_gb_s`: goodput after RoCE/NFS framing, contention, the GDS
path's own limits), its per-I/O latency (`io_latency_us`) and the GPU's end-to-end prefill
efficiency (`prefill_mfu`: the compute a load must beat). A campaign measured on the site says
what they effectively are.

How: a bounded, seeded, derivative-free search (the objective is a simulation, piecewise and
noisy in the parameters, so no gradients; numpy only, scipy is not a dependency). Each figure
is searched on its own range, bandwidth and latency on a log scale: first a seeded random
sample of the box (so a badly mis-set start is left behind), then a compass (pattern) search
from the best point found, halving its step until the evaluation budget is spent (Kolda,
Lewis & Torczon, "Optimization by direct search", SIAM Review 45(3), 2003). The objective is
whatever the caller passes: `kvops advise --calibrate` passes the prediction score's mean
absolute delta error on the points it fits on, and reports the score on the points it held
back, which the fit never saw. Pure: no I/O but `profile_yaml`'s text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import yaml

from kvops.errors import KvopsError
from kvops.sim.profiles import GpuProfile, StorageProfile


class CalibrationError(KvopsError, ValueError):
    """Calibration cannot run as asked (too few points, a bad run directory): exit code 2."""


@dataclass(frozen=True)
class Figure:
    """One fitted figure: `kind.field` of a profile, its search range, and its scale."""

    name: str  # "storage.read_bandwidth_gb_s"
    low: float
    high: float
    log: bool

    def to_unit(self, value: float) -> float:
        v = min(max(value, self.low), self.high)
        if self.log:
            return math.log(v / self.low) / math.log(self.high / self.low)
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(u, 0.0), 1.0)
        if self.log:
            return float(self.low * (self.high / self.low) ** u)
        return self.low + u * (self.high - self.low)


# Ranges wide enough for any GDS path from a single 10 GbE link to several 400 GbE ones, any
# per-I/O round trip from local NVMe (~10 us) to a congested network filesystem (100 ms), and
# any prefill efficiency a real engine reaches.
FIGURES: tuple[Figure, ...] = (
    Figure("storage.read_bandwidth_gb_s", 0.1, 1000.0, log=True),
    Figure("storage.io_latency_us", 1.0, 100_000.0, log=True),
    Figure("gpu.prefill_mfu", 0.05, 1.0, log=False),
)
Figures = dict[str, float]


def figures_of(gpu: GpuProfile, storage: StorageProfile) -> Figures:
    """The fitted figures' current values in these profiles."""
    return {
        "storage.read_bandwidth_gb_s": storage.read_bandwidth_gb_s,
        "storage.io_latency_us": storage.io_latency_us,
        "gpu.prefill_mfu": gpu.prefill_mfu,
    }


def apply_figures(
    gpu: GpuProfile, storage: StorageProfile, figures: Mapping[str, float]
) -> tuple[GpuProfile, StorageProfile]:
    """The profiles with the figures set (those not given keep their values)."""
    unknown = set(figures) - {f.name for f in FIGURES}
    if unknown:
        raise KeyError(f"not a fitted figure: {sorted(unknown)}")
    return (
        dataclasses.replace(gpu, prefill_mfu=figures.get("gpu.prefill_mfu", gpu.prefill_mfu)),
        dataclasses.replace(
            storage,
            read_bandwidth_gb_s=figures.get(
                "storage.read_bandwidth_gb_s", storage.read_bandwidth_gb_s
            ),
            io_latency_us=figures.get("storage.io_latency_us", storage.io_latency_us),
        ),
    )


@dataclass(frozen=True)
class FitResult:
    start: Figures
    start_objective: float
    best: Figures
    best_objective: float
    evaluations: int


def fit(
    objective: Callable[[Figures], float],
    start: Figures,
    figures: Sequence[Figure] = FIGURES,
    seed: int = 0,
    max_evals: int = 48,
) -> FitResult:
    """Minimise `objective` over the figures' box, from `start`, in at most `max_evals`
    evaluations (a third on a seeded random sample, the rest on a compass search from the
    best). Deterministic for a seed and objective; never returns worse than the start."""
    if max_evals < 2:
        raise CalibrationError("calibration needs 2 or more evaluations")
    names = [f.name for f in figures]
    cache: dict[tuple[float, ...], float] = {}

    def value(u: np.ndarray) -> float:
        key = tuple(round(float(x), 6) for x in np.clip(u, 0.0, 1.0))
        if key not in cache:
            got = objective({f.name: f.from_unit(x) for f, x in zip(figures, key, strict=True)})
            cache[key] = got if math.isfinite(got) else math.inf
        return cache[key]

    u0 = np.array([f.to_unit(start[f.name]) for f in figures])
    # the start as given (maybe outside the box) is what "before" means
    start_objective = objective({n: start[n] for n in names})
    if all(f.low <= start[f.name] <= f.high for f in figures):
        cache[tuple(round(float(x), 6) for x in u0)] = start_objective
    best_u, best = u0, value(u0)
    rng = np.random.default_rng(seed)
    for u in rng.random((max(0, max_evals // 3 - 1), len(figures))):
        got = value(u)
        if got < best:
            best_u, best = u, got
    step = 0.25
    while len(cache) < max_evals and step >= 1 / 256:
        moved = False
        for i in range(len(figures)):
            for sign in (1.0, -1.0):
                if len(cache) >= max_evals:
                    break
                trial = best_u.copy()
                trial[i] = min(max(trial[i] + sign * step, 0.0), 1.0)
                got = value(trial)
                if got < best:
                    best_u, best, moved = trial, got, True
        if not moved:
            step /= 2
    found = {f.name: f.from_unit(float(x)) for f, x in zip(figures, best_u, strict=True)}
    if best >= start_objective:
        return FitResult(dict(start), start_objective, dict(start), start_objective, len(cache))
    return FitResult(dict(start), start_objective, found, best, len(cache))


def hold_out(count: int, held: int, seed: int = 0) -> list[int]:
    """Which of `count` points (in their order) are held back from the fit: `held` of them,
    chosen seeded, sorted. At least one point must be left to fit on."""
    if count < 2:
        raise CalibrationError(
            f"calibration needs 2 or more measured points ({count} found): one or more to fit "
            "on and one or more to hold back"
        )
    if not 1 <= held < count:
        raise CalibrationError(f"--hold-out {held}: give 1 to {count - 1} for {count} points")
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(count, size=held, replace=False))


def default_hold_out(count: int) -> int:
    """A third of the points, at least one (the fit keeps the rest)."""
    return max(1, count // 3)


def profile_yaml(kind: str, profile: GpuProfile | StorageProfile, comments: Sequence[str]) -> str:
    """A profile file `--gpu`/`--storage` (and ab-test's `--predict-*`) read back."""
    head = "".join(f"# {line}\n" for line in comments)
    body = yaml.safe_dump(
        {"kind": kind, **dataclasses.asdict(profile)}, sort_keys=False, default_flow_style=False
    )
    return "---\n" + head + body
