"""`kvops ab-test`: does offload pay for this traffic? Baseline vs offload, with CIs."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvops.abtest.arms import parse_arm
from kvops.abtest.campaign import (
    Campaign,
    is_campaign,
    parse_sweep,
    point_spec,
    run_campaign,
)
from kvops.abtest.campaign_presets import CAMPAIGN_PRESETS, load_campaign_preset
from kvops.abtest.deploy import DeploySettings, deploy_arms
from kvops.abtest.embedded import SimProfile
from kvops.abtest.experiment import Hooks, Options
from kvops.abtest.metrics import parse_slo
from kvops.abtest.prediction import PredictionProfiles
from kvops.abtest.routing import ROUTES
from kvops.abtest.session import AbTestRequest, run_ab_test
from kvops.cli.spec_help import workload_reference
from kvops.errors import RC
from kvops.lab.config import find_project_root
from kvops.report.abtest_files import write_reports
from kvops.report.abtest_table import render_table
from kvops.report.campaign_plots import write_campaign_plots
from kvops.report.host_text import markup
from kvops.report.prediction import summary_line
from kvops.sim.lmcache_config import DEFAULT_GDS_BUFFER_MIB
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.workload.record import RequestRecord
from kvops.workload.replay import load_trace, trace_spec
from kvops.workload.spec import (
    PRESET_NAMES,
    REQUEST_ORDERS,
    WorkloadSpec,
    load_preset,
    load_spec_file,
)

EXAMPLES = """
\b
Examples:
  kvops ab-test                                   # embedded sim engines, multi-shared-prefix
  kvops ab-test --scenario all --scale 0.1        # the three seed cases in one table (make demo)
  kvops ab-test --arm baseline=http://gpu1:8000 --arm offload=http://gpu2:8000 \\
      --scenario multi-shared-prefix --trials 4 --out runs/ab-gpu1
  kvops ab-test --arm baseline=URL --arm offload=URL --workload my-traffic.yaml --json
  kvops ab-test --deploy -i inventories/prod --limit gpu1 --scenario multi-shared-prefix
                                                  # switch gpu1 baseline/offload per segment
  kvops ab-test --arm baseline=URL --arm offload=URL --trace my-sessions.jsonl
                                                  # your own traffic (see TRACES)
  kvops ab-test --resume runs/ab-gpu1             # continue an interrupted run
  kvops ab-test --arm baseline=http://gpu1:8000 \
      --arm offload=http://gpu2:8000,http://gpu3:8000 --route prefix-handoff
                                                  # a fleet sharing one KV store (see FLEETS)
\b
Exit codes: 0 all requests succeeded; 1 some requests failed (counted per arm, records kept);
2 usage error or an arm unreachable at start; 130 interrupted (Ctrl-C; results still written).
"""

WORKLOAD_REFERENCE = workload_reference("--workload FILE")

FLEET_HELP = """
\b
FLEETS (--arm NAME=URL1,URL2,...): one arm served by several vLLM instances, e.g. offload
  hosts sharing one GDS directory on the export. Each segment resets every instance, reads
  every instance's /metrics before and after, and sends each request to one instance:
    --route round-robin      request k to instance k mod N (a prefix lands anywhere)
    --route prefix-affinity  every request of prefix p to instance p mod N (no reuse crosses)
    --route prefix-handoff   each reuse of a prefix to the next instance (every reuse crosses)
  results.json gives each such arm `instances` (requests, TTFT, hit tokens per endpoint, from
  each instance's own counters) and `cross_instance_hit_share`: the share of the arm's
  offload hits loaded on an instance other than the one that computed the prefix first (the
  field `kvops sim run --instances N` predicts). With --deploy, a --limit that selects several
  hosts makes every arm a fleet of them, all switched together by one deploy.yml run.
"""

TRACE_HELP = """
\b
TRACES (--trace FILE): one JSON object per line, the formats `kvops advise` reads:
  {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2]}
  (Mooncake: timestamp in ms, hash_ids name 512-token blocks, equal ids = equal prefix;
  also prompt_token_ids, prompt/text, arrival_s in s, output_tokens/max_tokens).
  Sessions (multi-turn, agentic; as AIPerf and Mooncake write them):
  {"session_id": "s1", "timestamp": 0, "input_length": 900, "output_length": 80, "hash_ids": [7]}
  {"session_id": "s1", "delay": 2000, "input_length": 300, "output_length": 60, "hash_ids": [9]}
  A later turn is sent `delay` ms after the previous turn's answer completed (closed loop),
  and its hash_ids/input_length are only its NEW tokens: the prompt sent is the whole
  context (earlier prompts, answers as tokens of their length, then the new tokens).
