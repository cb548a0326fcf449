"""Campaigns: one A/B per operating point (`kvops ab-test --sweep num_prefixes=5,10,20`), and
where offload starts to pay.

Why: whether offload pays depends on the operating point (load, number and length of shared
prefixes, output length); one A/B answers one point, operators need the crossover. Each point
is a complete ab-test run (ABBA within the point, its own verdicts with CIs and
preconditions) in a sub-directory of the campaign's run directory, so a point is measured once:
`--resume` skips the points whose run completed and resumes the one that was interrupted after
its last complete segment (kvops.abtest.rundir), never measuring a segment twice.

The crossover is the smallest swept value from which every larger value reads "helps" on the
primary metric (total token throughput), bracketed by the value before it (the true crossover
lies between the two: its uncertainty at this grid); "none in range" when the largest value
does not read "helps". The parameters are the workload's (`rate`, `max_concurrency`,
`num_prefixes`, `prefix_tokens`, `output_tokens`); token lengths are swept before `--scale`
shrinks them, as the presets are.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.abtest.experiment import Hooks
from kvops.abtest.metrics import PRIMARY_METRIC
from kvops.abtest.result_types import ResultsFormatError, RunResults
from kvops.abtest.score import Score
from kvops.abtest.session import AbTestRequest, prepare, run_ab_test
from kvops.abtest.validity import HOST_OVERLOADED
from kvops.errors import KvopsError
from kvops.workload.spec import WorkloadSpec, WorkloadSpecError, spec_from_dict

SWEEPABLE = ("rate", "max_concurrency", "num_prefixes", "prefix_tokens", "output_tokens")
INTEGER = ("max_concurrency", "num_prefixes", "prefix_tokens", "output_tokens")
CAMPAIGN_FILE = "campaign.json"


class CampaignError(KvopsError, ValueError):
    """A sweep that cannot run as written (exit code 2)."""


@dataclass(frozen=True)
class Sweep:
    param: str
    values: tuple[float, ...]

    def label(self, value: float) -> str:
        return f"{value:g}"

    def point_dir(self, value: float) -> str:
        return f"{self.param}={self.label(value)}"


def parse_sweep(text: str) -> Sweep:
    """`num_prefixes=5,10,20` -> Sweep; distinct values sorted ascending."""
    param, sep, values = text.partition("=")
    param = param.strip()
    if not sep or param not in SWEEPABLE:
        raise CampaignError(
            f"--sweep {text!r}: expected PARAM=V1,V2,... with PARAM one of {', '.join(SWEEPABLE)}"
        )
    try:
        parsed = sorted({float(v) for v in values.split(",") if v.strip()})
    except ValueError:
        raise CampaignError(f"--sweep {text!r}: values must be numbers") from None
    if len(parsed) < 2:
        raise CampaignError(f"--sweep {text!r}: give two or more values")
    if param in INTEGER and any(v != int(v) or v < 1 for v in parsed):
        raise CampaignError(f"--sweep {param}: values must be positive integers")
    if any(v <= 0 or math.isnan(v) for v in parsed):
        raise CampaignError(f"--sweep {param}: values must be positive")
    return Sweep(param, tuple(parsed))


def point_spec(spec: WorkloadSpec, sweep: Sweep, value: float) -> WorkloadSpec:
    """The workload at one point (before --scale), checked like a spec file; the name carries
    the point so the sub-run's reports say which it is."""
    data = spec.to_dict()
    data[sweep.param] = int(value) if sweep.param in INTEGER else value
    data["name"] = f"{spec.name}@{sweep.point_dir(value)}"
    try:
        return spec_from_dict(data, f"--sweep {sweep.param}={sweep.label(value)}")
    except WorkloadSpecError as exc:
        raise CampaignError(str(exc)) from None


