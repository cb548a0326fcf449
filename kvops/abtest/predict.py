"""What the model itself predicts for an embedded ab-test run, computed in virtual time.

Why: the embedded engines run the model in real time on whatever host runs the demo. When that
host cannot keep up (a small VM, other jobs), tokens go out late and the measured figures
describe the host, not the model. Running exactly the same experiment through the pure model -
same prompts, same segment order (ABBA), same warm-up, same cache resets, one engine per arm
whose offload storage persists across segments as the embedded server's does - gives the
figures the measurement should reproduce, in the same wall-clock units (virtual x time scale).
The gap between the two is the simulator's fidelity on this host.

Requests are replayed as the client sent them: each one arrives as many (virtual) seconds
after its release group's first request as it was sent after it. A client spreads a batch's
sends over milliseconds (it builds and writes every body in turn); a request that arrives
after the engine began the batch's first step has its prefill scheduled between the others'
decode steps, as vLLM's chunked prefill does, and that shows in mean ITL. With no records
(`sent` empty) every request of a group arrives at once: `kvops sim run`'s ideal client.

Rate mode is replayed on the client's own schedule: the arrival offsets the load generator
draws for each iteration (`kvops.workload.schedule.arrival_offsets_s`, seeded by trial and
iteration, so the replay's are the run's), each request released at its offset or, under
`max_concurrency`, when a slot frees, whichever is later (as `vllm bench serve`'s
semaphore does).

Limits: token-id prompts only (text prompts would need the server's tokenizer round trip).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kvops.abtest.arms import Arm
from kvops.abtest.embedded import SimProfile
from kvops.abtest.experiment import Options, segment_plan
from kvops.abtest.metrics import compute_metrics
from kvops.abtest.result_types import ArmMetrics, PredictedFigures, Prediction, ScenarioResult
from kvops.abtest.rundir import RunDir
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import Engine, EngineSettings, build_engine
from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile
from kvops.sim.records import Request, SimRequestRecord
from kvops.workload.generate import Alphabet, make_prefixes, plan_iteration
from kvops.workload.record import RequestRecord
from kvops.workload.schedule import arrival_offsets_s, batch_groups
from kvops.workload.spec import WorkloadSpec

# Virtual seconds between two segments: the client resets caches and prepares the next
# segment; offload writes in flight land meanwhile, as they do in real time.
SEGMENT_GAP_S = 1.0
# The figures compared between prediction and measurement (both in wall-clock units), and how
# far apart they may be before the run says so: beyond it, the host (CPU contention, client
# overhead) shaped the numbers more than the model did.
FIDELITY_METRICS = ("total_token_throughput_tok_s", "mean_ttft_ms", "mean_itl_ms")
FIDELITY_TOLERANCE = 0.15


@dataclass(frozen=True)
class EmbeddedArm:
    """How the embedded launcher configures one engine (see `kvops.abtest.embedded`)."""

    name: str
    settings: EngineSettings


@dataclass(frozen=True)
class CostProfiles:
    """The profiles the model's costs come from: names, YAML paths, or profile objects (a
    prediction from measured storage or from calibrated figures)."""

    model: str | ModelProfile
    gpu: str | GpuProfile
    storage: str | StorageProfile


SendKey = tuple[str, str, str]  # (scenario, arm, planned request id)


def send_offsets(records: Iterable[RequestRecord]) -> dict[SendKey, float]:
    """When each request was sent, in wall seconds after the first send of its release group
    (the records of one attempt per segment, as the results use them)."""
    records = list(records)
    firsts: dict[tuple[str, str, str, int, int, int], float] = {}
    for r in records:
        group = (r.attempt, r.scenario, r.arm, r.trial, r.iteration, r.batch)
        firsts[group] = min(firsts.get(group, r.send_perf_s), r.send_perf_s)
    out: dict[SendKey, float] = {}
    for r in records:
        group = (r.attempt, r.scenario, r.arm, r.trial, r.iteration, r.batch)
        planned_id = r.request_id.split("/", 2)[-1]  # "{attempt}{scenario}/{arm}/{planned}"
        out[(r.scenario, r.arm, planned_id)] = r.send_perf_s - firsts[group]
    return out


def predict(
    scenarios: list[WorkloadSpec],
    arms: list[EmbeddedArm],
    options: Options,
    alphabet: Alphabet,
    profile: Mapping[str, str] | CostProfiles,
    time_scale: float,
    sent: Mapping[SendKey, float] | None = None,
) -> dict[str, dict[str, ArmMetrics]] | None:
    """scenario -> arm -> metrics (as `compute_metrics`, wall units), or None when the run
    cannot be replayed in virtual time (text prompts, traces). `sent`: each request's send
    offset within its release group (`send_offsets`; batch mode); a request not in it arrives
    with the group's first."""
    sent = sent or {}
    if alphabet.is_text or any(s.trace is not None for s in scenarios):
        return None  # a trace (--trace) is predicted by `kvops advise TRACE`, not here
    costs = (
        profile
        if isinstance(profile, CostProfiles)
        else CostProfiles(profile["model"], profile["gpu"], profile["storage"])
    )
    engines: dict[str, Engine] = {
        a.name: build_engine(costs.model, costs.gpu, costs.storage, a.settings) for a in arms
    }
    plan_arms = [Arm(a.name, "embedded") for a in arms]
    records: dict[tuple[str, str], list[RequestRecord]] = {}
    prefixes = {s.name: make_prefixes(s, alphabet, options.seed) for s in scenarios}
    for spec, trial, arm in segment_plan(scenarios, plan_arms, options.trials):
        engine = engines[arm.name]
        if options.reset_cache:
            engine.reset_prefix_cache()
        engine.now_s += SEGMENT_GAP_S
        out = records.setdefault((spec.name, arm.name), [])
        for iteration in range(spec.iterations):
            planned = plan_iteration(
                spec, alphabet, prefixes[spec.name], trial=trial, iteration=iteration,
                run_seed=options.seed,
            )  # fmt: skip
            warm = iteration < options.warmup_iterations
            if spec.rate is not None:
                offsets = arrival_offsets_s(spec, len(planned), key=(trial, iteration))
                start_s = engine.now_s
                reqs = [
                    Request(
                        f"{arm.name}/{p.request.request_id}",
                        start_s + offset / time_scale,
                        _token_ids(p.request.prompt),
                        p.request.output_tokens,
                    )
                    for p, offset in zip(planned, offsets, strict=True)
                ]
                for p, rec in zip(
                    planned, run_capped(engine, reqs, spec.max_concurrency), strict=True
                ):
                    out.append(_as_client_record(rec, time_scale, trial, iteration, p.batch, warm))
                continue
            for group in batch_groups(len(planned), spec.batch_size):
                batch = [planned[i] for i in group]
                start_s = engine.now_s
                reqs = [
                    Request(
                        f"{arm.name}/{p.request.request_id}",
                        start_s
                        + sent.get((spec.name, arm.name, p.request.request_id), 0.0) / time_scale,
                        _token_ids(p.request.prompt),
                        p.request.output_tokens,
                    )
                    for p in batch
                ]
                for p, rec in zip(batch, engine.run(reqs), strict=True):
                    out.append(_as_client_record(rec, time_scale, trial, iteration, p.batch, warm))
    result: dict[str, dict[str, ArmMetrics]] = {}
    for (scenario, arm_name), recs in records.items():
        measured = [r for r in recs if not r.warmup]
        by_trial: dict[int, list[RequestRecord]] = {}
        for r in measured:
            by_trial.setdefault(r.trial, []).append(r)
        metrics = compute_metrics([by_trial[t] for t in sorted(by_trial)])
        result.setdefault(scenario, {})[arm_name] = metrics
    return result