\b
  Each trial replays the whole trace in each arm (ABBA), cold, with no warm-up iteration;
  prompts are the same in both arms of a trial and fresh in each trial. --scale shrinks
  every length. A field kvops does not use is a warning; a line it cannot place in time
  (no timestamp nor delay, a delay outside a session) is an error naming the line.
"""


def _scenarios(
    scenario: str | None,
    workload: Path | None,
    scale: float,
    trace: Path | None = None,
    hash_block_tokens: int = 512,
) -> list[WorkloadSpec]:
    if sum(x is not None for x in (scenario, workload, trace)) > 1:
        raise click.UsageError("give one of --scenario, --workload and --trace")
    if trace is not None:
        return [_trace_spec(trace, hash_block_tokens, scale, None)]
    if workload is not None:
        spec = load_spec_file(workload)
        if spec.trace is not None:
            trace_path = Path(spec.trace)
            return [_trace_spec(trace_path, spec.hash_block_tokens, scale, spec.name)]
        specs = [spec]
    elif scenario in (None, "all"):
        specs = [load_preset(n) for n in (PRESET_NAMES if scenario == "all" else PRESET_NAMES[2:])]
    else:
        specs = [load_preset(str(scenario))]
    return [s.scaled(scale) for s in specs]


def _trace_spec(path: Path, hash_block_tokens: int, scale: float, name: str | None) -> WorkloadSpec:
    """The scenario replaying a trace, read (strictly) now so that a bad line stops the run
    before any engine starts (the run warns of what the reader noticed when it starts)."""
    return trace_spec(path, load_trace(path, hash_block_tokens), scale, name)


@click.command("ab-test", epilog=EXAMPLES + FLEET_HELP + TRACE_HELP + WORKLOAD_REFERENCE)
@click.option(
    "--arm",
    "arms",
    multiple=True,
    metavar="NAME=URL",
    help="An arm to compare (two or more; the first is the baseline). NAME=URL1,URL2,...: "
    "one arm of several instances (see FLEETS). None: two embedded sim engines, offload off "
    "and on.",
)
@click.option(
    "--route",
    type=click.Choice(ROUTES),
    default=None,
    help="How an arm of several URLs spreads its requests over them (see FLEETS) "
    "[default: round-robin].",
)
@click.option(
    "--service-log",
    "service_logs",
    multiple=True,
    metavar="ARM=FILE",
    help="An arm's service log (e.g. journalctl -o cat -f -u vllm > FILE, or the unit's "
    "log file), read per segment for failed KV loads (vLLM's \"Recovered from KV load "
    "failure\", LMCache's failed reads): reported beside the verdict, which includes them. "
    "The embedded engines' own logs are read without it.",
)
@click.option(
    "--scenario",
    type=click.Choice([*PRESET_NAMES, "all"]),
    default=None,
    help="Preset workload, or all three (default: multi-shared-prefix).",
)
@click.option(
    "--workload",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Workload spec YAML (strict: unknown keys are errors).",
)
@click.option(
    "--trace",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="Replay this JSONL trace in every arm and trial (Mooncake/AIPerf lines; session "
    "traces as conversations, closed loop): see TRACES below.",
)
@click.option(
    "--hash-block-tokens",
    type=click.IntRange(1),
    default=512,
    show_default=True,
    help="--trace: tokens per hash_ids block (512 in Mooncake traces).",
)
@click.option(
    "--scale",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="Shrink every token length by this factor (embedded engines shrink their KV cache alike).",
)
@click.option(
    "--trials",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Trials per arm, in ABBA order. Each trial is one paired observation: a verdict needs "
    "2 or more, and the interval narrows with more (an even number cancels linear drift).",
)
@click.option(
    "--warmup-iterations",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Leading iterations of each trial that are sent but not measured (none with a "
    "trace: it is replayed whole, cold).",
)
@click.option(
    "--reset-cache/--no-reset-cache",
    default=True,
    show_default=True,
    help="POST /reset_prefix_cache before each segment (when the server has it).",
)
@click.option(
    "--model",
    default=None,
    help="Model name for every arm (default: the first model each arm lists on /v1/models).",
)
@click.option(
    "--vocab-size",
    type=click.IntRange(2),
    default=None,
    help="Model vocabulary size for token-id prompts (default: learned via /tokenize).",
)
@click.option(
    "--text-prompts", is_flag=True, help="Send text calibrated via /tokenize instead of token ids."
)
@click.option(
    "--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0, min_open=True),
    default=600.0,
    show_default=True,
    help="Per-request limit, seconds.",
)
@click.option(
    "--stall-timeout",
    "stall_timeout_s",
    type=click.FloatRange(0, min_open=True),
    default=60.0,
    show_default=True,
    help="Longest silence within a stream, seconds.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Load-generator processes (default: 1, or up to 4 by CPU count when a release group "
    "holds 256 or more requests; more help when the client reports itself the bottleneck).",
)
@click.option(
    "--slo",
    default=None,
    metavar="ttft:N,tpot:N",
    help="Goodput SLOs in ms, vllm bench serve's --goodput syntax (ttft, tpot, e2el; "
    "ttft_ms=N also accepted): request_goodput_req_s counts requests meeting all.",
)
@click.option(
    "--seed",
    type=click.IntRange(0),
    default=None,
    help="Run seed for prompts (suffixes, unique prompts, prefixes) and request order. Default: "
    "fresh per run, recorded in run.json, so a persistent KV tier never holds this run's "
    "prompts from an earlier one; pass a recorded seed to repeat a run exactly.",
)
@click.option(
    "--request-order",
    type=click.Choice(REQUEST_ORDERS),
    default=None,
    help="Send order within an iteration: shuffled (seeded, as vllm bench serve) or cyclic "
    "(prefix 0, 1, ..., N-1, 0, ...: LRU's worst case). Default: the workload's "
    "(presets: shuffled).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Run directory (default: runs/ab-test-<UTC time>).",
)
@click.option("--overwrite", is_flag=True, help="Replace a previous run in --out.")
@click.option(
    "--resume",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Continue the interrupted run in this directory.",
)
@click.option(
    "--deploy",
    is_flag=True,
    help="Before each segment, put the arm's variant on the --limit host(s) with "
    "playbooks/deploy.yml (GDS directory cleared); arms are named after variants; several "
    "hosts make each arm a fleet of them (see FLEETS).",
)
@click.option(
    "-i",
    "--inventory",
    "inventories",
    multiple=True,
    help="Ansible inventory for --deploy [default: Ansible's own: ANSIBLE_INVENTORY, ansible.cfg].",
)
@click.option(
    "--limit",
    default=None,
    help="The inventory host(s) --deploy switches (an Ansible limit pattern).",
)
@click.option(
    "--deploy-variants",
    default="baseline,offload",
    show_default=True,
    help="Arms of --deploy, in order (the first is the baseline): baseline, offload, "
    "offload_cpu_gds, offload_mp.",
)
@click.option(
    "--deploy-var",
    "deploy_vars",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra variable for deploy.yml (VALUE parsed as JSON when it is JSON). A secret-named "
    "one (token, key, password) is not kept in run.json: give it again with --resume. Better: "
    "keep secrets in the inventory, vaulted.",
)
@click.option(
    "--sweep",
    default=None,
    metavar="PARAM=V1,V2,...",
    help="A campaign: one ABBA A/B per value of PARAM (rate, max_concurrency, num_prefixes, "
    "prefix_tokens, output_tokens; lengths before --scale), each a sub-run of --out, then "
    "the crossover where offload starts to help (campaign.json, campaign.md). --resume DIR "
    "continues it point by point.",
)
@click.option(
    "--sweep-preset",
    type=click.Choice(CAMPAIGN_PRESETS),
    default=None,
    help="A campaign preset for a reference case (its workload and --sweep; "
    "kvops/workload/presets/campaigns/), e.g. multi-shared-prefix over num_prefixes=5..40.",
)
@click.option(
    "--predict-gpu",
    default=None,
    metavar="NAME|YAML",
    help="GPU profile the prediction written before the run uses (default: --sim-gpu), e.g. "
    "a `kvops advise --calibrate` result.",
)
@click.option(
    "--predict-storage",
    default=None,
    metavar="NAME|YAML",
    help="Storage profile the prediction uses (default: --sim-storage).",
)
@click.option(
    "--storage-from-evidence",
    "evidence_dir",
    default=None,
    type=click.Path(path_type=Path),
    help="Predict with the storage measured by gdsio in a `kvops validate --storage-bench "
    "--save-evidence DIR` bundle.",
)
@click.option("--json", "as_json", is_flag=True, help="Print results.json to stdout.")
@click.option("--sim-gpu", default="h100-sxm-80gb", show_default=True)
@click.option("--sim-model", default="llama-3.1-8b", show_default=True)
@click.option("--sim-storage", default="ontap-nfs-rdma-200g", show_default=True)
@click.option(
    "--sim-time-scale",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Embedded engines: wall seconds per simulated second (default: 0.025/--scale, "
    "within 0.1..1, so a smaller workload runs slower-than-life and the host's own overhead "
    "stays small against the modelled times).",
)
@click.option(
    "--sim-gds-buffer-mib",
    type=click.IntRange(0),
    default=DEFAULT_GDS_BUFFER_MIB,
    show_default=True,
    help="Embedded offload engine: LMCache gds_buffer_size, MiB of GPU memory. Both engines "
    "get the same KV memory, what the default utilisation leaves once the buffer is on the GPU "
    "(as the vllm_lmcache role gives every variant the same KV memory).",
)
@click.option(
    "--sim-cpu-tier-gb",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Embedded offload engine: an LMCache CPU DRAM tier of this size in front of GDS "
    "(local_cpu + max_local_cpu_size; read first, written through; 0 = none).",
)
def ab_test(**kw: Any) -> RC:
    """Compare serving with and without KV-cache offload on the same workload.

    Runs the workload against each arm over several trials (ABBA order), one arm at a time,
    and reports each arm's vLLM-bench-serve metrics, each delta with a 95% interval from the
    paired trials and a verdict: offload helps / hurts / no significant difference (not enough
    trials below 2; invalid when an arm's requests failed). Every request is recorded
    as it completes in the run directory, with the spec, arm URLs and /version answers.
    """
    err = Console(stderr=True)
    out = Console(width=None if sys.stdout.isatty() else 120)
    args = _with_sweep_preset(CliArgs(**kw))
    campaign: Campaign | None = None
    try:
        if args.resume is not None and is_campaign(args.resume):
            campaign = Campaign.load(args.resume)
            req = AbTestRequest(out=args.resume)
        else:
            req = _request(args)
            campaign = _campaign(args, req) if args.sweep else None
    except ValueError as exc:  # a bad --arm, --slo or workload spec (WorkloadSpecError)
        raise click.UsageError(str(exc)) from None
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(), console=err,
        transient=True,
    )  # fmt: skip
    task = progress.add_task("starting", total=None, errors=0)
    errors = [0]

    def on_record(rec: RequestRecord) -> None:
        errors[0] += 0 if rec.ok else 1
        progress.update(task, advance=1, errors=errors[0])

    hooks = Hooks(
        on_start=lambda total: progress.update(task, total=total, description="requests"),
        on_record=on_record,
        # Warnings quote the servers (their versions, models, cache configuration) and a
        # progress description is markup too: both shown as text (kvops.report.host_text).
        on_segment=lambda text: progress.update(task, description=markup(text)),
        warn=lambda text: progress.console.print(f"[bold yellow]warning:[/] {markup(text)}"),
        write_reports=write_reports,
    )
    if campaign is not None:
        with progress:
            done = run_campaign(req, campaign, hooks, resume=args.resume is not None)
        plots, note = write_campaign_plots(req.out, done.campaign)
        _link_plots(req.out, plots, note)
        return _show_campaign(done.campaign, done.interrupted, req.out, args.as_json, out, err)
    with progress:
        outcome = run_ab_test(req, hooks)
    results = outcome.results.doc
    if args.as_json:
        click.echo(results.to_text(), nl=False)
        render_table(results, Console(stderr=True, width=None if sys.stderr.isatty() else 120))
    else:
        render_table(results, out)
    if results.prediction_score is not None:
        err.print(markup(summary_line(results.prediction_score)))
    err.print(
        f"[dim]run directory: {markup(req.out)} (results.json, report.md, report.html, "
        "records.jsonl)[/]"
    )
    if outcome.interrupted:
        return RC.INTERRUPTED
    return RC.FAIL if results.any_errors else RC.OK


def _campaign(a: CliArgs, req: AbTestRequest) -> Campaign:
    """The campaign of --sweep: the one workload, unscaled (the sweep sets lengths before
    --scale shrinks them, as the presets are written)."""
    assert a.sweep is not None
    sweep = parse_sweep(a.sweep)
    if a.trace is not None:
        raise ValueError("--sweep varies a workload spec; a --trace is replayed as recorded")
    if a.scenario == "all":
        raise ValueError("--sweep runs one workload: give --scenario NAME or --workload FILE")
    (spec,) = _scenarios(a.scenario, a.workload, 1.0)
    if spec.trace is not None:  # a workload YAML naming a trace
        raise ValueError("--sweep varies a workload spec; a trace is replayed as recorded")
    if a.request_order is not None:
        spec = dataclasses.replace(spec, request_order=a.request_order)
    for value in sweep.values:  # every point checked before the first is measured
        point_spec(spec, sweep, value).scaled(a.scale)
    return Campaign(sweep, spec, a.scale, req.seed)


def _with_sweep_preset(a: CliArgs) -> CliArgs:
    """--sweep-preset NAME: its workload preset and sweep, as if given by hand."""
    if a.sweep_preset is None:
        return a
    if a.sweep or a.scenario or a.workload or a.trace:
        raise click.UsageError("--sweep-preset sets the workload and the sweep: drop --sweep, "
                               "--scenario, --workload and --trace")  # fmt: skip
    preset = load_campaign_preset(a.sweep_preset)
    return dataclasses.replace(a, scenario=preset.scenario, sweep=preset.sweep)


def _predict_profiles(a: CliArgs) -> PredictionProfiles:
    """The profiles of the prediction written before the run: the arms' (--sim-*), or those
    given for it, or the storage measured in a validate bundle."""
    gpu, storage = a.predict_gpu or a.sim_gpu, a.predict_storage or a.sim_storage
    model_p, gpu_p, storage_p = load_model(a.sim_model), load_gpu(gpu), load_storage(storage)
    if a.evidence_dir is not None:  # ProfileError, StorageEvidenceError: usage errors
        from kvops.advise.storage_evidence import storage_from_evidence

        storage_p = storage_from_evidence(a.evidence_dir).profile
        source = f"storage measured in {a.evidence_dir}"
    elif a.predict_gpu or a.predict_storage:
        source = "--predict-gpu/--predict-storage"
    else:
        source = "the arms' profiles"
    return PredictionProfiles(model_p, gpu_p, storage_p, source)


def _link_plots(root: Path, plots: list[Path], note: str | None) -> None:
    """The campaign's plots (or why there are none) at the end of campaign.md."""
    md = root / "campaign.md"
    lines = [f"![{p.stem}]({p.relative_to(root).as_posix()})" for p in plots]
    lines += [f"_{note}_"] if note else []
    if md.is_file() and lines:
        md.write_text(md.read_text() + "\n" + "\n".join(lines) + "\n")


def _show_campaign(
    c: Campaign, interrupted: bool, root: Path, as_json: bool, out: Console, err: Console
) -> RC:
    if as_json:
        click.echo(json.dumps(c.to_json(), indent=2))
    table = Table(title=f"kvops ab-test campaign: {markup(c.spec.name)} over {c.sweep.param}")
    for head in (c.sweep.param, "verdict", "Δ throughput", "95% CI", "working set / GPU KV"):
        table.add_column(head)
    for p in c.points:
        table.add_row(
            c.sweep.label(p.value),
            markup((p.verdict or p.status) + (f" ({p.verdict_note})" if p.verdict_note else "")),
            "—" if p.delta_pct is None else f"{p.delta_pct:+.1f}%",
            "—" if p.ci95_low_pct is None or p.ci95_high_pct is None
            else f"[{p.ci95_low_pct:+.1f}%, {p.ci95_high_pct:+.1f}%]",
            f"{p.working_set_tokens:,} / {p.gpu_kv_capacity_tokens:,}"
            if p.working_set_tokens is not None and p.gpu_kv_capacity_tokens is not None
            else "—",
        )  # fmt: skip
    shown = err if as_json else out
    shown.print(table)
    if c.crossover is not None:
        shown.print(f"[bold]crossover:[/] {markup(c.crossover.text)}")
    if c.capacity:
        shown.print(f"[bold]GPU memory:[/] {markup(c.capacity)}")
    if c.agreement:
        shown.print(f"[bold]crossover vs GPU memory:[/] {markup(c.agreement)}")
    if c.prediction is not None:
        shown.print(f"[bold]prediction (made before each point):[/] {c.prediction.text()}")
    err.print(
        f"[dim]campaign directory: {markup(root)} (campaign.json, campaign.md, a run per point)[/]"
    )
    if interrupted:
        err.print(f"[bold yellow]interrupted: kvops ab-test --resume {markup(root)} continues[/]")
        return RC.INTERRUPTED
    return RC.OK


def auto_time_scale(scale: float) -> float:
    """Wall seconds per simulated second for the embedded engines: about constant wall time
    per run whatever --scale, never faster than 10x real time."""
    return max(0.1, min(1.0, 0.025 / scale))


def auto_workers(scenarios: list[WorkloadSpec]) -> int:
    """One event loop keeps up with a few hundred streams; beyond that, spread the load."""

    def width(s: WorkloadSpec) -> int:
        if s.rate is None:
            return s.batch_size
        return s.max_concurrency or s.per_iteration

    widest = max(width(s) for s in scenarios)
    return 1 if widest < 256 else max(1, min(4, os.cpu_count() or 1))


@dataclass
class CliArgs:
    """The command's options, typed (click hands them over as keyword arguments)."""

    arms: tuple[str, ...]
    scenario: str | None
    workload: Path | None
    scale: float
    trials: int
    warmup_iterations: int
    reset_cache: bool
    model: str | None
    vocab_size: int | None
    text_prompts: bool
    api: str
    timeout_s: float
    stall_timeout_s: float
    workers: int | None
    slo: str | None
    seed: int | None
    request_order: str | None
    out: Path | None
    overwrite: bool
    resume: Path | None
    as_json: bool
    sim_gpu: str
    sim_model: str
    sim_storage: str
    sim_time_scale: float | None
    sim_gds_buffer_mib: int = DEFAULT_GDS_BUFFER_MIB
    sim_cpu_tier_gb: float = 0.0
    deploy: bool = False
    inventories: tuple[str, ...] = ()
    limit: str | None = None
    deploy_variants: str = "baseline,offload"
    deploy_vars: tuple[str, ...] = ()
    sweep: str | None = None
    sweep_preset: str | None = None
    predict_gpu: str | None = None
    predict_storage: str | None = None
    evidence_dir: Path | None = None
    trace: Path | None = None
    hash_block_tokens: int = 512
    route: str | None = None
    service_logs: tuple[str, ...] = ()


def _request(a: CliArgs) -> AbTestRequest:
    if a.resume is not None:
        return AbTestRequest(
            out=a.resume, resume=True, resume_deploy_vars=_deploy_vars(a.deploy_vars)
        )
    deploy = _deploy_settings(a)
    arms = [parse_arm(text) for text in a.arms]
    if deploy is not None:
        if arms:
            raise ValueError("--deploy names its arms by --deploy-variants, not --arm")
        arms = deploy_arms(deploy, a.deploy_variants.split(","), a.model)
    if len(arms) == 1:
        raise ValueError("give two or more --arm (the first is the baseline), or none")
    if len({arm.name for arm in arms}) != len(arms):
        raise ValueError("arm names must be unique")
    if a.route is not None and not any(arm.more_urls for arm in arms):
        raise ValueError(
            "--route spreads an arm of several endpoints (--arm NAME=URL1,URL2); no arm has more "
            "than one"
        )
    if a.model:
        arms = [dataclasses.replace(arm, model=a.model) for arm in arms]
    scenarios = _scenarios(a.scenario, a.workload, a.scale, a.trace, a.hash_block_tokens)
    replays = any(s.trace is not None for s in scenarios)
    if replays and (a.workers or 1) > 1:
        raise ValueError(
            "--workers spreads generated workloads over processes; a trace's sessions are "
            "sent from one (each turn waits for its previous answer)"
        )
    if a.request_order is not None:
        scenarios = [dataclasses.replace(s, request_order=a.request_order) for s in scenarios]
    options = Options(
        trials=a.trials,
        # a trace is replayed whole, from a cold cache: there is no iteration to warm up with
        warmup_iterations=0 if replays else a.warmup_iterations,
        reset_cache=a.reset_cache,
        timeout_s=a.timeout_s,
        stall_timeout_s=a.stall_timeout_s,
        vocab_size=a.vocab_size,
        text_prompts=a.text_prompts,
        api=a.api,
        workers=a.workers or auto_workers(scenarios),
        route=a.route or "round-robin",
    )
    for s in scenarios:
        if s.iterations <= options.warmup_iterations:
            raise ValueError(
                f"scenario {s.name}: {s.iterations} iteration(s) leave none to measure after "
                f"--warmup-iterations {options.warmup_iterations}"
            )
    out = a.out or Path("runs") / time.strftime("ab-test-%Y%m%dT%H%M%SZ", time.gmtime())
    return AbTestRequest(
        out=out,
        arms=arms,
        scenarios=scenarios,
        options=options,
        scale=a.scale,
        sim=SimProfile(
            a.sim_model,
            a.sim_gpu,
            a.sim_storage,
            a.sim_time_scale or auto_time_scale(a.scale),
            gds_buffer_mib=a.sim_gds_buffer_mib,
            cpu_tier_gb=a.sim_cpu_tier_gb,
        ),
        seed=a.seed,
        slo=parse_slo(a.slo),
        overwrite=a.overwrite,
        deploy=deploy,
        predict_profiles=_predict_profiles(a),
        service_logs=_service_logs(a.service_logs, [arm.name for arm in arms]),
    )


def _service_logs(items: tuple[str, ...], arm_names: list[str]) -> dict[str, Path]:
    """`--service-log ARM=FILE` -> {arm: path}; the arm must be one of the run's."""
    logs: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--service-log {item!r}: expected ARM=FILE")
        if name not in arm_names:
            raise ValueError(f"--service-log {item!r}: no arm {name!r} (arms: {arm_names})")
        logs[name] = Path(path)
    return logs


def _deploy_settings(a: CliArgs) -> DeploySettings | None:
    if not a.deploy:
        if a.inventories or a.limit or a.deploy_vars:
            raise ValueError("-i/--limit/--deploy-var belong to --deploy")
        return None
    if not a.limit:
        raise ValueError("--deploy needs the host(s) (--limit HOST[,HOST...])")
    # inside a kvops checkout: its playbooks/deploy.yml; elsewhere the installed kvops.gds
    # collection with the user's own Ansible configuration (kvops.abtest.deploy)
    root = find_project_root()
    if root is not None and not (root / "playbooks" / "deploy.yml").is_file():
        root = None
    return DeploySettings(root, list(a.inventories), a.limit, _deploy_vars(a.deploy_vars))


def _deploy_vars(items: tuple[str, ...]) -> dict[str, Any]:
    """`--deploy-var KEY=VALUE`: VALUE as JSON when it parses, else the plain string."""
    extra: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--deploy-var {item!r}: expected KEY=VALUE")
        try:
            extra[key] = json.loads(value)
        except ValueError:
            extra[key] = value
    return extra
