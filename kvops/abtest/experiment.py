"""Orchestrating an A/B run: arms x trials (ABBA order) x iterations, with warm-up and resets.

Why this shape:
- ABBA: trial t runs the arms in order when t is even and reversed when odd, so a slow drift of
  the machine (thermal, background load, growing storage) falls equally on both arms.
- Arms run one at a time: two engines loaded together would compete for the same host.
- Warm-up: the first `warmup_iterations` of each trial are sent and recorded but flagged, and
  metrics leave them out: they measure cache filling, not the steady state being compared.
- Cache resets (`/reset_prefix_cache`, where the server has it) before each segment give every
  segment the same cold GPU cache; a server without it gets a note, not a failure.
- Every record is written as it completes; a segment is marked done only when it finished, so
  `--resume` re-runs exactly the unfinished segments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvops.abtest.arms import (
    Arm,
    ArmInfo,
    arm_differences,
    emission_lag,
    fetch_arm_info,
    fetch_counters,
    instance_differences,
    reset_prefix_cache,
)
from kvops.abtest.engine_counters import Counters, add_counters, counter_delta
from kvops.abtest.failed_loads import log_size, read_log_since
from kvops.abtest.leakage import warm_tier_warnings
from kvops.abtest.result_types import RunResults
from kvops.abtest.routing import route_requests
from kvops.abtest.rundir import RunDir
from kvops.errors import KvopsError
from kvops.loadgen.calibrate import learn_alphabet
from kvops.loadgen.client import Endpoint, make_session
from kvops.loadgen.runner import (
    ClientStats,
    Labels,
    LoopLagMonitor,
    Runner,
    WireRequest,
    wire_requests,
    wire_sessions,
)
from kvops.loadgen.workers import WorkerPool
from kvops.workload.generate import Alphabet, make_prefixes, plan_iteration
from kvops.workload.record import JsonlWriter, RequestRecord
from kvops.workload.replay import load_trace, plan_trace
from kvops.workload.schedule import arrival_offsets_s, batch_groups
from kvops.workload.spec import WorkloadSpec
from kvops.workload.trace import Trace

# Measured records by scenario, then by arm (`kvops.abtest.results.Results.measured`).
MeasuredRecords = dict[str, dict[str, list[RequestRecord]]]


class ExperimentError(KvopsError, RuntimeError):
    """A run that cannot start as configured (clear message, exit code 2)."""


@dataclass
class Options:
    trials: int = 4
    warmup_iterations: int = 1
    reset_cache: bool = True
    timeout_s: float = 600.0
    stall_timeout_s: float = 60.0
    vocab_size: int | None = None
    text_prompts: bool = False
    api: str = "completions"
    grace_s: float = 5.0
    workers: int = 1
    seed: int = 0  # the run seed: prompts and send order (fresh per run; see generate.py)
    # how an arm of several instances spreads its requests (kvops.abtest.routing.ROUTES)
    route: str = "round-robin"

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def segment_plan(
    scenarios: list[WorkloadSpec], arms: list[Arm], trials: int
) -> list[tuple[WorkloadSpec, int, Arm]]:
    """(scenario, trial, arm) in execution order: ABBA within each scenario."""
    plan: list[tuple[WorkloadSpec, int, Arm]] = []
    for spec in scenarios:
        for trial in range(trials):
            order = arms if trial % 2 == 0 else list(reversed(arms))
            plan.extend((spec, trial, arm) for arm in order)
    return plan


def trial_warnings(trials: int) -> list[str]:
    """What the trial count cannot support: a verdict needs two paired trials, and ABBA cancels
    a linear drift of the host only over an even number of them."""
    if trials == 1:
        return [
            "--trials 1: one trial per arm gives figures but no verdict (not enough trials); "
            "use an even number, 2 or more"
        ]
    if trials % 2:
        return [
            f"--trials {trials} is odd: ABBA order cancels a linear drift of the host only over "
            "an even number of trials, so drift falls unevenly on the arms"
        ]
    return []


@dataclass
class Hooks:
    """How the run talks to whoever is watching (the CLI's progress bar and stderr)."""

    on_start: Callable[[int], None] = lambda total: None
    on_record: Callable[[RequestRecord], None] = lambda rec: None
    on_segment: Callable[[str], None] = lambda text: None
    warn: Callable[[str], None] = lambda text: None
    # Puts an arm in place before its info is read and before each of its segments (except
    # the first measured, when its info deploy is still untouched: Experiment._arm_infos)
    # (`--deploy`: kvops.abtest.deploy.ArmDeployer); None when the arms are already running.
    prepare_arm: Callable[[Arm], Awaitable[None]] | None = None
    # Writes the run's human reports (report.md, report.html, plots) from the results
    # document once the run ends, interrupted or failed included: the CLI passes
    # `kvops.report.abtest_files.write_reports`. The experiment renders nothing itself, so
    # the renderers may read its document without a circle between the two packages.
    write_reports: Callable[[Path, RunResults, MeasuredRecords], object] = (
        lambda run_dir, doc, measured: None
    )


@dataclass
class Experiment:
    run_dir: RunDir
    arms: list[Arm]
    scenarios: list[WorkloadSpec]
    options: Options
    hooks: Hooks = field(default_factory=Hooks)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    infos: list[ArmInfo] = field(default_factory=list)
    # arm name -> every instance's info, the first one first (the arm's own info is the first)
    instance_infos: dict[str, list[ArmInfo]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False
    stats: ClientStats = field(default_factory=ClientStats)
    warm_arms: set[str] = field(default_factory=set)
    # the arm the prepare hook put in place last, with nothing served since (see _arm_infos)
    _fresh_arm: Arm | None = None
    # scenario name -> the trace it replays (`--trace`), read from the run directory's copy
    _traces: dict[str, Trace] = field(default_factory=dict)
    # arm name -> its service log, read per segment for failed KV loads (kvops.abtest.failed_loads)
    service_logs: dict[str, Path] = field(default_factory=dict)

    def _warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)
            self.hooks.warn(text)

    async def run(self) -> None:
        """Run every unfinished segment. Raises ArmUnreachable / ExperimentError before the
        first request when arms or workloads are unusable."""
        attempt = self.run_dir.add_attempt()
        opts = self.options
        done = self.run_dir.done_segments()
        todo = [
            (spec, trial, arm)
            for spec, trial, arm in segment_plan(self.scenarios, self.arms, self.options.trials)
            if (spec.name, trial, arm.name) not in done
        ]
        async with make_session() as session:
            self.infos = await self._arm_infos(session, todo[0][2] if todo else None)
            await self._more_instances(session)
            self.run_dir.record_arms(attempt, [self._arm_record(i) for i in self.infos])
            for w in arm_differences(self.infos):
                self._warn(w)
            for w in instance_differences(self.instance_infos):
                self._warn(w)
            for w in trial_warnings(self.options.trials):
                self._warn(w)
            self._check_fit()
            alphabet = await self._alphabet(session, self.infos[0])
            self.hooks.on_start(sum(s.total_requests for s, _, _ in todo))
            prefixes = {s.name: make_prefixes(s, alphabet, opts.seed) for s in self.scenarios}
            self._traces = {
                s.name: load_trace(Path(s.trace), s.hash_block_tokens)
                for s in self.scenarios
                if s.trace is not None
            }
            for trace in self._traces.values():
                for w in trace.warnings:  # unused fields: the replay differs there
                    self._warn(w)
            with self.run_dir.record_writer() as records, self.run_dir.segment_writer() as segs:
                for spec, trial, arm in todo:
                    if self.stop.is_set():
                        self.interrupted = True
                        break
                    await self._segment(
                        session,
                        spec,
                        trial,
                        arm,
                        alphabet,
                        prefixes[spec.name],
                        attempt,
                        records,
                        segs,
                    )
            if self.stop.is_set():
                self.interrupted = True

    async def _arm_infos(
        self, session: aiohttp.ClientSession, first_to_measure: Arm | None
    ) -> list[ArmInfo]:
        """Each arm's info, in arm order. With a prepare hook (`--deploy`) each arm is put in
        place before its info is read, the arm measured first last, and the prompt alphabet is
        learned (its probe serves one short prompt) before that last deploy: between it and
        the first segment only reads reach the server (/v1/models, /metrics; nothing is
        served, so no KV is stored), so the segment uses the deploy as it is instead of
        running the same play again."""
        if self.hooks.prepare_arm is None:
            return [await fetch_arm_info(session, arm) for arm in self.arms]
        order = sorted(self.arms, key=lambda arm: arm is first_to_measure)
        by_name: dict[str, ArmInfo] = {}
        for arm in order:
            await self.hooks.prepare_arm(arm)
            by_name[arm.name] = info = await fetch_arm_info(session, arm)
            # an arm of several hosts: every instance read while this arm's deploy is in place
            # (the next arm's deploy switches them all)
            await self._read_more_instances(session, arm, info)
            if arm is order[0] and info.model:
                await self._alphabet(session, info)
        self._fresh_arm = first_to_measure
        return [by_name[arm.name] for arm in self.arms]

    async def _more_instances(self, session: aiohttp.ClientSession) -> None:
        """The infos of every arm's further instances (`--arm NAME=URL1,URL2`); an instance
        that does not answer stops the run before any request, as a one-URL arm does."""
        for arm, info in zip(self.arms, self.infos, strict=True):
            if arm.name not in self.instance_infos:  # --deploy read them with its arm's deploy
                await self._read_more_instances(session, arm, info)

    async def _read_more_instances(
        self, session: aiohttp.ClientSession, arm: Arm, info: ArmInfo
    ) -> None:
        more = [
            await fetch_arm_info(session, Arm(arm.name, url, arm.model)) for url in arm.more_urls
        ]
        self.instance_infos[arm.name] = [info, *more]

    def _instances(self, arm: Arm) -> list[ArmInfo]:
        return self.instance_infos.get(arm.name) or [self._info(arm)]

    def _arm_record(self, info: ArmInfo) -> dict[str, object]:
        """An arm's entry of arms.json: its first instance's info, and every instance's when
        it has several (ArmDescription reads the keys it knows and ignores `instances`)."""
        out: dict[str, object] = info.to_dict()
        instances = self.instance_infos.get(info.name, [])
        if len(instances) > 1:
            out["instances"] = [i.to_dict() for i in instances]
        return out

    def _check_warm_tier(self, spec: WorkloadSpec, arm: Arm, seen: list[RequestRecord]) -> None:
        """Say it the moment it shows (after the warm-up iteration, before measuring); the
        results document repeats it from the records."""
        if arm.name in self.warm_arms:
            return
        for text in warm_tier_warnings(seen, spec.prefix_tokens, spec.name):
            self.warm_arms.add(arm.name)
            self.hooks.warn(text)

    def _info(self, arm: Arm) -> ArmInfo:
        return next(i for i in self.infos if i.name == arm.name)

    def _check_fit(self) -> None:
        for info in self.infos:
            if not info.model:
                raise ExperimentError(f"arm {info.name}: /v1/models lists no model")
            for other in self.instance_infos.get(info.name, [])[1:]:
                if other.model != info.model:
                    raise ExperimentError(
                        f"arm {info.name}: {other.url} serves {other.model}, {info.url} "
                        f"serves {info.model}; an arm's instances must serve one model "
                        "(or give --model)"
                    )
            for spec in self.scenarios:
                need = spec.prompt_tokens + spec.output_tokens
                if info.max_model_len is not None and need > info.max_model_len:
                    raise ExperimentError(
                        f"scenario {spec.name}: prompt + output = {need} tokens exceeds arm "
                        f"{info.name}'s max_model_len {info.max_model_len}; use --scale"
                    )

    async def _alphabet(self, session: aiohttp.ClientSession, first: ArmInfo) -> Alphabet:
        """The run's prompt alphabet: the saved one, or learned from ``first`` and saved."""
        saved = self.run_dir.load_alphabet()
        if saved is not None:
            return saved[0]
        endpoint = Endpoint(first.url, first.model or "", self.options.api)
        alphabet, how = await learn_alphabet(
            session, endpoint, vocab_size=self.options.vocab_size,
            text_prompts=self.options.text_prompts or self.options.api == "chat",
        )  # fmt: skip
        self.run_dir.save_alphabet(alphabet, how)
        self.hooks.on_segment(f"prompts: {how}")
        return alphabet

    async def _segment(
        self,
        session: aiohttp.ClientSession,
        spec: WorkloadSpec,
        trial: int,
        arm: Arm,
        alphabet: Alphabet,
        prefixes: list[list[int] | str],
        attempt: str,
        records: JsonlWriter,
        segs: JsonlWriter,
    ) -> None:
        info = self._info(arm)
        instances = self._instances(arm)
        opts = self.options
        self.hooks.on_segment(f"{spec.name}: trial {trial + 1}/{opts.trials}, arm {arm.name}")
        if self.hooks.prepare_arm is not None and self._fresh_arm is not arm:
            await self.hooks.prepare_arm(arm)
        self._fresh_arm = None
        for inst in instances if opts.reset_cache else []:
            if not await reset_prefix_cache(session, inst):
                where = f" ({inst.url})" if len(instances) > 1 else ""
                self._warn(
                    f"arm {arm.name}{where}: no usable /reset_prefix_cache (vLLM needs "
                    "VLLM_SERVER_DEV_MODE=1); caches were not reset between trials"
                )
        stats = ClientStats()
        lags_before = [await emission_lag(session, i) for i in instances]

        seen: list[RequestRecord] = []
        counters_before: list[Counters | None] | None = None

        async def scrape_counters() -> list[Counters | None]:
            return [await fetch_counters(session, i) for i in instances]

        log_path = self.service_logs.get(arm.name)
        log_from = 0  # where the measured part of the segment starts in the service log

        def on_record(rec: RequestRecord) -> None:
            records.write_record(rec)
            seen.append(rec)
            self.hooks.on_record(rec)

        runner = Runner(
            session, Endpoint(info.url, info.model or "", opts.api),
            on_record=on_record,
            timeout_s=opts.timeout_s, stall_timeout_s=opts.stall_timeout_s,
            stop=self.stop, grace_s=opts.grace_s, stats=stats,
        )  # fmt: skip
        monitor = LoopLagMonitor(stats)
        try:
            # every request is built and encoded before the first is sent (as vLLM's bench
            # does): preparing iteration 2 must not count as serving time or client lag
            replay = None
            if spec.trace is not None:
                replay = wire_sessions(
                    plan_trace(
                        self._traces[spec.name], alphabet, trial=trial, run_seed=opts.seed,
                        scale=spec.trace_scale,
                    ),
                    runner.endpoint,
                )  # fmt: skip
            plans = [
                wire_requests(
                    plan_iteration(
                        spec, alphabet, prefixes, trial=trial, iteration=i, run_seed=opts.seed
                    ),
                    runner.endpoint,
                )
                for i in range(spec.iterations if replay is None else 0)
            ]
            if len(instances) > 1:
                wires = [w for plan in plans for w in plan]
                if replay is not None:
                    wires = [t.wire for s in replay for t in s.turns]
                self._route(wires, instances, runner.endpoint)
            monitor.start()
            pool = (
                WorkerPool(opts.workers, runner.endpoint, timeout_s=opts.timeout_s,
                           stall_timeout_s=opts.stall_timeout_s, grace_s=opts.grace_s)
                if opts.workers > 1 and replay is None else None
            )  # fmt: skip
            try:
                if pool is not None:
                    await pool.start()
                if replay is not None:
                    # a trace is replayed whole, once per segment, with no warm-up: its own
                    # reuse, from a cold cache, is what is measured
                    counters_before = await scrape_counters()
                    log_from = log_size(log_path) if log_path is not None else 0
                    labels = Labels(arm.name, spec.name, trial, attempt, False)
                    await runner.run_sessions(replay, labels)
                    if self.stop.is_set():
                        return
                for iteration, planned in enumerate(plans):
                    warm = iteration < opts.warmup_iterations
                    if iteration == opts.warmup_iterations:
                        # the engine's token counters over the measured iterations only
                        counters_before = await scrape_counters()
                        log_from = log_size(log_path) if log_path is not None else 0
                    labels = Labels(arm.name, spec.name, trial, attempt, warm)
                    await self._iteration(spec, trial, iteration, planned, labels, runner, pool)
                    self._check_warm_tier(spec, arm, seen)
                    if self.stop.is_set():
                        return
            finally:
                if pool is not None:
                    pool.close()
        finally:
            await monitor.stop()
            self.stats.merge(stats)
        summary = stats.summary()
        summary["workers"] = opts.workers
        seg: dict[str, object] = {
            "status": "done", "scenario": spec.name, "trial": trial, "arm": arm.name,
            "attempt": attempt, "client": summary,
        }  # fmt: skip
        counters_after = await scrape_counters()
        if counters_before is not None:
            # per instance, then summed: the arm's counters are its instances' together
            deltas = {
                i.url: counter_delta(before, after)
                for i, before, after in zip(instances, counters_before, counters_after, strict=True)
                if before is not None and after is not None
            }
            if deltas:
                total: Counters = {}
                for delta in deltas.values():
                    total = add_counters(total, delta)
                seg["engine_counters"] = total
            if len(instances) > 1:
                seg["instance_counters"] = deltas
        if log_path is not None:
            seg["service_log"] = await asyncio.to_thread(read_log_since, log_path, log_from)
        lags = [
            (after[0] - before[0], after[1] - before[1])
            for before, after in zip(
                lags_before, [await emission_lag(session, i) for i in instances], strict=True
            )
            if before is not None and after is not None
        ]
        if lags:
            # how late the simulated engine sent its tokens against the model's schedule
            seg["engine_lag"] = {
                "sum_s": sum(lag[0] for lag in lags),
                "steps": sum(lag[1] for lag in lags),
            }
        segs.write_obj(seg)

    def _route(self, wires: list[WireRequest], instances: list[ArmInfo], first: Endpoint) -> None:
        """Give each request of the segment its instance (`--route`), in send order."""
        endpoints = [Endpoint(i.url, first.model, first.api) for i in instances]
        prefix_ids = [w.request.prefix_id for w in wires]
        chosen = route_requests(prefix_ids, len(endpoints), self.options.route)
        for wire, k in zip(wires, chosen, strict=True):
            wire.endpoint = endpoints[k]

    async def _iteration(
        self,
        spec: WorkloadSpec,
        trial: int,
        iteration: int,
        planned: list[WireRequest],
        labels: Labels,
        runner: Runner,
        pool: WorkerPool | None,
    ) -> None:
        """Batch mode: groups of `batch_size`, each after the previous one completed. Rate
        mode: the whole iteration on its arrival schedule under the concurrency cap."""
        if spec.rate is None:
            groups = [[planned[i] for i in g] for g in batch_groups(len(planned), spec.batch_size)]
            schedule: list[tuple[list[WireRequest], list[float] | None]] = [
                (g, None) for g in groups
            ]
        else:
            offsets = arrival_offsets_s(spec, len(planned), key=(trial, iteration))
            schedule = [(planned, offsets)]
        for group, offs in schedule:
            if self.stop.is_set():
                return
            if pool is None:
                await runner.run_group(group, labels, offs, spec.max_concurrency)
                continue
            watcher = asyncio.create_task(self._forward_stop(pool))
            try:
                await pool.run_group(
                    group, labels, runner.on_record, offs, spec.max_concurrency, runner.stats
                )
            finally:
                watcher.cancel()

    async def _forward_stop(self, pool: WorkerPool) -> None:
        await self.stop.wait()
        pool.stop_event.set()
