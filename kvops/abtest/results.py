"""The results document (results.json), rebuilt from the run directory's files alone.

Why from files: the same function serves a finished run, a run stopped with Ctrl-C and a resumed
one, so what the report says is always what the records say. Schema (versioned; additions only
within a version):

  schema_version: 1
  status: complete | interrupted | incomplete | invalid (an arm's measured requests failed
          beyond 1%: its verdicts read "invalid: N errors")
  status_detail: str                 (which arm broke, how many requests, from when; "" if none)
  arms: [{name, url, version, model, max_model_len, cache_config}]     (latest attempt)
  warnings: [str]                                    (arm differences, missing resets, ...)
  scenarios: {<preset or custom>: {
      workload: {spec},
      verdict: helps | hurts | no significant difference | not enough data | not enough trials
               | invalid: N errors                                                (first candidate)
      arms: {<arm>: {metrics: {completed, errors, duration_s, total_token_throughput_tok_s,
                               output_throughput_tok_s, request_throughput_req_s,
                               mean|median|std|p90|p99 _ ttft|tpot|itl|e2el _ms,
                               cached_token_share (None = not reported), [request_goodput_req_s]},
                     errors_total, errors_by_reason, warmup_requests, per_iteration, per_batch}},
      comparisons: [{metric, baseline, candidate (values), baseline_arm, candidate_arm,
                     delta_pct, ci95_low_pct, ci95_high_pct, verdict, higher_is_better,
                     resample_unit ("paired trials (N)")}]}}
      (an arm block also has engine_emission_lag_mean_ms when the arm is a simulated engine)
  model_prediction: {<scenario>: {<arm>: {total_token_throughput_tok_s, mean_ttft_ms,
                     mean_itl_ms}}}      (embedded engines only: the model in virtual time)
  deploy: {limit, inventories, clear_gds_dir, extra_vars,            (--deploy runs only; redacted)
           outcomes: [{index, arm, variant, status, rc, started_at, duration_s, changed_tasks,
                       error}],
           arms: {<arm>: {variant, deploys, failed, last_status,
                          deployed: {<host>: {install_method, image, vllm_version,
                                     lmcache_version_installed, lmcache_version_configured,
                                     packages, service, lmcache_config, kv_transfer_config,
                                     exec_start, environment}}}}}
  client: {dispatch_lag_mean_ms, dispatch_lag_p99_ms, dispatch_lag_max_ms, loop_lag_mean_ms,
           loop_lag_p99_ms, max_in_flight, workers, bottleneck, bottleneck_reason}
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvops import __version__
from kvops.abtest.deploy_summary import failed_deploy_detail, summarize_deploys
from kvops.abtest.leakage import warm_tier_warnings
from kvops.abtest.predict import fidelity_warnings, predict_run
from kvops.abtest.rundir import RunDir
from kvops.loadgen.record import RequestRecord, iter_jsonl, read_records
from kvops.loadgen.runner import ClientStats, judge_client
from kvops.metrics import (
    broken_arm_errors,
    compare_arms,
    compute_metrics,
    overall_verdict,
)

SCHEMA_VERSION = 1
Clusters = list[list[RequestRecord]]


@dataclass
class ResultSet:
    doc: dict[str, Any]
    # scenario -> arm -> measured (non-warm-up) records of the counted attempts
    measured: dict[str, dict[str, list[RequestRecord]]] = field(default_factory=dict)

    @property
    def any_errors(self) -> bool:
        return any(
            a["errors_total"] > 0
            for s in self.doc["scenarios"].values()
            for a in s["arms"].values()
        )


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
) -> tuple[dict[str, Any], dict[int, list[RequestRecord]]]:
    measured = [r for r in recs if not r.warmup]
    trials = _groups(measured, lambda r: r.trial)
    reasons = Counter((r.error or "")[:120] for r in recs if not r.ok)
    per_batch = [
        {"trial": c[0].trial, "iteration": c[0].iteration, "batch": c[0].batch,
         **_brief(compute_metrics([c]))}
        for c in _groups(recs, lambda r: (r.trial, r.iteration, r.batch))
    ]  # fmt: skip
    per_iteration = [
        {"iteration": g[0].iteration, "warmup": g[0].warmup,
         **_brief(compute_metrics(_groups(g, lambda r: r.trial)))}
        for g in _groups(recs, lambda r: r.iteration)
    ]  # fmt: skip
    block = {
        "metrics": compute_metrics(trials, slo),
        "errors_total": sum(reasons.values()),
        "errors_by_reason": dict(reasons.most_common(10)),
        "warmup_requests": sum(1 for r in recs if r.warmup),
        "per_iteration": per_iteration,
        "per_batch": per_batch,
    }
    return block, {t[0].trial: t for t in trials}


def _brief(m: dict[str, Any]) -> dict[str, Any]:
    keys = ("completed", "errors", "total_token_throughput_tok_s", "mean_ttft_ms", "mean_itl_ms")
    return {k: m.get(k) for k in keys}


def client_summary(run_dir: RunDir, records: list[RequestRecord]) -> dict[str, Any]:
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
    return judge_client(
        summary,
        float(np.mean(ttfts)) if ttfts else None,
        float(np.mean(e2els)) if e2els else None,
    )


# A simulated engine whose tokens left this late on average (share of the arm's mean TTFT)
# measured its host more than its model.
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


def _lag_warnings(scenarios: dict[str, Any]) -> list[str]:
    out = []
    for name, sc in scenarios.items():
        for arm, block in sc["arms"].items():
            lag = block.get("engine_emission_lag_mean_ms")
            ttft = block["metrics"].get("mean_ttft_ms")
            if lag is not None and ttft and lag > LAG_WARN_SHARE * ttft:
                out.append(
                    f"{name}: simulated engine {arm} sent its tokens {lag:.1f} ms late on "
                    f"average against its model's schedule ({lag / ttft:.0%} of its mean TTFT): "
                    "the host could not keep up, so its latencies are overstated"
                )
    return out


def broken_arms(measured: dict[str, dict[str, list[RequestRecord]]]) -> list[str]:
    """One sentence per arm whose measured requests failed beyond 1%: which arm, how many, and
    when it started (the first failure's UTC time and place in the plan)."""
    out = []
    for scenario, arms in measured.items():
        for arm, recs in arms.items():
            failed = sorted((r for r in recs if not r.ok), key=lambda r: r.send_time_unix_s)
            errors = broken_arm_errors(
                {"errors": len(failed), "completed": len(recs) - len(failed)}
            )
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
    status: str = "complete",
    warnings: list[str] | None = None,
) -> ResultSet:
    run, specs = run_dir.load_run()
    done = run_dir.done_segments()
    records = _select(read_records(run_dir.records_path), done)
    arm_names = [a["name"] for a in run["arms"]]
    history = run_dir.read_json("arms.json") or {}
    latest_infos = history[max(history, key=attempt_number)] if history else []
    result = ResultSet(doc={})
    scenarios: dict[str, Any] = {}
    lags = engine_lags(run_dir, done)
    for spec in specs:
        by_arm = {
            a: [r for r in records if r.scenario == spec.name and r.arm == a] for a in arm_names
        }
        blocks: dict[str, Any] = {}
        trials: dict[str, dict[int, list[RequestRecord]]] = {}
        for a in arm_names:
            blocks[a], trials[a] = _arm_block(by_arm[a], slo)
            if (spec.name, a) in lags:
                blocks[a]["engine_emission_lag_mean_ms"] = lags[(spec.name, a)]
        result.measured[spec.name] = {a: [r for r in by_arm[a] if not r.warmup] for a in arm_names}
        comparisons = []
        base = arm_names[0]
        for cand in arm_names[1:]:
            comparisons += compare_arms(
                (base, trials[base], blocks[base]["metrics"]),
                (cand, trials[cand], blocks[cand]["metrics"]),
            )
        first = [
            c
            for c in comparisons
            if c.candidate_arm == (arm_names[1] if len(arm_names) > 1 else "")
        ]
        scenarios[spec.name] = {
            "workload": spec.to_dict(),
            "verdict": overall_verdict(first),
            "arms": blocks,
            "comparisons": [c.to_dict() for c in comparisons],
        }
    warnings = list(warnings or [])
    for spec in specs:
        scenario_records = [r for r in records if r.scenario == spec.name]
        warnings += warm_tier_warnings(scenario_records, spec.prefix_tokens, spec.name)
    warnings += [w for w in _lag_warnings(scenarios) if w not in warnings]
    prediction = predict_run(run_dir)
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
    broken = broken_arms(result.measured)
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
    result.doc = {
        "schema_version": SCHEMA_VERSION,
        "kvops_version": __version__,
        "status": status,
        "status_detail": "; ".join(broken),
        "run_dir": str(run_dir.path),
        "arms": [
            {
                k: i.get(k)
                for k in ("name", "url", "version", "models", "max_model_len", "cache_config")
            }
            for i in latest_infos
        ],
        "embedded_engines": bool(run.get("embedded")),
        "options": run.get("options", {}),
        "warnings": warnings,
        "scenarios": scenarios,
        "client": client_summary(run_dir, records),
    }
    if prediction is not None:
        result.doc["model_prediction"] = prediction
    if deploy is not None:
        result.doc["deploy"] = deploy
    return result
