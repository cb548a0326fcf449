"""The ab-test results document (results.json, schema version 1) as types, and its one JSON
reader and writer.

Why types: the figures travel from `kvops.abtest.metrics` through `kvops.abtest` into
`kvops.report`; as nested dicts read by string keys a misspelt key reads as a missing figure
and shows as "—". As dataclasses (the shape of vLLM's `BenchmarkMetrics` in
vllm/benchmarks/serve.py) a wrong name fails type checking. `to_json` is the only place that
decides the document's keys and their order, `from_json` the only place that reads them back;
`to_text` is the file's (and `--json`'s) exact bytes. The document stays byte-compatible with
what kvops wrote before these types existed (tests/unit/test_result_types.py round-trips one
such file).

Schema (versioned; additions only within a version):

  schema_version: 1
  status: complete | interrupted | incomplete | invalid (an arm's measured requests failed
          beyond 1%: its verdicts read "invalid: N errors")
  status_detail: str                 (which arm broke, how many requests, from when; "" if none)
  arms: [{name, url, version, models, max_model_len, cache_config}]     (latest attempt)
  embedded_engines: bool, options: {the run's options}, warnings: [str]
  scenarios: {<preset or custom>: {
      workload: {spec},
      verdict: helps | hurts | no significant difference | not enough data | not enough trials
               | invalid: N errors | offload never engaged                        (first candidate)
      arms: {<arm>: {metrics: {completed, errors, duration_s, total_input_tokens,
                               total_output_tokens, request_throughput_req_s,
                               output_throughput_tok_s, total_token_throughput_tok_s,
                               [request_goodput_req_s (with an SLO)],
                               mean|std|median|p90|p99 _ ttft|tpot|itl|e2el _ms,
                               cached_token_share (None = not reported)},
                     errors_total, errors_by_reason, warmup_requests, per_iteration, per_batch,
                     [engine_emission_lag_mean_ms (simulated engines only)],
                     [instances: [{url, requests, errors, mean_ttft_ms, median_ttft_ms,
                                   gpu_hit_tokens, offload_hit_tokens, stored_tokens,
                                   cross_instance_hit_tokens, cross_instance_hit_share}],
                      cross_instance_hit_share (an arm of several URLs only;
                      kvops.abtest.fleet_figures)],
                     [failed_loads: {failed_loads (at least), sources, requests_recomputed,
                                     tokens_recomputed, requests_failed, lmcache_short_retrieves,
                                     lmcache_read_errors, lmcache_failed_gets, per_trial:
                                     [{trial, failed_loads}], examples, log_errors}
                      (arms with a service log or LMCache's failed-get counter;
                       kvops.abtest.failed_loads)]}},
      comparisons: [{metric, baseline_arm, candidate_arm, baseline, candidate (values),
                     delta_pct, ci95_low_pct, ci95_high_pct, verdict (as the scenario's, or
                     "too few requests (N per trial; <pXX metric> needs M)"), higher_is_better,
                     resample_unit ("paired trials (N)"), [caveat (beside the verdict)]}],
      [checks: {preconditions: [{check, arm, status, message}],       (kvops.abtest.validity)
                token_sources: {<arm>: {looked_up_tokens, gpu_cache_tokens, offload_tokens,
                                computed_tokens, stored_tokens, by_source}},
                verdict ("offload never engaged" | null), verdict_note, caveats,
                working_set_tokens, gpu_kv_capacity_tokens, nothing_loaded (candidate arms
                with a connector that loaded no KV: their "helps" read "no gain from offload:
                nothing loaded")}]}}
  client: {dispatch_lag_mean_ms, dispatch_lag_p99_ms, dispatch_lag_max_ms, loop_lag_mean_ms,
           loop_lag_p99_ms, max_in_flight, workers, ttft_error_share, bottleneck,
           bottleneck_reason}
  model_prediction: {<scenario>: {<arm>: {total_token_throughput_tok_s, mean_ttft_ms,
                     mean_itl_ms}}}      (embedded engines only: the model in virtual time)
  prediction_score: {definition, source (the prediction's profiles), mean_abs_error_pp,
                     deltas_compared, verdict_agreement_share, verdicts_compared,
                     scenarios: {<scenario>: {baseline_arm, candidate_arm, mean_abs_error_pp,
                       deltas_compared, verdict_agreement_share, verdicts_compared,
                       metrics: [{metric, predicted_delta_pct, measured_delta_pct, error_pp,
                                  predicted_verdict, measured_verdict, verdicts_agree}]}}}
                     (runs whose prediction.json was written before they ran; kvops.abtest.score)
  deploy: {limit, inventories, clear_gds_dir, extra_vars,            (--deploy runs only; redacted)
           outcomes: [{index, arm, variant, status, rc, started_at, duration_s, changed_tasks,
                       error}],
           arms: {<arm>: {variant, deploys, failed, last_status,
                          deployed: {<host>: {install_method, image, vllm_version,
                                     lmcache_version_installed, lmcache_version_configured,
                                     packages, service, lmcache_config, kv_transfer_config,
                                     exec_start, environment}}}}}
           (built by kvops.abtest.deploy_summary and carried here as that JSON, not yet typed)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvops.abtest.failed_loads import FailedLoads
from kvops.abtest.score import PredictionScore
from kvops.abtest.validity import ScenarioChecks
from kvops.errors import KvopsError
from kvops.workload.spec import WorkloadSpec, WorkloadSpecError, spec_from_dict

SCHEMA_VERSION = 1
Json = dict[str, Any]


class ResultsFormatError(KvopsError, ValueError):
    """A results document that is not schema version 1 as kvops writes it."""


def _fields(obj: Any, skip: tuple[str, ...] = ()) -> Json:
    """The dataclass's own fields in declaration order (which is the document's key order)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in skip}