@dataclass
class PointResult:
    value: float
    run_dir: str
    status: str  # complete | interrupted | ... | pending
    verdict: str | None = None
    delta_pct: float | None = None
    ci95_low_pct: float | None = None
    ci95_high_pct: float | None = None
    working_set_tokens: int | None = None
    gpu_kv_capacity_tokens: int | None = None
    verdict_note: str | None = None
    # the prediction written before the point ran, scored after (kvops.abtest.score)
    predicted_delta_pct: float | None = None  # primary metric
    prediction_error_pp: float | None = None  # mean abs error over the point's scored deltas
    prediction_deltas: int = 0
    prediction_verdicts_agree: int = 0
    prediction_verdicts: int = 0


@dataclass
class Crossover:
    value: float | None  # the smallest value from which offload helps; None: none in range
    after: float | None  # the largest value below it (the crossover lies in (after, value])
    text: str


def point_result(value: float, run_dir: Path) -> PointResult:
    """A point as its sub-run's results.json says (pending when it has none)."""
    path = run_dir / "results.json"
    if not path.is_file():
        return PointResult(value, str(run_dir), "pending")
    try:
        doc = RunResults.from_text(path.read_text(encoding="utf-8"))
    except (ResultsFormatError, OSError) as exc:
        raise CampaignError(f"{path}: {exc}") from None
    (sc,) = doc.scenarios.values()
    cand = doc.arm_names[1] if len(doc.arm_names) > 1 else None
    c = sc.comparison(PRIMARY_METRIC, cand)
    checks = sc.checks
    point = PointResult(
        value, str(run_dir), doc.status, sc.verdict,
        c.delta_pct if c else None, c.ci95_low_pct if c else None,
        c.ci95_high_pct if c else None,
        checks.working_set_tokens if checks else None,
        checks.gpu_kv_capacity_tokens if checks else None,
        checks.verdict_note if checks else None,
    )  # fmt: skip
    scored = doc.prediction_score.scenarios if doc.prediction_score else {}
    if scored:
        (sc_score,) = scored.values()
        s = sc_score.score
        point.prediction_error_pp, point.prediction_deltas = s.mean_abs_error_pp, s.deltas_compared
        point.prediction_verdicts = s.verdicts_compared
        point.prediction_verdicts_agree = round(
            (s.verdict_agreement_share or 0) * s.verdicts_compared
        )
        point.predicted_delta_pct = next(
            (m.predicted_delta_pct for m in sc_score.metrics if m.metric == PRIMARY_METRIC), None
        )
    return point


def campaign_score(points: list[PointResult]) -> Score | None:
    """The prediction's score over every scored point (as `kvops.abtest.score.summarize`
    would give over all their deltas): the error weighted by each point's deltas."""
    scored = [p for p in points if p.prediction_deltas and p.prediction_error_pp is not None]
    verdicts = sum(p.prediction_verdicts for p in points)
    if not scored and not verdicts:
        return None
    deltas = sum(p.prediction_deltas for p in scored)
    error = sum((p.prediction_error_pp or 0.0) * p.prediction_deltas for p in scored)
    agree = sum(p.prediction_verdicts_agree for p in points)
    return Score(
        error / deltas if deltas else None, deltas, agree / verdicts if verdicts else None, verdicts
    )


