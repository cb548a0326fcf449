"""The results document (results.json), rebuilt from the run directory's files alone.

Why from files: the same function serves a finished run, a run stopped with Ctrl-C and a resumed
one, so what the report says is always what the records say. This is the one place the
document's types (kvops.abtest.result_types, which also holds the schema and its JSON form) are
built from measurements.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kvops import __version__
from kvops.abtest.deploy_summary import failed_deploy_detail, summarize_deploys
from kvops.abtest.engine_counters import Counters, add_counters
from kvops.abtest.failed_loads import failed_load_warnings, failed_loads_by_arm
from kvops.abtest.fleet_figures import cross_instance_hit_share, instance_figures, prefix_writers
from kvops.abtest.leakage import warm_tier_warnings
from kvops.abtest.metrics import (
    broken_arm_errors,
    compare_arms,
    compute_metrics,
    overall_verdict,
)
from kvops.abtest.predict import fidelity_warnings, predict_run
from kvops.abtest.prediction import load_prediction, score_run
from kvops.abtest.result_types import (
    ArmDescription,
    BatchFigures,
    ClientHealth,
    Comparison,
    IterationFigures,
    MeasuredArm,
    MetricsBrief,
    RunResults,
    ScenarioResult,
)
from kvops.abtest.rundir import RunDir
from kvops.abtest.validity import (
    OVERLOAD_LAG_SHARE,
    attribute_gains,
    check_scenario,
    overloaded_arms,
    withhold_when_overloaded,
)
from kvops.loadgen.runner import ClientStats, judge_client
from kvops.workload.record import RequestRecord, iter_jsonl, read_records

Clusters = list[list[RequestRecord]]
Status = Literal["complete", "interrupted", "incomplete", "invalid"]


@dataclass
class ResultSet:
    doc: RunResults
    # scenario -> arm -> measured (non-warm-up) records of the counted attempts
    measured: dict[str, dict[str, list[RequestRecord]]] = field(default_factory=dict)


def _select(
    records: list[RequestRecord], done: dict[tuple[str, int, str], str]
) -> list[RequestRecord]:
    """Keep, per (scenario, trial, arm), the finished attempt, else the latest one seen."""
    latest: dict[tuple[str, int, str], str] = {}
    for r in records:
        key = (r.scenario, r.trial, r.arm)
        latest[key] = max(latest.get(key, r.attempt), r.attempt, key=attempt_number)
    chosen = {**latest, **done}
    return [r for r in records if chosen.get((r.scenario, r.trial, r.arm)) == r.attempt]


def attempt_number(attempt: str) -> int:
    """ "a12-" -> 12 (attempts are numbered in run order; string order would put a10 before a9)."""
    digits = "".join(ch for ch in attempt if ch.isdigit())
    return int(digits) if digits else -1


def _groups(records: list[RequestRecord], key: Any) -> Clusters:
    out: dict[Any, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[key(r)].append(r)
    return [out[k] for k in sorted(out)]


def _arm_block(
    recs: list[RequestRecord], slo: dict[str, float] | None
) -> tuple[MeasuredArm, dict[int, list[RequestRecord]]]:
    measured = [r for r in recs if not r.warmup]
    trials = _groups(measured, lambda r: r.trial)
    reasons = Counter((r.error or "")[:120] for r in recs if not r.ok)
    per_batch = [
        BatchFigures(c[0].trial, c[0].iteration, c[0].batch, MetricsBrief.of(compute_metrics([c])))
        for c in _groups(recs, lambda r: (r.trial, r.iteration, r.batch))
    ]
    per_iteration = [
        IterationFigures(
            g[0].iteration,
            g[0].warmup,
            MetricsBrief.of(compute_metrics(_groups(g, lambda r: r.trial))),
        )
        for g in _groups(recs, lambda r: r.iteration)
    ]
    block = MeasuredArm(
        metrics=compute_metrics(trials, slo),
        errors_total=sum(reasons.values()),
        errors_by_reason=dict(reasons.most_common(10)),
        warmup_requests=sum(1 for r in recs if r.warmup),
        per_iteration=per_iteration,
        per_batch=per_batch,
    )
    return block, {t[0].trial: t for t in trials}


def client_summary(run_dir: RunDir, records: list[RequestRecord]) -> ClientHealth:
    stats = ClientStats(
        dispatch_lags_ms=[r.dispatch_lag_ms for r in records if r.dispatch_lag_ms is not None]
    )
    seg_clients = [
        d["client"] for d in iter_jsonl(run_dir.segments_path) if isinstance(d.get("client"), dict)
    ]
    summary = stats.summary()
    if seg_clients:
        summary["loop_lag_mean_ms"] = float(np.mean([c["loop_lag_mean_ms"] for c in seg_clients]))
        summary["loop_lag_p99_ms"] = float(max(c["loop_lag_p99_ms"] for c in seg_clients))
        summary["max_in_flight"] = int(max(c["max_in_flight"] for c in seg_clients))
        summary["workers"] = int(max(c.get("workers", 1) for c in seg_clients))
    ok = [r for r in records if r.ok and not r.warmup]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    e2els = [r.e2el_ms for r in ok if r.e2el_ms is not None]
    return ClientHealth.from_json(
        judge_client(
            summary,
            float(np.mean(ttfts)) if ttfts else None,
            float(np.mean(e2els)) if e2els else None,
            smallest_mean_ttft_ms(ok),
        )
    )


def smallest_mean_ttft_ms(records: list[RequestRecord]) -> float | None:
    """The smallest mean TTFT of a (scenario, arm) over `records`: the figure a fixed client
    delay distorts the most (kvops.loadgen.runner.judge_client); None without any TTFT."""
    by_arm: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.ttft_ms is not None:
            by_arm[(r.scenario, r.arm)].append(r.ttft_ms)
    return min((float(np.mean(v)) for v in by_arm.values()), default=None)


# A simulated engine whose tokens left this late on average (share of the arm's mean TTFT)
# measured its host more than its model: a warning; beyond kvops.abtest.validity's
# OVERLOAD_LAG_SHARE the scenario's verdicts are withheld.
LAG_WARN_SHARE = 0.10


def engine_lags(
    run_dir: RunDir, done: dict[tuple[str, int, str], str]
) -> dict[tuple[str, str], float]:
    """(scenario, arm) -> mean emission lag in ms over the counted segments, for simulated
    engines (which report it); absent for servers that do not."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for d in iter_jsonl(run_dir.segments_path):
        lag = d.get("engine_lag")
        key = (str(d.get("scenario")), int(d.get("trial") or 0), str(d.get("arm")))
        if not isinstance(lag, dict) or done.get(key) != d.get("attempt"):
            continue
        acc = sums[(str(d["scenario"]), str(d["arm"]))]
        acc[0] += float(lag.get("sum_s", 0.0))
        acc[1] += float(lag.get("steps", 0))
    return {k: 1e3 * v[0] / v[1] for k, v in sums.items() if v[1] > 0}