def _exact(d: Any, required: tuple[str, ...], where: str, optional: tuple[str, ...] = ()) -> Json:
    """`d` as a mapping holding every required key, maybe the optional ones, and nothing else."""
    if not isinstance(d, dict):
        raise ResultsFormatError(f"results document: {where} must be a mapping")
    missing = [k for k in required if k not in d]
    unknown = sorted(set(d) - set(required) - set(optional))
    if missing or unknown:
        raise ResultsFormatError(
            f"results document: {where}: missing keys {missing}, unknown keys {unknown}"
        )
    return d


def _names(cls: type, skip: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in skip)


@dataclass
class ArmMetrics:
    """One arm's serving figures over its measured requests (`vllm bench serve` definitions;
    see kvops.abtest.metrics). None means "no request gave this figure", never zero."""

    completed: int
    errors: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput_req_s: float | None
    output_throughput_tok_s: float | None
    total_token_throughput_tok_s: float | None
    request_goodput_req_s: float | None
    mean_ttft_ms: float | None
    std_ttft_ms: float | None
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    std_tpot_ms: float | None
    median_tpot_ms: float | None
    p90_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    std_itl_ms: float | None
    median_itl_ms: float | None
    p90_itl_ms: float | None
    p99_itl_ms: float | None
    mean_e2el_ms: float | None
    std_e2el_ms: float | None
    median_e2el_ms: float | None
    p90_e2el_ms: float | None
    p99_e2el_ms: float | None
    cached_token_share: float | None
    # Goodput exists only when an SLO was given (then it may still be None: no duration).
    slo_given: bool = False

    def value(self, metric: str) -> float | int | None:
        """A figure chosen by name (the compared and tabled metrics are lists of names)."""
        if metric not in _METRIC_NAMES:
            raise KeyError(f"not an arm metric: {metric}")
        return getattr(self, metric)  # type: ignore[no-any-return]

    def to_json(self) -> Json:
        skip = ("slo_given",) if self.slo_given else ("slo_given", "request_goodput_req_s")
        return _fields(self, skip)

    @classmethod
    def from_json(cls, d: Any, where: str = "metrics") -> ArmMetrics:
        required = tuple(n for n in _METRIC_NAMES if n != "request_goodput_req_s")
        d = _exact(d, required, where, optional=("request_goodput_req_s",))
        return cls(
            **{**d, "request_goodput_req_s": d.get("request_goodput_req_s")},
            slo_given="request_goodput_req_s" in d,
        )


_METRIC_NAMES = _names(ArmMetrics, skip=("slo_given",))


@dataclass
class Comparison:
    """One metric, candidate against baseline: pooled values, % delta, its 95% interval from
    the paired trials, and the verdict."""

    metric: str
    baseline_arm: str
    candidate_arm: str
    baseline: float | None
    candidate: float | None
    delta_pct: float | None
    ci95_low_pct: float | None
    ci95_high_pct: float | None
    verdict: str
    higher_is_better: bool
    resample_unit: str
    # what the scenario's preconditions say beside this verdict (kvops.abtest.validity), e.g.
    # a KV-capacity difference between the arms; absent from the document when None
    caveat: str | None = None

    def to_json(self) -> Json:
        return _fields(self, skip=() if self.caveat else ("caveat",))

    @classmethod
    def from_json(cls, d: Any, where: str = "comparison") -> Comparison:
        return cls(**_exact(d, _names(cls, skip=("caveat",)), where, optional=("caveat",)))


