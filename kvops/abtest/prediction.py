"""The simulator's prediction of an A/B, made before it runs (prediction.json in the run dir).

Why first: a prediction written after the measurement can be bent toward it without anyone
noticing; one written before the first request, with the profiles it came from, is a claim
the run then scores (`kvops.abtest.score`), and that `kvops advise --calibrate` can improve.

What is predicted: the whole experiment as it will run (same workload after --scale, same
ABBA segment order, warm-up, cache resets and prompt structure; `kvops.abtest.predict`
replays it through the pure model in virtual time) for the baseline and the first
candidate, as relative deltas of the compared metrics with the verdict each delta would read.
The model's costs come from the prediction profiles: the arms' own (`--sim-*`) unless
`--predict-gpu`/`--predict-storage` name others or `--storage-from-evidence` gives measured
storage. The engines' shape (GPU KV memory, GDS buffer, the KV capacity --scale shrinks) is
the embedded engines' for an embedded run, and the vllm_lmcache role's defaults (same KV
memory in both arms, 8 GiB GDS buffer) for real arms: the baseline is the first arm, the
candidate the second.

Token-id prompts of the model's vocabulary stand in for the server's own alphabet (the
prefix structure, not the ids, decides what the caches do). Rate mode is not replayed (its
arrivals are client-side timing): the prediction then says it is unavailable, and why.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.abtest.embedded import SimProfile
from kvops.abtest.experiment import Options
from kvops.abtest.metrics import COMPARED_METRICS, MIN_EFFECT_PCT, verdict_for
from kvops.abtest.predict import (
    FIDELITY_METRICS,
    CostProfiles,
    EmbeddedArm,
    embedded_arms,
    predict,
)
from kvops.abtest.result_types import ArmMetrics, Comparison
from kvops.abtest.score import PredictionScore, ScenarioScore, score_metrics
from kvops.errors import KvopsError
from kvops.sim.lmcache_config import DEFAULT_GDS_BUFFER_MIB, LMCacheSettings, gds_offload_keys
from kvops.sim.model import EngineSettings, shared_kv_memory_bytes
from kvops.sim.profiles import (
    GpuProfile,
    ModelProfile,
    StorageProfile,
    load_gpu,
    load_model,
    load_storage,
)
from kvops.workload.generate import Alphabet
from kvops.workload.spec import WorkloadSpec

PREDICTION_FILE = "prediction.json"
# The metrics predicted and scored: the figures the model's fidelity is judged on.
SCORED_METRICS = FIDELITY_METRICS
# Requests the model replays before a run at most (all scenarios, trials and both arms): at
# 1-2 ms of CPU each, a prediction must not hold the run up for more than about a minute.
MAX_PREDICTED_REQUESTS = 40_000


@dataclass(frozen=True)
class PredictionProfiles:
    """The profiles a prediction used, whole (a calibration starts from them), and how the
    storage figures were chosen."""

    model: ModelProfile
    gpu: GpuProfile
    storage: StorageProfile
    source: str = ""

    def costs(self) -> CostProfiles:
        return CostProfiles(self.model, self.gpu, self.storage)

    def describe(self) -> str:
        text = f"model {self.model.name}, GPU {self.gpu.name}, storage {self.storage.name}"
        return text + (f" ({self.source})" if self.source else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": dataclasses.asdict(self.model),
            "gpu": dataclasses.asdict(self.gpu),
            "storage": dataclasses.asdict(self.storage),
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PredictionProfiles:
        try:
            return cls(
                ModelProfile(**d["model"]),
                GpuProfile(**d["gpu"]),
                StorageProfile(**d["storage"]),
                str(d.get("source", "")),
            )
        except (KeyError, TypeError) as exc:
            raise PredictionFileError(f"profiles: {exc}") from None


class PredictionFileError(KvopsError, ValueError):
    """A prediction.json kvops did not write."""


def arm_profiles(sim: SimProfile, source: str = "the arms' profiles") -> PredictionProfiles:
    """The profiles the embedded engines run on (by name or YAML path): the default
    prediction profiles."""
    return PredictionProfiles(
        load_model(sim.model), load_gpu(sim.gpu), load_storage(sim.storage), source
    )


def predicted_verdict(delta_pct: float | None, higher_is_better: bool) -> str:
    """The verdict a deterministic prediction reads: helps/hurts beyond the smallest effect
    worth calling (as a measured verdict needs its whole interval there), else no difference."""
    if delta_pct is None:
        return "not enough data"
    return verdict_for(delta_pct, delta_pct, higher_is_better, MIN_EFFECT_PCT)


@dataclass
class ScenarioPrediction:
    baseline_arm: str
    candidate_arm: str
    # metric -> {"baseline": value, "candidate": value, "delta_pct": %, "verdict": str}
    metrics: dict[str, dict[str, Any]]

    def deltas(self) -> dict[str, tuple[float | None, str]]:
        return {m: (v.get("delta_pct"), str(v.get("verdict"))) for m, v in self.metrics.items()}


@dataclass
class RunPrediction:
    """prediction.json: the profiles, per scenario the predicted figures, deltas and verdicts
    (or why there is no prediction)."""

    profiles: PredictionProfiles
    scenarios: dict[str, ScenarioPrediction] = field(default_factory=dict)
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "profiles": self.profiles.to_json(),
            "unavailable": self.unavailable,
            "scenarios": {n: dataclasses.asdict(s) for n, s in self.scenarios.items()},
        }

    @classmethod
    def from_json(cls, d: Any) -> RunPrediction:
        if not isinstance(d, dict):
            raise PredictionFileError("prediction.json: not a mapping")
        try:
            scenarios = {n: ScenarioPrediction(**s) for n, s in d["scenarios"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise PredictionFileError(f"prediction.json: {exc}") from None
        return cls(PredictionProfiles.from_json(d["profiles"]), scenarios, d.get("unavailable"))


def load_prediction(run_dir: Path) -> RunPrediction | None:
    """The run's prediction.json (None when the run has none: runs before predictions)."""
    path = run_dir / PREDICTION_FILE
    if not path.is_file():
        return None
    try:
        return RunPrediction.from_json(json.loads(path.read_text(encoding="utf-8")))
    except ValueError as exc:
        raise PredictionFileError(f"{path}: {exc}") from None