def engine_counters(
    run_dir: RunDir, done: dict[tuple[str, int, str], str]
) -> dict[tuple[str, str], Counters]:
    """(scenario, arm) -> the engine's token counters summed over the counted segments'
    measured iterations (absent for an arm whose /metrics gave none)."""
    out: dict[tuple[str, str], Counters] = {}
    for d in iter_jsonl(run_dir.segments_path):
        counters = d.get("engine_counters")
        key = (str(d.get("scenario")), int(d.get("trial") or 0), str(d.get("arm")))
        if not isinstance(counters, dict) or done.get(key) != d.get("attempt"):
            continue
        pair = (key[0], key[2])
        out[pair] = add_counters(out.get(pair, {}), counters)
    return out


def instance_counters(
    run_dir: RunDir, done: dict[tuple[str, int, str], str]
) -> dict[tuple[str, str], dict[str, Counters]]:
    """(scenario, arm) -> instance URL -> that instance's counters summed over the counted
    segments (arms of several instances only; `engine_counters` holds their sum)."""
    out: dict[tuple[str, str], dict[str, Counters]] = {}
    for d in iter_jsonl(run_dir.segments_path):
        per = d.get("instance_counters")
        key = (str(d.get("scenario")), int(d.get("trial") or 0), str(d.get("arm")))
        if not isinstance(per, dict) or done.get(key) != d.get("attempt"):
            continue
        acc = out.setdefault((key[0], key[2]), {})
        for url, counters in per.items():
            if isinstance(counters, dict):
                acc[str(url)] = add_counters(acc.get(str(url), {}), counters)
    return out