@dataclass
class MetricsBrief:
    """The few figures shown per batch and per iteration."""

    completed: int
    errors: int
    total_token_throughput_tok_s: float | None
    mean_ttft_ms: float | None
    mean_itl_ms: float | None

    @classmethod
    def of(cls, m: ArmMetrics) -> MetricsBrief:
        return cls(
            m.completed, m.errors, m.total_token_throughput_tok_s, m.mean_ttft_ms, m.mean_itl_ms
        )

    @classmethod
    def from_json(cls, d: Json) -> MetricsBrief:
        return cls(**{k: d[k] for k in _names(cls)})


@dataclass
class BatchFigures:
    trial: int
    iteration: int
    batch: int
    figures: MetricsBrief

    def to_json(self) -> Json:
        return {**_fields(self, skip=("figures",)), **_fields(self.figures)}

    @classmethod
    def from_json(cls, d: Any, where: str = "per_batch") -> BatchFigures:
        d = _exact(d, ("trial", "iteration", "batch", *_names(MetricsBrief)), where)
        return cls(d["trial"], d["iteration"], d["batch"], MetricsBrief.from_json(d))


@dataclass
class IterationFigures:
    iteration: int
    warmup: bool
    figures: MetricsBrief

    def to_json(self) -> Json:
        return {**_fields(self, skip=("figures",)), **_fields(self.figures)}

    @classmethod
    def from_json(cls, d: Any, where: str = "per_iteration") -> IterationFigures:
        d = _exact(d, ("iteration", "warmup", *_names(MetricsBrief)), where)
        return cls(d["iteration"], d["warmup"], MetricsBrief.from_json(d))


@dataclass
class InstanceFigures:
    """One instance of an arm of several (`--arm NAME=URL1,URL2`) in one scenario: what the
    client sent it and measured, and what its own counters say it served from where (None:
    not reported). See kvops.abtest.fleet_figures for the cross-instance split."""

    url: str
    requests: int
    errors: int
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    gpu_hit_tokens: float | None
    offload_hit_tokens: float | None
    stored_tokens: float | None
    cross_instance_hit_tokens: float | None
    cross_instance_hit_share: float | None

    def to_json(self) -> Json:
        return _fields(self)

    @classmethod
    def from_json(cls, d: Any, where: str = "instances[]") -> InstanceFigures:
        return cls(**_exact(d, _names(cls), where))


@dataclass
class MeasuredArm:
    """One arm in one scenario: pooled metrics over its measured trials, its errors, and the
    per-iteration and per-batch figures (warm-up included) the plots draw."""

    metrics: ArmMetrics
    errors_total: int
    errors_by_reason: dict[str, int]
    warmup_requests: int
    per_iteration: list[IterationFigures]
    per_batch: list[BatchFigures]
    # how late a simulated engine sent its tokens against its model's schedule; None for
    # servers that do not report it (and then absent from the document)
    engine_emission_lag_mean_ms: float | None = None
    # an arm of several instances only (absent from the document otherwise): each instance's
    # figures, and the share of the arm's offload hits loaded where the prefix was not first
    # computed (the field `kvops sim run --instances N` predicts; None: nothing loaded, or
    # not reported)
    instances: list[InstanceFigures] | None = None
    cross_instance_hit_share: float | None = None
    # its failed KV loads (kvops.abtest.failed_loads); None when nothing reported them (and
    # then absent from the document)
    failed_loads: FailedLoads | None = None

    def to_json(self) -> Json:
        d: Json = {
            "metrics": self.metrics.to_json(),
            "errors_total": self.errors_total,
            "errors_by_reason": self.errors_by_reason,
            "warmup_requests": self.warmup_requests,
            "per_iteration": [i.to_json() for i in self.per_iteration],
            "per_batch": [b.to_json() for b in self.per_batch],
        }
        if self.engine_emission_lag_mean_ms is not None:
            d["engine_emission_lag_mean_ms"] = self.engine_emission_lag_mean_ms
        if self.instances is not None:
            d["instances"] = [i.to_json() for i in self.instances]
            d["cross_instance_hit_share"] = self.cross_instance_hit_share
        if self.failed_loads is not None:
            d["failed_loads"] = self.failed_loads.to_json()
        return d

    @classmethod
    def from_json(cls, d: Any, where: str) -> MeasuredArm:
        optional = (
            "engine_emission_lag_mean_ms",
            "instances",
            "cross_instance_hit_share",
            "failed_loads",
        )
        d = _exact(d, _names(cls, skip=optional), where, optional=optional)
        instances = d.get("instances")
        failed = d.get("failed_loads")
        return cls(
            ArmMetrics.from_json(d["metrics"], f"{where}.metrics"),
            d["errors_total"],
            dict(d["errors_by_reason"]),
            d["warmup_requests"],
            [IterationFigures.from_json(i, f"{where}.per_iteration") for i in d["per_iteration"]],
            [BatchFigures.from_json(b, f"{where}.per_batch") for b in d["per_batch"]],
            d.get("engine_emission_lag_mean_ms"),
            None
            if instances is None
            else [InstanceFigures.from_json(i, f"{where}.instances") for i in instances],
            d.get("cross_instance_hit_share"),
            FailedLoads.from_json(failed) if isinstance(failed, dict) else None,
        )