def run_capped(
    engine: Engine, requests: Sequence[Request], max_concurrency: int | None
) -> list[SimRequestRecord]:
    """Requests in release order, each arriving at its own time or, with `max_concurrency`
    in flight already, when the next one finishes (a client that holds a semaphore slot per
    request); to completion, records in the order given."""
    if max_concurrency is None or max_concurrency >= len(requests):
        return engine.run(requests)
    records: dict[str, SimRequestRecord] = {}
    waiting = list(reversed(requests))  # pop() takes the next in release order
    in_flight = 0
    while waiting or in_flight:
        while waiting and in_flight < max_concurrency:
            req = waiting.pop()
            engine.add_request(replace(req, arrival_s=max(req.arrival_s, engine.now_s)))
            in_flight += 1
        step = engine.step()
        if step is None:  # nothing admitted can progress: cannot happen with in_flight > 0
            break
        for rec in step.finished:
            records[rec.request_id] = rec
            in_flight -= 1
    return [records[r.request_id] for r in requests]


def _token_ids(prompt: list[int] | str) -> list[int]:
    if isinstance(prompt, str):
        raise TypeError("text prompts cannot be replayed in virtual time")
    return prompt


def _as_client_record(
    rec: SimRequestRecord, scale: float, trial: int, iteration: int, batch: int, warm: bool
) -> RequestRecord:
    """The model's record as the client would have measured it with a perfect host."""
    return RequestRecord(
        request_id=rec.request_id,
        trial=trial,
        iteration=iteration,
        batch=batch,
        warmup=warm,
        send_perf_s=rec.arrival_s * scale,
        end_perf_s=(rec.finish_s or rec.arrival_s) * scale,
        chunk_offsets_ms=[(t - rec.arrival_s) * scale * 1e3 for t in rec.token_times_s],
        prompt_tokens=rec.prompt_tokens,
        output_tokens=len(rec.token_times_s),
        cached_tokens=rec.gpu_hit_tokens + rec.offload_hit_tokens,
    )


