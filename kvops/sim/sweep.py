"""Sweeping one parameter through both arms in virtual time: where does offload flip?

Why: "does offload pay" depends on a few knobs - how many prefixes compete for the GPU cache,
how fast storage reads, how long outputs are (decode time dilutes a prefill saving). A sweep runs
the seed scenario at each value through a baseline and an offload engine (the same protocol as
`kvops sim run`: warm-up left out, shuffled order) and reports the throughput delta, the point
where it changes sign (interpolated between the two values around it), and the closed-form
break-even read bandwidth for the prefix length beside it. Pure: profiles in, points out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile
from kvops.sim.seed_workloads import SeedShape, Summary, run_batches, seed_batches, summarize

SHAPE_PARAMS = ("num_prefixes", "prefix_tokens", "output_tokens", "batch_size")
STORAGE_PARAMS = ("read_bandwidth_gb_s",)
SWEEPABLE = SHAPE_PARAMS + STORAGE_PARAMS


class SweepError(ValueError):
    """A sweep that cannot run as written; the message names the fix."""


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """`read_bandwidth_gb_s=2,4,8` -> ("read_bandwidth_gb_s", [2.0, 4.0, 8.0])."""
    param, sep, values = text.partition("=")
    param = param.strip().replace("-", "_")
    if not sep or param not in SWEEPABLE:
        raise SweepError(f"sweep {text!r}: give PARAM=V1,V2,... with PARAM one of {SWEEPABLE}")
    try:
        parsed = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise SweepError(f"sweep {text!r}: values must be numbers") from None
    if len(parsed) < 2 or any(v <= 0 for v in parsed):
        raise SweepError(f"sweep {text!r}: give two or more positive values")
    if param in SHAPE_PARAMS and any(v != int(v) for v in parsed):
        raise SweepError(f"sweep {text!r}: {param} takes whole numbers")
    return param, sorted(parsed)


@dataclass(frozen=True)
class SweepPoint:
    value: float
    baseline: Summary
    offload: Summary
    break_even_read_gb_s: float

    def delta_pct(self, metric: str) -> float:
        b, c = getattr(self.baseline, metric), getattr(self.offload, metric)
        return (c / b - 1.0) * 100.0 if b else 0.0


@dataclass(frozen=True)
class Flip:
    """Offload's throughput delta changes sign between `low` and `high` (near `at`)."""

    low: float
    high: float
    at: float
    helps_above: bool


def run_sweep(
    param: str,
    values: Sequence[float],
    *,
    scenario: str,
    shape: SeedShape,
    model: ModelProfile,
    gpu: GpuProfile,
    storage: StorageProfile,
    settings: Callable[[bool], EngineSettings],
    skip_iterations: int = 1,
) -> list[SweepPoint]:
    """Each value through both arms. A storage parameter leaves the baseline unchanged, so it is
    simulated once."""
    points: list[SweepPoint] = []
    baseline: Summary | None = None
    for value in values:
        changes: dict[str, Any] = {param: int(value) if param in SHAPE_PARAMS else value}
        s = dataclasses.replace(shape, **changes) if param in SHAPE_PARAMS else shape
        st = dataclasses.replace(storage, **changes) if param in STORAGE_PARAMS else storage

        def arm(offload: bool, s: SeedShape = s, st: StorageProfile = st) -> Summary:
            engine = build_engine(model, gpu, st, settings(offload))
            records = run_batches(engine, seed_batches(scenario, s), s.send_interval_s)
            return summarize(records, skip_iterations * s.batch_size)

        if baseline is None or param in SHAPE_PARAMS:
            baseline = arm(False)
        costs = build_engine(model, gpu, st, settings(False)).costs
        break_even = costs.break_even_read_bandwidth_gb_s(s.prefix_tokens)
        points.append(SweepPoint(value, baseline, arm(True), break_even))
    return points


def find_flip(
    points: Sequence[SweepPoint], metric: str = "total_token_throughput_tok_s"
) -> Flip | None:
    """The first sign change of the delta along the sweep, linearly interpolated."""
    for a, b in itertools.pairwise(points):
        da, db = a.delta_pct(metric), b.delta_pct(metric)
        if (da < 0) != (db < 0):
            at = a.value + (b.value - a.value) * (-da) / (db - da) if db != da else a.value
            return Flip(a.value, b.value, at, helps_above=db > da)
    return None