@dataclass
class ScenarioResult:
    workload: WorkloadSpec
    verdict: str  # the first candidate's verdict on the primary metric
    arms: dict[str, MeasuredArm]
    comparisons: list[Comparison]
    # the preconditions of the verdict and each arm's token sources (absent in older documents)
    checks: ScenarioChecks | None = None

    def comparison(self, metric: str, candidate_arm: str | None) -> Comparison | None:
        return next(
            (c for c in self.comparisons if (c.metric, c.candidate_arm) == (metric, candidate_arm)),
            None,
        )

    def to_json(self) -> Json:
        return {
            "workload": self.workload.to_dict(),
            "verdict": self.verdict,
            "arms": {name: arm.to_json() for name, arm in self.arms.items()},
            "comparisons": [c.to_json() for c in self.comparisons],
            **({"checks": self.checks.to_json()} if self.checks is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> ScenarioResult:
        d = _exact(d, _names(cls, skip=("checks",)), where, optional=("checks",))
        try:
            workload = spec_from_dict(d["workload"], f"{where}.workload")
        except WorkloadSpecError as exc:
            raise ResultsFormatError(f"results document: {exc}") from None
        return cls(
            workload,
            d["verdict"],
            {a: MeasuredArm.from_json(b, f"{where}.arms.{a}") for a, b in d["arms"].items()},
            [Comparison.from_json(c, f"{where}.comparisons") for c in d["comparisons"]],
            ScenarioChecks.from_json(d["checks"]) if d.get("checks") is not None else None,
        )


@dataclass
class ArmDescription:
    """What an arm said about itself at the latest attempt (None: it did not say)."""

    name: str
    url: str
    version: str | None
    models: list[str] | None
    max_model_len: int | None
    cache_config: dict[str, str] | None

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> ArmDescription:
        """From one arm's entry of arms.json (older entries may lack keys)."""
        return cls(**{k: info.get(k) for k in _names(cls)})  # type: ignore[arg-type]

    def to_json(self) -> Json:
        return _fields(self)

    @classmethod
    def from_json(cls, d: Any) -> ArmDescription:
        return cls(**_exact(d, _names(cls), "arms[]"))


@dataclass
class ClientHealth:
    """The load generator's own delays over the run, and whether they shaped the figures."""

    dispatch_lag_mean_ms: float
    dispatch_lag_p99_ms: float
    dispatch_lag_max_ms: float
    loop_lag_mean_ms: float
    loop_lag_p99_ms: float
    max_in_flight: int
    workers: int
    ttft_error_share: float | None
    bottleneck: bool
    bottleneck_reason: str | None

    def to_json(self) -> Json:
        return _fields(self)

    @classmethod
    def from_json(cls, d: Any) -> ClientHealth:
        return cls(**_exact(d, _names(cls), "client"))


@dataclass
class PredictedFigures:
    """What the model itself predicts for one arm of an embedded run, in wall-clock units."""

    total_token_throughput_tok_s: float | None
    mean_ttft_ms: float | None
    mean_itl_ms: float | None

    @classmethod
    def of(cls, m: ArmMetrics) -> PredictedFigures:
        return cls(m.total_token_throughput_tok_s, m.mean_ttft_ms, m.mean_itl_ms)

    def value(self, metric: str) -> float | None:
        if metric not in _names(PredictedFigures):
            raise KeyError(f"not a predicted figure: {metric}")
        return getattr(self, metric)  # type: ignore[no-any-return]

    def to_json(self) -> Json:
        return _fields(self)

    @classmethod
    def from_json(cls, d: Any) -> PredictedFigures:
        return cls(**_exact(d, _names(cls), "model_prediction"))


Prediction = dict[str, dict[str, PredictedFigures]]  # scenario -> arm -> figures
# `ab-test --deploy`'s record of what each arm's deploys put on the host (see the schema above)
DeploySummary = dict[str, Any]


@dataclass
class RunResults:
    """The whole results document of one ab-test run."""

    kvops_version: str
    status: str  # complete | interrupted | incomplete | invalid
    status_detail: str
    run_dir: str
    arms: list[ArmDescription]
    embedded_engines: bool
    options: dict[str, Any]  # the run's options as recorded in run.json
    warnings: list[str]
    scenarios: dict[str, ScenarioResult]
    client: ClientHealth
    model_prediction: Prediction | None = None  # embedded engines only
    deploy: DeploySummary | None = None  # --deploy runs only
    # predicted (before the run) against measured deltas; absent in older documents
    prediction_score: PredictionScore | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def any_errors(self) -> bool:
        return any(a.errors_total > 0 for s in self.scenarios.values() for a in s.arms.values())

    @property
    def run_seed(self) -> int | None:
        seed = self.options.get("seed")
        return int(seed) if seed is not None else None

    @property
    def arm_names(self) -> list[str]:
        """The arms in order (the first is the baseline); from the scenarios when no arm
        described itself."""
        if self.arms:
            return [a.name for a in self.arms]
        return next((list(s.arms) for s in self.scenarios.values()), [])

    def to_json(self) -> Json:
        d: Json = {
            "schema_version": self.schema_version,
            "kvops_version": self.kvops_version,
            "status": self.status,
            "status_detail": self.status_detail,
            "run_dir": self.run_dir,
            "arms": [a.to_json() for a in self.arms],
            "embedded_engines": self.embedded_engines,
            "options": self.options,
            "warnings": self.warnings,
            "scenarios": {name: sc.to_json() for name, sc in self.scenarios.items()},
            "client": self.client.to_json(),
        }
        if self.model_prediction is not None:
            d["model_prediction"] = {
                sc: {arm: f.to_json() for arm, f in arms.items()}
                for sc, arms in self.model_prediction.items()
            }
        if self.deploy is not None:
            d["deploy"] = self.deploy
        if self.prediction_score is not None:
            d["prediction_score"] = self.prediction_score.to_json()
        return d

    def to_text(self) -> str:
        """results.json's exact text (also what `ab-test --json` prints)."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, d: Any) -> RunResults:
        """Raises ResultsFormatError for another schema version or a document kvops did not
        write (missing or unknown keys)."""
        if isinstance(d, dict) and d.get("schema_version") != SCHEMA_VERSION:
            raise ResultsFormatError(
                f"results document: schema_version {d.get('schema_version')!r}; this kvops "
                f"reads {SCHEMA_VERSION}"
            )
        optional = ("model_prediction", "deploy", "prediction_score")
        d = _exact(d, _names(cls, skip=optional), "top level", optional)
        prediction = d.get("model_prediction")
        try:
            score = (
                PredictionScore.from_json(d["prediction_score"])
                if d.get("prediction_score") is not None
                else None
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsFormatError(f"results document: prediction_score: {exc}") from None
        return cls(
            kvops_version=d["kvops_version"],
            status=d["status"],
            status_detail=d["status_detail"],
            run_dir=d["run_dir"],
            arms=[ArmDescription.from_json(a) for a in d["arms"]],
            embedded_engines=d["embedded_engines"],
            options=dict(d["options"]),
            warnings=list(d["warnings"]),
            scenarios={
                n: ScenarioResult.from_json(s, f"scenarios.{n}") for n, s in d["scenarios"].items()
            },
            client=ClientHealth.from_json(d["client"]),
            model_prediction=None
            if prediction is None
            else {
                sc: {arm: PredictedFigures.from_json(f) for arm, f in arms.items()}
                for sc, arms in prediction.items()
            },
            deploy=d.get("deploy"),
            prediction_score=score,
            schema_version=d["schema_version"],
        )

    @classmethod
    def from_text(cls, text: str) -> RunResults:
        try:
            return cls.from_json(json.loads(text))
        except ValueError as exc:
            if isinstance(exc, ResultsFormatError):
                raise
            raise ResultsFormatError(f"results document is not JSON: {exc}") from None
