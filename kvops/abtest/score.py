"""How good was the prediction? Predicted against measured deltas, and verdict agreement.

Why a score at all: `kvops advise` tells an operator whether offload will pay before anything
is deployed. That advice is worth as much as the simulator's figures for the site (storage
read bandwidth, per-I/O latency, compute efficiency). Every A/B that was predicted first and
measured after says how far off the model was, in numbers that can be tracked and improved
(`kvops advise --calibrate`).

The score, per metric compared (offload against baseline):
- **error**: |predicted delta - measured delta|, in percentage points of the relative delta
  (a prediction of +40% against a measured +55% is 15 points off). Relative deltas, not raw
  figures, because the model's absolute figures carry the host's speed (embedded engines,
  `--sim-time-scale`) and a site's units; the delta is what the verdict is about.
- **verdict agreement**: whether the predicted verdict (the predicted delta beyond the smallest
  effect worth calling, `kvops.abtest.metrics.MIN_EFFECT_PCT`, in the better or worse
  direction; otherwise "no significant difference") equals the measured one. Only measured
  verdicts that are claims about the arms count (helps, hurts, no significant difference);
  "not enough trials" and the like are left out, and the count compared is always stated.

Over a run (or a campaign, or a calibration's held-back points) the score is the **mean
absolute error** of those deltas (`mean_abs_error_pp`) and the **share of verdicts that
agree** (`verdict_agreement_share`), each with how many figures it is over. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The measured verdicts a prediction can agree or disagree with (the others are not claims).
CLAIMS = ("helps", "hurts", "no significant difference")


@dataclass(frozen=True)
class MetricScore:
    """One metric of one scenario: predicted against measured, offload vs baseline."""

    metric: str
    predicted_delta_pct: float | None
    measured_delta_pct: float | None
    predicted_verdict: str
    measured_verdict: str

    @property
    def error_pp(self) -> float | None:
        if self.predicted_delta_pct is None or self.measured_delta_pct is None:
            return None
        return abs(self.predicted_delta_pct - self.measured_delta_pct)

    @property
    def verdicts_agree(self) -> bool | None:
        """None when the measured verdict is not a claim (see CLAIMS)."""
        if self.measured_verdict not in CLAIMS:
            return None
        return self.predicted_verdict == self.measured_verdict

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "predicted_delta_pct": self.predicted_delta_pct,
            "measured_delta_pct": self.measured_delta_pct,
            "error_pp": self.error_pp,
            "predicted_verdict": self.predicted_verdict,
            "measured_verdict": self.measured_verdict,
            "verdicts_agree": self.verdicts_agree,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MetricScore:
        return cls(
            str(d["metric"]),
            d.get("predicted_delta_pct"),
            d.get("measured_delta_pct"),
            str(d["predicted_verdict"]),
            str(d["measured_verdict"]),
        )


@dataclass(frozen=True)
class Score:
    """The summary over any set of metric scores."""

    mean_abs_error_pp: float | None
    deltas_compared: int
    verdict_agreement_share: float | None
    verdicts_compared: int

    def to_json(self) -> dict[str, Any]:
        return {
            "mean_abs_error_pp": self.mean_abs_error_pp,
            "deltas_compared": self.deltas_compared,
            "verdict_agreement_share": self.verdict_agreement_share,
            "verdicts_compared": self.verdicts_compared,
        }

    def text(self) -> str:
        """One line, e.g. "mean abs error 12.3 pp over 6 deltas; verdicts agree 4/6"."""
        if self.mean_abs_error_pp is None:
            err = "no delta to compare"
        else:
            err = (
                f"mean abs error {self.mean_abs_error_pp:.1f} pp over {self.deltas_compared} deltas"
            )
        if self.verdict_agreement_share is None:
            return err + "; no verdict to compare"
        agree = round(self.verdict_agreement_share * self.verdicts_compared)
        return f"{err}; verdicts agree {agree}/{self.verdicts_compared}"


def summarize(scores: Iterable[MetricScore]) -> Score:
    """Mean absolute error of the deltas and the share of agreeing verdicts (see the module)."""
    scores = list(scores)
    errors = [e for s in scores if (e := s.error_pp) is not None]
    agree = [a for s in scores if (a := s.verdicts_agree) is not None]
    return Score(
        sum(errors) / len(errors) if errors else None,
        len(errors),
        sum(agree) / len(agree) if agree else None,
        len(agree),
    )


def score_metrics(
    predicted: Mapping[str, tuple[float | None, str]],
    measured: Mapping[str, tuple[float | None, str]],
) -> list[MetricScore]:
    """metric -> (delta %, verdict), predicted and measured -> one score per metric both have,
    in the predicted metrics' order."""
    return [
        MetricScore(metric, p_delta, measured[metric][0], p_verdict, measured[metric][1])
        for metric, (p_delta, p_verdict) in predicted.items()
        if metric in measured
    ]


@dataclass
class ScenarioScore:
    baseline_arm: str
    candidate_arm: str
    metrics: list[MetricScore]

    @property
    def score(self) -> Score:
        return summarize(self.metrics)

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline_arm": self.baseline_arm,
            "candidate_arm": self.candidate_arm,
            **self.score.to_json(),
            "metrics": [m.to_json() for m in self.metrics],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ScenarioScore:
        return cls(
            str(d["baseline_arm"]),
            str(d["candidate_arm"]),
            [MetricScore.from_json(m) for m in d["metrics"]],
        )


@dataclass
class PredictionScore:
    """results.json `prediction_score`: what was predicted from which profiles, per scenario
    the predicted and measured deltas with their verdicts, and the run's score over all."""

    source: str  # the profiles the prediction used (kvops.abtest.prediction)
    scenarios: dict[str, ScenarioScore] = field(default_factory=dict)

    @property
    def score(self) -> Score:
        return summarize(m for s in self.scenarios.values() for m in s.metrics)

    def to_json(self) -> dict[str, Any]:
        return {
            "definition": DEFINITION,
            "source": self.source,
            **self.score.to_json(),
            "scenarios": {name: s.to_json() for name, s in self.scenarios.items()},
        }

    @classmethod
    def from_json(cls, d: Any) -> PredictionScore:
        if not isinstance(d, dict) or not isinstance(d.get("scenarios"), dict):
            raise ValueError("prediction_score must be a mapping with scenarios")
        return cls(
            str(d.get("source", "")),
            {n: ScenarioScore.from_json(s) for n, s in d["scenarios"].items()},
        )


DEFINITION = (
    "per metric, |predicted - measured| relative delta of offload vs baseline in percentage "
    "points; mean_abs_error_pp is their mean, verdict_agreement_share the share of measured "
    "helps/hurts/no-significant-difference verdicts the prediction matched"
)