def save_prediction(run_dir: Path, prediction: RunPrediction) -> None:
    (run_dir / PREDICTION_FILE).write_text(json.dumps(prediction.to_json(), indent=2) + "\n")


def _arm_settings(
    profiles: PredictionProfiles, sim: SimProfile | None, scale: float
) -> list[EmbeddedArm]:
    """The two engines as the model builds them: the embedded engines' own shape, or the
    vllm_lmcache role's (same KV memory in both arms, default GDS buffer, no CPU tier)."""
    if sim is not None:
        return embedded_arms(scale, sim)
    buffer_mib = DEFAULT_GDS_BUFFER_MIB
    kv = shared_kv_memory_bytes(profiles.model, profiles.gpu, buffer_mib)
    lm = LMCacheSettings(**gds_offload_keys(buffer_mib, 0.0), gds_path="(virtual)")  # type: ignore[arg-type]
    return [
        EmbeddedArm("baseline", EngineSettings(kv_cache_memory_bytes=kv)),
        EmbeddedArm("offload", EngineSettings(kv_cache_memory_bytes=kv, offload=True, lmcache=lm)),
    ]


def _metrics_of(base: ArmMetrics, cand: ArmMetrics) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for metric in SCORED_METRICS:
        b, c = base.value(metric), cand.value(metric)
        delta = (c - b) / b * 100.0 if b and c is not None else None
        out[metric] = {
            "baseline": b,
            "candidate": c,
            "delta_pct": delta,
            "verdict": predicted_verdict(delta, COMPARED_METRICS[metric]),
        }
    return out


def predict_deltas(
    scenarios: list[WorkloadSpec],
    arm_names: list[str],
    options: Options,
    profiles: PredictionProfiles,
    sim: SimProfile | None,
    scale: float,
) -> RunPrediction:
    """The prediction for a run about to start (`sim`: the embedded engines' profile; None
    for real arms). Pure computation: EngineError when the profiles leave no KV memory."""
    if len(arm_names) < 2:
        return RunPrediction(profiles, unavailable="fewer than two arms")
    replays = 2 * options.trials * sum(s.total_requests for s in scenarios)
    if replays > MAX_PREDICTED_REQUESTS:
        return RunPrediction(
            profiles,
            unavailable=f"{replays:,} requests to replay, more than the "
            f"{MAX_PREDICTED_REQUESTS:,} a prediction before the run may take",
        )
    arms = _arm_settings(profiles, sim, scale)
    alphabet = Alphabet.from_vocab_size(profiles.model.vocab_size)
    time_scale = sim.time_scale if sim is not None else 1.0
    full = predict(scenarios, arms, options, alphabet, profiles.costs(), time_scale)
    if full is None:
        return RunPrediction(profiles, unavailable="this run cannot be replayed in virtual time")
    out = RunPrediction(profiles)
    for name, by_arm in full.items():
        out.scenarios[name] = ScenarioPrediction(
            arm_names[0], arm_names[1], _metrics_of(by_arm["baseline"], by_arm["offload"])
        )
    return out


def score_run(
    prediction: RunPrediction, comparisons: Mapping[str, list[Comparison]]
) -> PredictionScore | None:
    """scenario -> its comparisons (as results.json) -> the prediction's score; None when
    nothing was predicted."""
    if prediction.unavailable is not None or not prediction.scenarios:
        return None
    out = PredictionScore(prediction.profiles.describe())
    for name, pred in prediction.scenarios.items():
        measured = {
            c.metric: (c.delta_pct, c.verdict)
            for c in comparisons.get(name, [])
            if c.candidate_arm == pred.candidate_arm
        }
        out.scenarios[name] = ScenarioScore(
            pred.baseline_arm, pred.candidate_arm, score_metrics(pred.deltas(), measured)
        )
    return out