def find_crossover(sweep: Sweep, points: list[PointResult]) -> Crossover:
    """Pure: the smallest measured value from which every larger measured value helps."""
    measured = sorted((p for p in points if p.verdict is not None), key=lambda p: p.value)
    if not measured:
        return Crossover(None, None, "no point measured yet")
    first: PointResult | None = None
    for p in reversed(measured):
        if p.verdict != "helps":
            break
        first = p
    if first is None:
        largest = measured[-1]
        if largest.verdict == HOST_OVERLOADED:  # unknown there, not "does not help"
            return Crossover(
                None, None,
                f"unknown: the verdict at {sweep.param} = {sweep.label(largest.value)}, the "
                f"largest value measured, was {HOST_OVERLOADED}",
            )  # fmt: skip
        return Crossover(
            None, None,
            f"none in range: offload does not help at {sweep.param} = "
            f"{sweep.label(largest.value)}, the largest value measured",
        )  # fmt: skip
    before = [p for p in measured if p.value < first.value]
    if before and before[-1].verdict == HOST_OVERLOADED:  # it may help there too: unbracketed
        return Crossover(
            first.value, None,
            f"offload helps from {sweep.param} = {sweep.label(first.value)} on; the verdict at "
            f"{sweep.label(before[-1].value)} was {HOST_OVERLOADED}, so the crossover is at or "
            "below it",
        )  # fmt: skip
    if not before:
        return Crossover(
            first.value, None,
            f"offload helps at every measured {sweep.param}, from "
            f"{sweep.label(first.value)} (the smallest measured: the crossover is at or below it)",
        )  # fmt: skip
    after = before[-1]
    return Crossover(
        first.value, after.value,
        f"offload starts to help between {sweep.param} = {sweep.label(after.value)} "
        f"({after.verdict}) and {sweep.label(first.value)} (helps)",
    )  # fmt: skip


def _capacity_split(points: list[PointResult]) -> tuple[list[PointResult], list[PointResult]]:
    """(the points whose working set and GPU KV capacity are known, by value; those of them
    whose working set outgrows the capacity)."""
    known = sorted(
        (p for p in points if p.working_set_tokens is not None and p.gpu_kv_capacity_tokens),
        key=lambda p: p.value,
    )
    over = [p for p in known if (p.working_set_tokens or 0) > (p.gpu_kv_capacity_tokens or 0)]
    return known, over


def capacity_crossing(sweep: Sweep, points: list[PointResult]) -> str | None:
    """Where the workload's working set outgrows the GPU KV capacity over the sweep (the
    preconditions' figures), to read beside the crossover: offload can only pay beyond it."""
    known, over = _capacity_split(points)
    if not known:
        return None
    if not over:
        return f"the working set fits the GPU KV capacity at every measured {sweep.param}"
    first = over[0]
    below = [p for p in known if p.value < first.value]
    where = (
        f"between {sweep.param} = {sweep.label(below[-1].value)} and {sweep.label(first.value)}"
        if below
        else f"at {sweep.param} = {sweep.label(first.value)} already"
    )
    about = (
        f"; at about {sweep.param} = {_crossing(below[-1], first):.3g}, linear between the two"
        if below
        else ""
    )
    return (
        f"the working set outgrows the GPU KV capacity {where} ({first.working_set_tokens:,} > "
        f"{first.gpu_kv_capacity_tokens:,} tokens{about})"
    )


def capacity_bracket(points: list[PointResult]) -> tuple[float | None, float] | None:
    """(last measured value whose working set fits, first that outgrows the GPU KV capacity);
    None when none outgrows it (or nothing is known)."""
    known, over = _capacity_split(points)
    if not over:
        return None
    below = [p.value for p in known if p.value < over[0].value]
    return (below[-1] if below else None, over[0].value)


def crossover_vs_capacity(
    sweep: Sweep, crossover: Crossover | None, points: list[PointResult]
) -> str | None:
    """Does offload start to pay where the working set outgrows the GPU KV capacity? The
    crossover's bracket against the capacity's, on the sweep's grid (None: nothing to compare)."""
    cap = capacity_bracket(points)
    if crossover is None or crossover.value is None or cap is None:
        return None
    if (crossover.after, crossover.value) == cap:
        return (
            "the crossover and the capacity crossing fall between the same two points: offload "
            "starts to pay where the working set outgrows the GPU KV capacity"
        )
    if crossover.value <= (cap[0] if cap[0] is not None else cap[1]):
        return (
            f"offload helps already at {sweep.param} = {sweep.label(crossover.value)}, before "
            "the working set outgrows the GPU KV capacity: something else than reuse beyond "
            "GPU memory differs between the arms"
        )
    return (
        f"offload starts to help only above {sweep.param} = {sweep.label(cap[1])}, where the "
        "working set has already outgrown the GPU KV capacity: loading costs part of the gain"
    )


