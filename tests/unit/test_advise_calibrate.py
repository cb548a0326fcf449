"""Calibration's search and hold-out (kvops.advise.calibrate): the seeded, bounded search
finds a known optimum from a badly mis-set start, never returns worse than the start, keeps
to its budget; points held back are seeded and named; calibrated profiles load back."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from kvops.advise.calibrate import (
    FIGURES,
    CalibrationError,
    apply_figures,
    default_hold_out,
    figures_of,
    fit,
    hold_out,
    profile_yaml,
)
from kvops.sim.profiles import load_gpu, load_storage

pytestmark = pytest.mark.unit

TRUE = {"storage.read_bandwidth_gb_s": 21.25, "storage.io_latency_us": 300.0,
        "gpu.prefill_mfu": 0.45}  # fmt: skip


def _bowl(calls: list[dict[str, float]]) -> Callable[[dict[str, float]], float]:
    """A known objective: squared distance to TRUE, bandwidth and latency in decades."""

    def objective(f: dict[str, float]) -> float:
        calls.append(f)
        return (
            math.log10(f["storage.read_bandwidth_gb_s"] / TRUE["storage.read_bandwidth_gb_s"]) ** 2
            + math.log10(f["storage.io_latency_us"] / TRUE["storage.io_latency_us"]) ** 2
            + (10 * (f["gpu.prefill_mfu"] - TRUE["gpu.prefill_mfu"])) ** 2
        )

    return objective


def test_the_search_finds_the_optimum_from_a_mis_set_start() -> None:
    calls: list[dict[str, float]] = []
    start = {"storage.read_bandwidth_gb_s": 1.0, "storage.io_latency_us": 20_000.0,
             "gpu.prefill_mfu": 0.9}  # fmt: skip
    got = fit(_bowl(calls), start, seed=3, max_evals=60)
    assert got.best_objective < got.start_objective / 100
    assert got.best["storage.read_bandwidth_gb_s"] == pytest.approx(21.25, rel=0.3)
    assert got.best["storage.io_latency_us"] == pytest.approx(300.0, rel=0.3)
    assert got.best["gpu.prefill_mfu"] == pytest.approx(0.45, abs=0.03)
    assert got.evaluations <= 60 and len(calls) <= 61  # the start is evaluated as given
    again = fit(_bowl([]), start, seed=3, max_evals=60)
    assert again == got  # seeded: the same search


def test_the_search_never_returns_worse_than_the_start() -> None:
    got = fit(_bowl([]), dict(TRUE), seed=0, max_evals=10)
    assert got.best == TRUE and got.best_objective == 0.0
    with pytest.raises(CalibrationError):
        fit(_bowl([]), dict(TRUE), max_evals=1)


def test_figures_map_onto_their_range_and_back() -> None:
    for f in FIGURES:
        for value in (f.low, f.high, (f.low + f.high) / 2):
            assert f.from_unit(f.to_unit(value)) == pytest.approx(value)
        assert f.to_unit(f.high * 10) == 1.0 and f.to_unit(f.low / 10) == 0.0


def test_held_back_points_are_seeded_and_leave_points_to_fit() -> None:
    assert hold_out(6, 2, seed=1) == hold_out(6, 2, seed=1)
    assert len(set(hold_out(6, 2, seed=1))) == 2 and all(0 <= i < 6 for i in hold_out(6, 2))
    assert {tuple(hold_out(6, 2, seed=s)) for s in range(10)} != {tuple(hold_out(6, 2))}
    assert default_hold_out(2) == 1 and default_hold_out(6) == 2
    with pytest.raises(CalibrationError, match="2 or more measured points"):
        hold_out(1, 1)
    with pytest.raises(CalibrationError, match="--hold-out 3"):
        hold_out(3, 3)


def test_calibrated_profiles_load_back(tmp_path: Path) -> None:
    gpu, storage = load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
    new_gpu, new_storage = apply_figures(gpu, storage, TRUE)
    assert figures_of(new_gpu, new_storage) == TRUE
    assert new_storage.write_bandwidth_gb_s == storage.write_bandwidth_gb_s  # not fitted
    (tmp_path / "s.yaml").write_text(profile_yaml("storage", new_storage, ["calibrated"]))
    (tmp_path / "g.yaml").write_text(profile_yaml("gpu", new_gpu, ["calibrated"]))
    assert load_storage(str(tmp_path / "s.yaml")) == new_storage
    assert load_gpu(str(tmp_path / "g.yaml")) == new_gpu
    with pytest.raises(KeyError):
        apply_figures(gpu, storage, {"gpu.memory_mib": 1.0})