def lag_shares(blocks: Mapping[str, MeasuredArm]) -> dict[str, float | None]:
    """Arm -> its simulated engine's mean emission lag as a share of its mean TTFT (None for
    servers that report no lag, or without a TTFT)."""
    out: dict[str, float | None] = {}
    for arm, block in blocks.items():
        lag, ttft = block.engine_emission_lag_mean_ms, block.metrics.mean_ttft_ms
        out[arm] = lag / ttft if lag is not None and ttft else None
    return out


def _lag_warnings(scenarios: dict[str, ScenarioResult]) -> list[str]:
    out = []
    for name, sc in scenarios.items():
        for arm, share in lag_shares(sc.arms).items():
            lag = sc.arms[arm].engine_emission_lag_mean_ms
            if share is None or lag is None or share <= LAG_WARN_SHARE:
                continue
            consequence = (
                "its verdicts are withheld"
                if share > OVERLOAD_LAG_SHARE
                else "so its latencies are overstated"
            )
            out.append(
                f"{name}: simulated engine {arm} sent its tokens {lag:.1f} ms late on "
                f"average against its model's schedule ({share:.0%} of its mean TTFT): "
                f"the host could not keep up, {consequence}"
            )
    return out


def broken_arms(measured: dict[str, dict[str, list[RequestRecord]]]) -> list[str]:
    """One sentence per arm whose measured requests failed beyond 1%: which arm, how many, and
    when it started (the first failure's UTC time and place in the plan)."""
    out = []
    for scenario, arms in measured.items():
        for arm, recs in arms.items():
            failed = sorted((r for r in recs if not r.ok), key=lambda r: r.send_time_unix_s)
            errors = broken_arm_errors(len(failed), len(recs) - len(failed))
            if errors is None:
                continue
            first = failed[0]
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first.send_time_unix_s))
            out.append(
                f"arm {arm} broke in {scenario}: {errors} of {len(recs)} measured requests "
                f"failed, from {when} (trial {first.trial + 1}, iteration {first.iteration + 1}; "
                f"{(first.error or '')[:80]})"
            )
    return out