def _crossing(fits: PointResult, over: PointResult) -> float:
    """Where working set minus capacity crosses zero, linear between two measured points."""
    g_fits = (fits.working_set_tokens or 0) - (fits.gpu_kv_capacity_tokens or 0)
    g_over = (over.working_set_tokens or 0) - (over.gpu_kv_capacity_tokens or 0)
    return fits.value + (over.value - fits.value) * -g_fits / (g_over - g_fits)


@dataclass
class Campaign:
    """campaign.json: what the campaign sweeps, and (after each point) what it found."""

    sweep: Sweep
    spec: WorkloadSpec  # the unscaled workload the sweep varies
    scale: float
    seed: int | None
    points: list[PointResult] = field(default_factory=list)
    crossover: Crossover | None = None
    capacity: str | None = None  # capacity_crossing's sentence
    agreement: str | None = None  # crossover_vs_capacity's sentence
    prediction: Score | None = None  # the prediction's score over the scored points

    def to_json(self) -> dict[str, Any]:
        return {
            "param": self.sweep.param,
            "values": list(self.sweep.values),
            "workload": self.spec.to_dict(),
            "scale": self.scale,
            "seed": self.seed,
            "points": [dataclasses.asdict(p) for p in self.points],
            "crossover": dataclasses.asdict(self.crossover) if self.crossover else None,
            "gpu_capacity": self.capacity,
            "crossover_vs_capacity": self.agreement,
            "prediction_score": self.prediction.to_json() if self.prediction else None,
        }

    @classmethod
    def load(cls, directory: Path) -> Campaign:
        path = directory / CAMPAIGN_FILE
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            spec = spec_from_dict(d["workload"], f"{path} workload")
            return cls(Sweep(d["param"], tuple(d["values"])), spec, float(d["scale"]), d["seed"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CampaignError(f"{path}: not a kvops campaign ({exc})") from None

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CAMPAIGN_FILE).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def is_campaign(directory: Path) -> bool:
    return (directory / CAMPAIGN_FILE).is_file()


def campaign_markdown(c: Campaign) -> str:
    """campaign.md: per point the paired delta with its CI, the verdict and what is said
    beside it, the working set against GPU KV capacity; then the crossover."""
    p_ = c.sweep.param
    out = [
        f"# kvops ab-test campaign: {c.spec.name} over {p_}",
        "",
        f"Each point is an ABBA A/B of its own (sub-run linked); primary metric {PRIMARY_METRIC}.",
        "",
        f"| {p_} | verdict | Δ throughput | 95% CI | predicted Δ | prediction error "
        "| working set / GPU KV tokens | run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in c.points:
        delta = "—" if p.delta_pct is None else f"{p.delta_pct:+.1f}%"
        ci = (
            "—" if p.ci95_low_pct is None or p.ci95_high_pct is None
            else f"[{p.ci95_low_pct:+.1f}%, {p.ci95_high_pct:+.1f}%]"
        )  # fmt: skip
        fit = (
            f"{p.working_set_tokens:,} / {p.gpu_kv_capacity_tokens:,}"
            if p.working_set_tokens is not None and p.gpu_kv_capacity_tokens is not None
            else "—"
        )
        verdict = (p.verdict or p.status) + (f" ({p.verdict_note})" if p.verdict_note else "")
        name = Path(p.run_dir).name
        link = f"[{name}]({name}/report.md)"
        pred = "—" if p.predicted_delta_pct is None else f"{p.predicted_delta_pct:+.1f}%"
        err = point_error_text(p)
        out.append(
            f"| {c.sweep.label(p.value)} | {verdict} | {delta} | {ci} | {pred} | {err} | {fit} "
            f"| {link} |"
        )
    if c.crossover is not None:
        out += ["", f"**Crossover**: {c.crossover.text}."]
    if c.capacity:
        out += ["", f"**GPU memory**: {c.capacity}."]
    if c.agreement:
        out += ["", f"**Crossover vs GPU memory**: {c.agreement}."]
    if c.prediction is not None:
        out += [
            "",
            f"**Prediction** (written before each point ran; {SCORE_NOTE}): {c.prediction.text()}.",
        ]
    return "\n".join(out) + "\n"


SCORE_NOTE = (
    "error = |predicted - measured| delta of throughput, mean TTFT and mean ITL, in percentage "
    "points"
)


def point_error_text(p: PointResult) -> str:
    """A point's prediction error and verdict agreement, e.g. "12.3 pp, 2/3 agree"."""
    if p.prediction_error_pp is None:
        return "—"
    agree = f"{p.prediction_verdicts_agree}/{p.prediction_verdicts} agree"
    return f"{p.prediction_error_pp:.1f} pp, {agree}"


DONE_STATUSES = ("complete", "invalid")  # measured to the end (invalid: an arm broke)


@dataclass
class CampaignOutcome:
    campaign: Campaign
    interrupted: bool


def run_campaign(
    req: AbTestRequest, campaign: Campaign, hooks: Hooks, resume: bool = False
) -> CampaignOutcome:
    """Run (or resume) every point not yet measured to its end, then write campaign.json and
    campaign.md. A new campaign refuses an existing one in `req.out` unless overwriting."""
    root = req.out
    if not resume:
        if is_campaign(root) and not req.overwrite:
            raise CampaignError(f"{root} holds a campaign: --resume {root} or --overwrite")
        if root.is_dir() and any(root.iterdir()) and not req.overwrite:
            raise CampaignError(f"{root} is not empty: choose another --out or --overwrite")
        if req.overwrite and root.exists():
            shutil.rmtree(root)
        if campaign.seed is None:
            campaign.seed = req.seed if req.seed is not None else secrets.randbits(32)
        campaign.save(root)
    else:
        req = _settings_of_a_started_point(root, campaign)
    interrupted = False
    points: list[PointResult] = []
    for value in campaign.sweep.values:
        sub_dir = root / campaign.sweep.point_dir(value)
        found = point_result(value, sub_dir)
        if interrupted or found.status in DONE_STATUSES:
            points.append(found)
            continue
        spec = point_spec(campaign.spec, campaign.sweep, value).scaled(campaign.scale)
        started = (sub_dir / "run.json").is_file()
        sub = dataclasses.replace(
            req, out=sub_dir, scenarios=[spec], seed=campaign.seed, resume=started,
            overwrite=False,
        )  # fmt: skip
        hooks.on_segment(f"campaign point {campaign.sweep.point_dir(value)}")
        outcome = run_ab_test(sub, hooks)
        points.append(point_result(value, sub_dir))
        interrupted = outcome.interrupted
    campaign.points = points
    campaign.crossover = find_crossover(campaign.sweep, points)
    campaign.capacity = capacity_crossing(campaign.sweep, points)
    campaign.agreement = crossover_vs_capacity(campaign.sweep, campaign.crossover, points)
    campaign.prediction = campaign_score(points)
    campaign.save(root)
    (root / "campaign.md").write_text(campaign_markdown(campaign))
    return CampaignOutcome(campaign, interrupted)


def _settings_of_a_started_point(root: Path, campaign: Campaign) -> AbTestRequest:
    """The run settings (arms, options, engines, deploy) of the campaign, read back from a
    point that was started (its run.json), for the points not started yet."""
    for value in campaign.sweep.values:
        sub_dir = root / campaign.sweep.point_dir(value)
        if (sub_dir / "run.json").is_file():
            req = AbTestRequest(out=sub_dir, resume=True)
            prepare(req)
            return dataclasses.replace(req, resume=False)
    raise CampaignError(
        f"{root}: no point of this campaign was started; start it again with --overwrite"
    )
