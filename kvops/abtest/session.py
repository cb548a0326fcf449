"""One `kvops ab-test` invocation from start to reports, independent of the CLI.

Why here and not in the click command: the same flow runs from tests and from `--resume`, and
the command stays a thin parser. The flow: create (or reopen) the run directory, start the
embedded engines when no arm was given, run the experiment with Ctrl-C turned into a graceful
stop, then rebuild the results from the files and write the reports - also after an interrupt
or a failure, so what was measured is always summarized.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.abtest.arms import Arm
from kvops.abtest.deploy import (
    ArmDeployer,
    DeployError,
    DeploySettings,
    deploy_record,
    settings_from_record,
)
from kvops.abtest.embedded import EmbeddedEngines, SimProfile, embedded_log
from kvops.abtest.experiment import Experiment, Hooks, Options
from kvops.abtest.prediction import (
    PredictionProfiles,
    RunPrediction,
    arm_profiles,
    load_prediction,
    predict_deltas,
    save_prediction,
)
from kvops.abtest.results import ResultSet, build_results
from kvops.abtest.rundir import RunDir
from kvops.errors import KvopsError
from kvops.workload.spec import WorkloadSpec


@dataclass
class AbTestRequest:
    out: Path
    arms: list[Arm] = field(default_factory=list)  # empty: embedded sim engines
    scenarios: list[WorkloadSpec] = field(default_factory=list)
    options: Options = field(default_factory=Options)
    scale: float = 1.0
    sim: SimProfile = field(default_factory=SimProfile)
    seed: int | None = None  # None: a fresh run seed (recorded in run.json)
    slo: dict[str, float] = field(default_factory=dict)
    overwrite: bool = False
    resume: bool = False
    deploy: DeploySettings | None = None  # --deploy: each arm's variant put on the host first
    # --resume of a --deploy run: the secret extra vars run.json did not keep, given again
    resume_deploy_vars: dict[str, Any] = field(default_factory=dict)
    # the profiles the prediction written before the run uses (None: the --sim-* profiles)
    predict_profiles: PredictionProfiles | None = None
    # arm name -> its service log (--service-log), read for failed KV loads; the embedded
    # engines' own logs are read without it (kvops.abtest.failed_loads)
    service_logs: dict[str, Path] = field(default_factory=dict)


@dataclass
class Outcome:
    results: ResultSet
    interrupted: bool
    warnings: list[str]


def prepare(req: AbTestRequest) -> RunDir:
    """Create the run directory (or reopen it for --resume, restoring its settings)."""
    run_dir = RunDir(req.out)
    if req.resume:
        run, specs = run_dir.load_run()
        req.scenarios = specs
        req.arms = (
            [
                Arm(a["name"], a["url"], a.get("model"), tuple(a.get("more_urls") or ()))
                for a in run["arms"]
            ]
            if not run.get("embedded")
            else []
        )
        req.options = Options(**run["options"])
        req.scale = float(run.get("scale", 1.0))
        req.sim = SimProfile(**run["sim"]) if run.get("sim") else req.sim
        req.seed, req.slo = int(run.get("seed") or 0), dict(run.get("slo") or {})
        req.service_logs = {
            str(k): Path(v) for k, v in (run.get("service_logs") or {}).items()
        } or req.service_logs
        if run.get("deploy"):
            req.deploy = settings_from_record(run["deploy"], req.resume_deploy_vars)
        elif req.resume_deploy_vars:
            raise DeployError("--deploy-var on --resume: this run did not deploy")
        first = load_prediction(run_dir.path)
        if first is not None:  # a campaign's later points predict from the same profiles
            req.predict_profiles = first.profiles
        return run_dir
    if req.seed is None:
        req.seed = secrets.randbits(32)
    req.options = dataclasses.replace(req.options, seed=req.seed)
    run = {
        "arms": [_arm_record(a) for a in req.arms]
        or [{"name": "baseline", "url": "embedded"}, {"name": "offload", "url": "embedded"}],
        "embedded": not req.arms,
        "scenarios": [s.name for s in req.scenarios],
        "options": req.options.to_dict(),
        "scale": req.scale,
        "sim": req.sim.__dict__ if not req.arms else None,
        "seed": req.seed,
        "slo": req.slo,
        "deploy": deploy_record(req.deploy) if req.deploy else None,
        **(
            {"service_logs": {k: str(v) for k, v in req.service_logs.items()}}
            if req.service_logs
            else {}
        ),
    }
    run_dir.create(run, req.scenarios, req.overwrite)
    req.scenarios = run_dir.load_run()[1]  # as --resume reads them (a trace: the run's copy)
    return run_dir


def _arm_record(arm: Arm) -> dict[str, Any]:
    """An arm as run.json keeps it; `more_urls` only for an arm of several instances, so a
    one-endpoint run's file reads as before."""
    out: dict[str, Any] = {"name": arm.name, "url": arm.url, "model": arm.model}
    if arm.more_urls:
        out["more_urls"] = list(arm.more_urls)
    return out