def embedded_arms(kv_capacity_scale: float, profile: SimProfile | None = None) -> list[EmbeddedArm]:
    """The two engines `EmbeddedEngines` starts for `profile`, as model settings."""
    profile = profile or SimProfile()
    offload_lmcache = LMCacheSettings(**profile.offload_lmcache(), gds_path="(virtual)")  # type: ignore[arg-type]
    kv = profile.kv_cache_memory_bytes()
    return [
        EmbeddedArm(
            "baseline",
            EngineSettings(kv_capacity_scale=kv_capacity_scale, kv_cache_memory_bytes=kv),
        ),
        EmbeddedArm(
            "offload",
            EngineSettings(
                kv_capacity_scale=kv_capacity_scale,
                kv_cache_memory_bytes=kv,
                offload=True,
                lmcache=offload_lmcache,
            ),
        ),
    ]


def predict_run(run_dir: RunDir, records: Iterable[RequestRecord] = ()) -> Prediction | None:
    """The prediction for a run directory of embedded engines (None for real arms, or when
    the run cannot be replayed): scenario -> arm -> the compared metrics, for the requests
    sent as `records` say they were (none: all of a group at once)."""
    run, specs = run_dir.load_run()
    sim = run.get("sim")
    saved = run_dir.load_alphabet()
    if not run.get("embedded") or not isinstance(sim, dict) or saved is None:
        return None
    options = Options(**run.get("options", {}))
    arms = embedded_arms(float(run.get("scale", 1.0)), SimProfile(**sim))
    time_scale = float(sim["time_scale"])
    full = predict(specs, arms, options, saved[0], sim, time_scale, send_offsets(records))
    if full is None:
        return None
    return {
        sc: {arm: PredictedFigures.of(metrics) for arm, metrics in by_arm.items()}
        for sc, by_arm in full.items()
    }


def fidelity_warnings(scenarios: Mapping[str, ScenarioResult], prediction: Prediction) -> list[str]:
    """One warning per scenario whose measured figures stray from the model's own."""
    out: list[str] = []
    for name, predicted in prediction.items():
        measured_arms = scenarios[name].arms if name in scenarios else {}
        off: list[str] = []
        for arm, pred in predicted.items():
            if arm not in measured_arms:
                continue
            got = measured_arms[arm].metrics
            for metric in FIDELITY_METRICS:
                want, have = pred.value(metric), got.value(metric)
                if not want or have is None:
                    continue
                dev = have / want - 1.0
                if abs(dev) > FIDELITY_TOLERANCE:
                    off.append(f"{arm} {metric} {have:,.1f} vs {want:,.1f} ({dev:+.0%})")
        if off:
            out.append(
                f"{name}: the embedded engines' measured figures differ from the model's own "
                f"prediction for this workload by more than {FIDELITY_TOLERANCE:.0%} ("
                + "; ".join(off)
                + "): the host (CPU contention, client overhead) shaped them; trust the "
                "prediction, or rerun on a quieter host or with a larger --sim-time-scale"
            )
    return out
