"""`kvops advise --calibrate RUNDIR...` (also `kvops advise calibrate`): refit a site's uncertain
profile figures from measured A/B points and say, in numbers, how much the fit improved the
prediction on points it was not fitted on.

Thin: the points and their scores come from `kvops.abtest.calibration_points`, the search from
`kvops.advise.calibrate`; this module wires the two (neither package imports the other),
prints the report and writes the calibrated profiles.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kvops.abtest.calibration_points import MeasuredPoint, load_points, start_profiles
from kvops.abtest.prediction import PredictionProfiles
from kvops.abtest.score import Score, summarize
from kvops.advise.calibrate import (
    FIGURES,
    apply_figures,
    default_hold_out,
    figures_of,
    fit,
    hold_out,
    profile_yaml,
)
from kvops.sim.profiles import load_gpu, load_storage


@dataclass
class Calibration:
    start: PredictionProfiles
    calibrated: PredictionProfiles
    fitted_on: list[str]
    held_back: list[str]
    before_fit: Score
    after_fit: Score
    before_held: Score
    after_held: Score
    figures_before: dict[str, float]
    figures_after: dict[str, float]
    evaluations: int

    def to_json(self) -> dict[str, Any]:
        return {
            "fitted_on": self.fitted_on,
            "held_back": self.held_back,
            "figures_before": self.figures_before,
            "figures_after": self.figures_after,
            "score_held_back_before": self.before_held.to_json(),
            "score_held_back_after": self.after_held.to_json(),
            "score_fitted_before": self.before_fit.to_json(),
            "score_fitted_after": self.after_fit.to_json(),
            "evaluations": self.evaluations,
        }


def _score(points: list[MeasuredPoint], profiles: PredictionProfiles) -> Score:
    return summarize(m for p in points for m in p.scores(profiles))


def _with(start: PredictionProfiles, figures: dict[str, float], source: str) -> PredictionProfiles:
    gpu, storage = apply_figures(start.gpu, start.storage, figures)
    return PredictionProfiles(start.model, gpu, storage, source)


def calibrate(
    points: list[MeasuredPoint], start: PredictionProfiles, held: int, seed: int, max_evals: int
) -> Calibration:
    back = hold_out(len(points), held, seed)
    fit_on = [p for i, p in enumerate(points) if i not in back]
    held_pts = [points[i] for i in back]

    def objective(figures: dict[str, float]) -> float:
        err = _score(fit_on, _with(start, figures, "")).mean_abs_error_pp
        return float("inf") if err is None else err

    result = fit(objective, figures_of(start.gpu, start.storage), FIGURES, seed, max_evals)
    calibrated = _with(start, result.best, "calibrated by kvops advise --calibrate")
    return Calibration(
        start, calibrated, [p.label for p in fit_on], [p.label for p in held_pts],
        _score(fit_on, start), _score(fit_on, calibrated),
        _score(held_pts, start), _score(held_pts, calibrated),
        result.start, result.best, result.evaluations,
    )  # fmt: skip


def report_lines(c: Calibration, written: list[Path]) -> list[str]:
    out = [f"calibrated from {c.start.describe()}, {len(c.fitted_on)} point(s) fitted on:"]
    out += [f"  {label}" for label in c.fitted_on]
    out += ["held back (not fitted on):"] + [f"  {label}" for label in c.held_back]
    out += ["figures:"]
    for name, before in c.figures_before.items():
        out.append(f"  {name}: {before:.4g} -> {c.figures_after[name]:.4g}")
    out += [
        f"score on the held-back points: before {c.before_held.text()}",
        f"                               after  {c.after_held.text()}",
        f"score on the fitted points:    before {c.before_fit.text()}",
        f"                               after  {c.after_fit.text()}",
        f"({c.evaluations} evaluations; error = mean |predicted - measured| relative delta of "
        "throughput, mean TTFT and mean ITL, percentage points)",
    ]
    if written:
        out += ["calibrated profiles (pass back as `kvops advise ... --gpu G --storage S`, "
                "`kvops ab-test ... --predict-gpu G --predict-storage S`):"]  # fmt: skip
        out += [f"  {p}" for p in written]
    return out


def write_profiles(c: Calibration, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    note = [
        "Written by kvops advise --calibrate: the uncertain figures refitted to measured A/B",
        f"points ({len(c.fitted_on)} fitted on, {len(c.held_back)} held back).",
        f"Held-back score before: {c.before_held.text()}",
        f"Held-back score after:  {c.after_held.text()}",
    ]
    gpu_path, storage_path = out / "gpu.yaml", out / "storage.yaml"
    gpu = dataclasses.replace(c.calibrated.gpu, name=f"{c.start.gpu.name}-calibrated")
    storage = dataclasses.replace(c.calibrated.storage, name=f"{c.start.storage.name}-calibrated")
    gpu_path.write_text(profile_yaml("gpu", gpu, [f"Calibrated from {c.start.gpu.name}.", *note]))
    storage_path.write_text(
        profile_yaml("storage", storage, [f"Calibrated from {c.start.storage.name}.", *note])
    )
    (out / "calibration.json").write_text(json.dumps(c.to_json(), indent=2) + "\n")
    return [gpu_path, storage_path, out / "calibration.json"]


@click.command("calibrate")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--hold-out", "held", type=click.IntRange(1), default=None,
    help="Points held back from the fit and scored on [default: a third, at least one].",
)  # fmt: skip
@click.option(
    "--seed", type=click.IntRange(0), default=0, show_default=True,
    help="Seeds which points are held back and the search's random sample.",
)  # fmt: skip
@click.option(
    "--max-evals", type=click.IntRange(2), default=48, show_default=True,
    help="Evaluations of the fit's objective (each predicts every fitted point once).",
)  # fmt: skip
@click.option(
    "--gpu", default=None, help="Starting GPU profile [default: the runs' prediction profiles]."
)
@click.option("--storage", default=None, help="Starting storage profile [default: as --gpu].")
@click.option(
    "--out", type=click.Path(path_type=Path, file_okay=False), default=Path("calibrated"),
    show_default=True, help="Where gpu.yaml, storage.yaml and calibration.json go.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print calibration.json's content.")
def calibrate_command(
    run_dirs: tuple[Path, ...],
    held: int | None,
    seed: int,
    max_evals: int,
    gpu: str | None,
    storage: str | None,
    out: Path,
    as_json: bool,
) -> None:
    """Refit storage read bandwidth, per-I/O latency and prefill MFU from measured runs.

    RUN_DIRS are finished `kvops ab-test` run or campaign (--sweep) directories. Some points
    are held back (seeded; they are named), the figures are fitted on the others, and the
    prediction's score (kvops.abtest.score) is reported before and after on both.

    \b
      kvops advise --calibrate runs/campaign1 runs/campaign2 --out site-profiles
      kvops advise multi-shared-prefix --gpu site-profiles/gpu.yaml \\
          --storage site-profiles/storage.yaml
    """
    points, notes = load_points(list(run_dirs))  # PointsError: exit 2, one line
    for note in notes:
        click.echo(f"warning: {note}", err=True)
    start = start_profiles(points)
    if gpu is not None or storage is not None:  # ProfileError: exit 2, one line
        start = PredictionProfiles(
            start.model,
            load_gpu(gpu) if gpu else start.gpu,
            load_storage(storage) if storage else start.storage,
            "given to --calibrate",
        )
    result = calibrate(points, start, held or default_hold_out(len(points)), seed, max_evals)
    written = write_profiles(result, out)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    click.echo("\n".join(report_lines(result, written)))
