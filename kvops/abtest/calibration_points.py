"""Measured A/B points read back for calibration, and the prediction's score on them for any
profiles (`kvops advise --calibrate`; the search itself is `kvops.advise.calibrate`).

A point is one scenario of one finished ab-test run: a plain run directory gives one point
per scenario, a campaign directory (`--sweep`) one per measured point. For each, the run's own
files say everything the prediction needs (workload after --scale, options and seed, the
embedded engines' shape or real arms) and what was measured (results.json's deltas and
verdicts), so the same prediction `kvops ab-test` writes before a run can be made again with
other profiles and scored the same way (`kvops.abtest.prediction.score_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvops.abtest.campaign import CAMPAIGN_FILE, Campaign, is_campaign
from kvops.abtest.embedded import SimProfile
from kvops.abtest.experiment import Options
from kvops.abtest.prediction import (
    PredictionProfiles,
    arm_profiles,
    load_prediction,
    predict_deltas,
    score_run,
)
from kvops.abtest.result_types import Comparison, ResultsFormatError, RunResults
from kvops.abtest.rundir import RunDir
from kvops.abtest.score import MetricScore
from kvops.abtest.validity import HOST_OVERLOADED
from kvops.errors import KvopsError
from kvops.workload.spec import WorkloadSpec


class PointsError(KvopsError, ValueError):
    """A directory that holds no measured ab-test point (one line, exit code 2)."""


@dataclass(frozen=True)
class MeasuredPoint:
    label: str  # "<run dir> <scenario>"
    spec: WorkloadSpec
    arm_names: list[str]
    options: Options
    scale: float
    sim: SimProfile | None  # the embedded engines' profile; None for real arms
    comparisons: list[Comparison]
    profiles: PredictionProfiles | None  # what its run predicted from (None: older runs)

    def scores(self, profiles: PredictionProfiles) -> list[MetricScore]:
        """The prediction from `profiles` for this point, scored against its measurement."""
        prediction = predict_deltas(
            [self.spec], self.arm_names, self.options, profiles, self.sim, self.scale
        )
        score = score_run(prediction, {self.spec.name: self.comparisons})
        return [m for s in (score.scenarios.values() if score else ()) for m in s.metrics]


def run_points(path: Path) -> tuple[list[MeasuredPoint], list[str]]:
    """The points of one finished run directory (PointsError: not one, or nothing measured),
    and a note for each scenario left out because its verdicts were withheld: its simulated
    engines could not keep up (kvops.abtest.validity.HOST_OVERLOADED), so its deltas measured
    the host and would pull a calibration towards that host's contention."""
    results = path / "results.json"
    if not (path / "run.json").is_file() or not results.is_file():
        raise PointsError(f"{path}: not a finished kvops ab-test run (no run.json/results.json)")
    try:
        run, specs = RunDir(path).load_run()
        doc = RunResults.from_text(results.read_text(encoding="utf-8"))
        first = load_prediction(path)
        options = Options(**run.get("options", {}))
        sim = SimProfile(**run["sim"]) if run.get("embedded") and run.get("sim") else None
    except (KvopsError, OSError, TypeError, KeyError, ResultsFormatError) as exc:
        raise PointsError(f"{path}: cannot read this run ({exc})") from None
    if doc.status != "complete":
        raise PointsError(f"{path}: the run is {doc.status}, not complete: resume it first")
    arms = [str(a["name"]) for a in run["arms"]]
    out = []
    notes = []
    for spec in specs:
        sc = doc.scenarios.get(spec.name)
        if sc is None or len(arms) < 2:
            continue
        measured = [c for c in sc.comparisons if c.candidate_arm == arms[1]]
        if any(c.verdict == HOST_OVERLOADED for c in measured):  # also under "never engaged"
            notes.append(f"left out: {path} {spec.name}: {HOST_OVERLOADED}")
            continue
        if all(c.delta_pct is None for c in measured):
            continue
        out.append(
            MeasuredPoint(
                f"{path} {spec.name}", spec, arms, options, float(run.get("scale", 1.0)), sim,
                measured, first.profiles if first else None,
            )
        )  # fmt: skip
    return out, notes


def load_points(paths: list[Path]) -> tuple[list[MeasuredPoint], list[str]]:
    """Every measured point under the given run or campaign directories, in order, and a
    note for each point left out (a campaign point not finished, a scenario whose verdicts
    were withheld). A run directory given by itself must be complete."""
    out: list[MeasuredPoint] = []
    notes: list[str] = []
    for path in paths:
        if not path.is_dir():
            raise PointsError(f"{path}: no such run directory")
        if not is_campaign(path):
            points, withheld = run_points(path)
            out += points
            notes += withheld
            continue
        campaign = Campaign.load(path)
        found: list[MeasuredPoint] = []
        withheld_here = 0
        for sub in (path / campaign.sweep.point_dir(v) for v in campaign.sweep.values):
            try:
                points, withheld = run_points(sub)
            except PointsError as exc:
                notes.append(f"left out: {exc}")
                continue
            found += points
            notes += withheld
            withheld_here += len(withheld)
        if not found:
            why = f" ({withheld_here} left out, {HOST_OVERLOADED})" if withheld_here else ""
            raise PointsError(f"{path}: no point of this campaign ({CAMPAIGN_FILE}) finished{why}")
        out += found
    if not out:
        why = f" ({len(notes)} left out, {HOST_OVERLOADED})" if notes else ""
        raise PointsError("no measured point in " + ", ".join(str(p) for p in paths) + why)
    return out, notes


def start_profiles(points: list[MeasuredPoint]) -> PredictionProfiles:
    """The profiles the runs predicted from (the first point's), or, for runs older than
    predictions, the first embedded run's engine profiles."""
    for p in points:
        if p.profiles is not None:
            return p.profiles
    for p in points:
        if p.sim is not None:
            return arm_profiles(p.sim)
    raise PointsError(
        "these runs predate predictions (no prediction.json) and ran no embedded engines: "
        "no profile to start from"
    )