@contextlib.contextmanager
def _arms(req: AbTestRequest, run_dir: RunDir) -> Iterator[list[Arm]]:
    if req.arms:
        yield req.arms
        return
    engines = EmbeddedEngines(
        run_dir.path, kv_capacity_scale=req.scale, profile=req.sim, fresh_storage=not req.resume
    )
    with engines as arms:
        yield arms


def run_ab_test(req: AbTestRequest, hooks: Hooks) -> Outcome:
    """Run (or resume) and report. Raises ArmUnreachable / ExperimentError / RunDirError /
    EngineStartError before measuring anything; never loses records once measuring began."""
    run_dir = prepare(req)
    predict_first(req, run_dir, hooks)
    if req.deploy is not None:
        hooks.prepare_arm = ArmDeployer(req.deploy, run_dir.path, hooks.on_segment)
    warnings: list[str] = []
    interrupted = False
    deploy_failure: DeployError | None = None
    try:
        with _arms(req, run_dir) as arms:
            exp = Experiment(run_dir, arms, req.scenarios, req.options, hooks)
            exp.service_logs = dict(req.service_logs) or (
                {} if req.arms else {a.name: embedded_log(run_dir.path, a.name) for a in arms}
            )
            try:
                asyncio.run(_run_with_sigint(exp))
            finally:
                warnings = exp.warnings
                interrupted = exp.interrupted
    except KeyboardInterrupt:
        interrupted = True
    except DeployError as exc:
        # the reports still say what was measured and which deploy stopped the run
        # (results.json `deploy`, status "incomplete"); the error then exits 2
        deploy_failure = exc
    results = build_results(
        run_dir, slo=req.slo, status="interrupted" if interrupted else "complete", warnings=warnings
    )
    hooks.write_reports(run_dir.path, results.doc, results.measured)
    if deploy_failure is not None:
        raise deploy_failure
    return Outcome(results, interrupted, warnings)


def predict_first(req: AbTestRequest, run_dir: RunDir, hooks: Hooks) -> None:
    """Write the model's prediction for the run into prediction.json before anything is
    measured (kvops.abtest.prediction); a resumed run keeps the one written first. A
    prediction that cannot be made is written as unavailable, with why: it never stops a run."""
    if load_prediction(run_dir.path) is not None:
        return
    records = run_dir.records_path
    if records.is_file() and records.stat().st_size > 0:
        return  # a run from before predictions: one made now would not be made first
    hooks.on_segment("predicting the run with the simulator")
    profiles = req.predict_profiles
    arm_names = [a.name for a in req.arms] or ["baseline", "offload"]
    try:
        profiles = profiles or arm_profiles(req.sim)
        prediction = predict_deltas(
            req.scenarios, arm_names, req.options, profiles, None if req.arms else req.sim,
            req.scale,
        )  # fmt: skip
    except KvopsError as exc:  # a profile that does not load, no KV memory left, ...
        if profiles is None:
            hooks.warn(f"no prediction: {exc}")
            return
        prediction = RunPrediction(profiles, unavailable=str(exc))
    save_prediction(run_dir.path, prediction)


async def _run_with_sigint(exp: Experiment) -> None:
    """First Ctrl-C: stop releasing requests and let in-flight streams finish (grace period).
    Second Ctrl-C: the default handler interrupts at once."""
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        exp.hooks.warn("interrupted: no new requests; waiting briefly for streams in flight")
        exp.stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
    try:
        await exp.run()
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