def build_results(
    run_dir: RunDir,
    *,
    slo: dict[str, float] | None = None,
    status: Status = "complete",
    warnings: list[str] | None = None,
) -> ResultSet:
    run, specs = run_dir.load_run()
    done = run_dir.done_segments()
    every_record = read_records(run_dir.records_path)
    records = _select(every_record, done)
    arm_names = [a["name"] for a in run["arms"]]
    arm_urls = {a["name"]: [a["url"], *(a.get("more_urls") or [])] for a in run["arms"]}
    writers = prefix_writers(every_record)
    per_instance = instance_counters(run_dir, done)
    history = run_dir.read_json("arms.json") or {}
    latest_infos = history[max(history, key=attempt_number)] if history else []
    measured: dict[str, dict[str, list[RequestRecord]]] = {}
    scenarios: dict[str, ScenarioResult] = {}
    lags = engine_lags(run_dir, done)
    counters = engine_counters(run_dir, done)
    failed = failed_loads_by_arm(list(iter_jsonl(run_dir.segments_path)), done)
    for spec in specs:
        by_arm = {
            a: [r for r in records if r.scenario == spec.name and r.arm == a] for a in arm_names
        }
        blocks: dict[str, MeasuredArm] = {}
        trials: dict[str, dict[int, list[RequestRecord]]] = {}
        for a in arm_names:
            blocks[a], trials[a] = _arm_block(by_arm[a], slo)
            if (spec.name, a) in lags:
                blocks[a].engine_emission_lag_mean_ms = lags[(spec.name, a)]
            if len(arm_urls.get(a, [])) > 1:
                block = blocks[a]
                block.instances = instance_figures(
                    arm_urls[a],
                    [r for r in by_arm[a] if not r.warmup],
                    per_instance.get((spec.name, a), {}),
                    writers,
                )
                block.cross_instance_hit_share = cross_instance_hit_share(block.instances)
            blocks[a].failed_loads = failed.get((spec.name, a))
        measured[spec.name] = {a: [r for r in by_arm[a] if not r.warmup] for a in arm_names}
        comparisons: list[Comparison] = []
        base = arm_names[0]
        for cand in arm_names[1:]:
            comparisons += compare_arms(
                (base, trials[base], blocks[base].metrics),
                (cand, trials[cand], blocks[cand].metrics),
            )
        first = [
            c
            for c in comparisons
            if c.candidate_arm == (arm_names[1] if len(arm_names) > 1 else "")
        ]
        checks = check_scenario(
            spec,
            arm_names,
            {str(i.get("name")): i for i in latest_infos},
            {a: counters.get((spec.name, a), {}) for a in arm_names},
            {a: blocks[a].metrics.cached_token_share for a in arm_names},
        )
        for c in comparisons:
            c.caveat = checks.caveats.get(c.candidate_arm, {}).get(c.metric)
        attribute_gains(comparisons, checks)
        withhold_when_overloaded(comparisons, overloaded_arms(lag_shares(blocks)))
        verdict = checks.verdict or overall_verdict(first)
        if overall_verdict(first).startswith("invalid"):
            verdict = overall_verdict(first)  # a broken arm voids everything, checks included
        scenarios[spec.name] = ScenarioResult(spec, verdict, blocks, comparisons, checks)
    warnings = list(warnings or [])
    for spec in specs:
        if spec.trace is not None:
            continue  # a trace's own reuse hits past any one shared prefix
        scenario_records = [r for r in records if r.scenario == spec.name]
        warnings += warm_tier_warnings(scenario_records, spec.prefix_tokens, spec.name)
    warnings += [w for w in _lag_warnings(scenarios) if w not in warnings]
    warnings += [w for w in failed_load_warnings(failed) if w not in warnings]
    prediction = predict_run(run_dir, records)
    if prediction is not None:
        warnings += [w for w in fidelity_warnings(scenarios, prediction) if w not in warnings]
    off = [
        r
        for r in records
        if r.ok and r.prompt_tokens is not None and r.intended_prompt_tokens is not None
        and r.prompt_tokens != r.intended_prompt_tokens
    ]  # fmt: skip
    if off:
        r = off[0]
        warnings.append(
            f"{len(off)} request(s) were counted with a different prompt length than intended "
            f"(e.g. {r.request_id} on {r.arm}: {r.prompt_tokens} vs {r.intended_prompt_tokens} "
            "tokens): the server tokenizes these prompts differently"
        )
    # the prediction written before the run (kvops.abtest.prediction), scored below
    written_first = load_prediction(run_dir.path)
    if written_first is not None and written_first.unavailable:
        warnings.append(f"no prediction was made before the run: {written_first.unavailable}")
    broken = broken_arms(measured)
    if broken and status == "complete":
        status = "invalid"
    deploy = (
        summarize_deploys(run_dir.deploy_records(), run["deploy"], arm_names)
        if run.get("deploy")
        else None
    )
    stopped_at = failed_deploy_detail(deploy) if deploy else ""
    if stopped_at:
        broken.insert(0, f"stopped at a failed {stopped_at}")
        status = "incomplete" if status == "complete" else status
    results = RunResults(
        kvops_version=__version__,
        status=status,
        status_detail="; ".join(broken),
        run_dir=str(run_dir.path),
        arms=[ArmDescription.of(i) for i in latest_infos],
        embedded_engines=bool(run.get("embedded")),
        options=run.get("options", {}),
        warnings=warnings,
        scenarios=scenarios,
        client=client_summary(run_dir, records),
        model_prediction=prediction,
        deploy=deploy,
        prediction_score=score_run(
            written_first, {n: sc.comparisons for n, sc in scenarios.items()}
        )
        if written_first is not None
        else None,
    )
    return ResultSet(results, measured)
