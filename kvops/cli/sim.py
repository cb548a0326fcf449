"""`kvops sim`: the simulated vLLM + LMCache engine (`serve`) and a virtual-time runner (`run`).

`kvops sim serve` takes the `vllm serve` flags that matter to the model and reads LMCache settings
from `LMCACHE_CONFIG_FILE` / `LMCACHE_*` exactly as LMCache does, so a systemd unit written for
vLLM runs it unchanged (the command name aside).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from kvops.cli.group import KvopsGroup
from kvops.errors import KvopsError
from kvops.sim.lmcache_config import (
    DEFAULT_GDS_BUFFER_MIB,
    LMCacheConfigError,
    LMCacheSettings,
    gds_offload_keys,
    load_lmcache_settings,
)
from kvops.sim.model import EngineSettings, build_engine, shared_kv_memory_bytes
from kvops.sim.profiles import (
    ProfileError,
    load_gpu,
    load_model,
    load_storage,
    profile_reference,
)
from kvops.sim.seed_workloads import SeedShape
from kvops.workload.spec import WorkloadSpec


def _check_profiles(model: str, gpu: str, storage: str) -> None:
    """Unknown names or malformed files become usage errors naming the known profiles."""
    for hint, loader, value in (
        ("--model", load_model, model),
        ("--gpu", load_gpu, gpu),
        ("--storage", load_storage, storage),
    ):
        try:
            loader(value)
        except ProfileError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from exc


# The connector names that load LMCache in-process: vLLM's built-in one, and the version-proof
# Dynamic form that loads LMCache's own module (https://docs.vllm.ai/en/latest/features/
# disagg_prefill.html, "kv_connector_module_path").
_LMCACHE_DYNAMIC_MODULE = "lmcache.integration.vllm.lmcache_connector_v1"


def _is_lmcache_connector(config: dict[str, Any]) -> bool:
    if config.get("kv_connector") == "LMCacheConnectorV1":
        return True
    return (
        config.get("kv_connector") == "LMCacheConnectorV1Dynamic"
        and config.get("kv_connector_module_path") == _LMCACHE_DYNAMIC_MODULE
    )


def _offload_settings(kv_transfer_config: str | None) -> tuple[bool, LMCacheSettings]:
    if not kv_transfer_config:
        return False, LMCacheSettings()
    try:
        config = json.loads(kv_transfer_config)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON: {exc}", param_hint="--kv-transfer-config"
        ) from exc
    if not isinstance(config, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--kv-transfer-config")
    if not _is_lmcache_connector(config):
        return False, LMCacheSettings()
    extra = config.get("kv_connector_extra_config") or {}
    try:
        settings = load_lmcache_settings(extra_config=extra if isinstance(extra, dict) else {})
    except LMCacheConfigError as exc:
        raise LMCacheConfigError(f"LMCache configuration: {exc}") from exc
    return True, settings


PROFILE_REFERENCE = (
    "\b\nProfile files (--gpu/--model/--storage PATH.yaml; strict: unknown, missing and bad keys "
    "are errors):\n" + "\n".join("  " + line for line in profile_reference().splitlines()) + "\n"
)


@click.group(cls=KvopsGroup, epilog=PROFILE_REFERENCE)
def sim() -> None:
    """The simulated vLLM + LMCache engine (physics-based; no GPU needed)."""


@sim.command()
@click.argument("model_tag", required=False)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--model", default="llama-3.1-8b", show_default=True, help="Model profile name or YAML path."
)
@click.option(
    "--gpu", default="h100-sxm-80gb", show_default=True, help="GPU profile name or YAML path."
)
@click.option(
    "--storage",
    default="ontap-nfs-rdma-200g",
    show_default=True,
    help="Storage profile (the LMCache GDS path) name or YAML path.",
)
@click.option("--tensor-parallel-size", "-tp", default=1, show_default=True, type=int)
@click.option("--served-model-name", default=None, help="Name in the API (default: HF name).")
@click.option("--max-model-len", default=None, type=int)
@click.option("--max-num-seqs", default=256, show_default=True, type=int)
@click.option("--max-num-batched-tokens", default=8192, show_default=True, type=int)
@click.option("--gpu-memory-utilization", default=0.9, show_default=True, type=float)
@click.option("--block-size", default=16, show_default=True, type=int)
@click.option(
    "--num-gpu-blocks-override", default=None, type=int, help="Cap the GPU KV blocks (as vLLM)."
)
@click.option(
    "--kv-cache-memory-bytes",
    default=None,
    type=click.IntRange(1),
    help="GPU KV cache size per GPU in bytes, instead of sizing it by --gpu-memory-utilization "
    "(as vLLM).",
)
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True)
@click.option(
    "--kv-transfer-config",
    default=None,
    help='JSON; offload is on iff the connector is LMCache ("LMCacheConnectorV1", or '
    '"LMCacheConnectorV1Dynamic" with LMCache\'s kv_connector_module_path).',
)
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Real seconds per modelled second (0.05 = 20x faster than the hardware).",
)
@click.option(
    "--kv-capacity-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="kvops-only: multiply the computed GPU KV capacity.",
)
@click.option(
    "--offload-store-blocking",
    is_flag=True,
    help="kvops-only: steps wait for chunk writes (LMCache GDS writes asynchronously).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--enable-prompt-tokens-details", is_flag=True, help="Accepted; always on.")
@click.option("--dtype", default="auto", help="Accepted for vLLM compatibility; ignored.")
@click.option("--enforce-eager", is_flag=True, help="Accepted for vLLM compatibility; ignored.")
@click.option("--disable-log-requests", is_flag=True, help="Accepted; ignored.")
@click.option(
    "--shutdown-timeout", default=0, type=int, help="Accepted for vLLM compatibility; ignored."
)
def serve(**opts: Any) -> None:
    """Serve the OpenAI API over the simulated engine until interrupted.

    \b
    MODEL_TAG, as in `vllm serve MODEL`, is the model profile (it overrides --model).

    \b
    Examples:
      kvops sim serve --port 8000 --time-scale 0.05
      kvops sim serve llama-3.1-8b --port 8000
      LMCACHE_CONFIG_FILE=lmcache.yaml kvops sim serve \\
        --kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
    """
    from kvops.sim.server import ServerConfig
    from kvops.sim.server import serve as run_server

    if opts["model_tag"]:
        opts["model"] = opts["model_tag"]
    _check_profiles(opts["model"], opts["gpu"], opts["storage"])
    if opts["time_scale"] <= 0:
        raise click.BadParameter("must be positive", param_hint="--time-scale")
    offload, lmcache = _offload_settings(opts["kv_transfer_config"])
    settings = EngineSettings(
        block_size=opts["block_size"],
        max_num_seqs=opts["max_num_seqs"],
        max_num_batched_tokens=opts["max_num_batched_tokens"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        tensor_parallel_size=opts["tensor_parallel_size"],
        max_model_len=opts["max_model_len"],
        num_gpu_blocks_override=opts["num_gpu_blocks_override"],
        kv_cache_memory_bytes=opts["kv_cache_memory_bytes"],
        kv_capacity_scale=opts["kv_capacity_scale"],
        enable_prefix_caching=opts["enable_prefix_caching"],
        offload=offload,
        lmcache=lmcache,
        store_blocking=opts["offload_store_blocking"],
    )
    if offload:
        for warning in lmcache.warnings:
            click.echo(f"LMCache WARNING: {warning}", err=True)
        shown = {k: v for k, v in dataclasses.asdict(lmcache).items() if k != "warnings"}
        click.echo(f"LMCache Configuration: {shown}", err=True)
    config = ServerConfig(
        model=opts["model"],
        gpu=opts["gpu"],
        storage=opts["storage"],
        settings=settings,
        served_model_name=opts["served_model_name"],
        time_scale=opts["time_scale"],
        seed=opts["seed"],
    )
    try:
        run_server(config, opts["host"], opts["port"])
    except OSError as exc:  # port in use, or an unwritable gds_path
        where = f"{opts['host']}:{opts['port']}"
        raise KvopsError(f"cannot serve on {where}: {exc}") from exc


# The workload presets of `kvops ab-test` and `kvops advise` by the seed scenario of their shape.
_PRESET_SCENARIOS = {
    "unique-one-shot": "unique",
    "single-shared-prefix": "one-prefix",
    "multi-shared-prefix": "multi-prefix",
}


def _scenario(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return _PRESET_SCENARIOS.get(value, value)


_SHAPE_OPTIONS = [
    click.option(
        "--scenario",
        type=click.Choice(["unique", "one-prefix", "multi-prefix", *_PRESET_SCENARIOS]),
        default="multi-prefix",
        show_default=True,
        callback=_scenario,
        help="A seed scenario, or the ab-test preset of the same shape.",
    ),
    click.option("--model", default="llama-3.1-8b", show_default=True),
    click.option("--gpu", default="h100-sxm-80gb", show_default=True),
    click.option("--storage", default="ontap-nfs-rdma-200g", show_default=True),
    click.option("--tensor-parallel-size", "-tp", default=1, show_default=True,
                 type=click.IntRange(1)),
    click.option("--num-prefixes", default=20, show_default=True, type=click.IntRange(1),
                 help="Shared prefixes (multi-prefix)."),
    click.option("--prefix-tokens", default=28_000, show_default=True, type=click.IntRange(1)),
    click.option("--prompt-tokens", default=30_000, show_default=True, type=click.IntRange(2),
                 help="Whole prompt: prefix + unique suffix."),
    click.option("--output-tokens", default=64, show_default=True, type=click.IntRange(1)),
    click.option("--iterations", default=4, show_default=True, type=click.IntRange(1)),
    click.option("--warmup-iterations", default=1, show_default=True, type=click.IntRange(0),
                 help="Leading iterations left out of the figures (as kvops ab-test)."),
    click.option("--batch-size", default=40, show_default=True, type=click.IntRange(1)),
    click.option("--request-order", type=click.Choice(["shuffled", "cyclic"]),
                 default="shuffled", show_default=True,
                 help="Send order within an iteration (as kvops ab-test)."),
    click.option("--seed", default=0, show_default=True, type=int),
    click.option("--send-interval-ms", default=0.0, show_default=True, type=click.FloatRange(0),
                 help="Model-time ms between a batch's consecutive sends (a real client writes "
                      "one body after another; a late request's prefill then lands between the "
                      "others' decode steps, which lowers the ITL gain). 0: all at once."),
    click.option("--cpu-tier-gb", default=0.0, show_default=True, type=click.FloatRange(0),
                 help="Offload arm: an LMCache CPU DRAM tier of this size in front of GDS "
                      "(local_cpu + max_local_cpu_size; read first, written through)."),
    click.option("--gds-buffer-mib", default=DEFAULT_GDS_BUFFER_MIB, show_default=True,
                 type=click.IntRange(0),
                 help="Offload arm: LMCache gds_buffer_size, MiB of GPU memory. Both arms "
                      "get the same KV memory, what the default utilisation leaves once the "
                      "buffer is on the GPU (as the vllm_lmcache role sizes its variants)."),
    click.option("--scale", default=1.0, show_default=True,
                 type=click.FloatRange(0, 1, min_open=True),
                 help="Shrink every token length and the GPU KV cache by this factor, exactly "
                      "as `kvops ab-test --scale` does (make demo: 0.1)."),
]  # fmt: skip


def _shape_options(fn: Any) -> Any:
    for option in reversed(_SHAPE_OPTIONS):
        fn = option(fn)
    return fn


def _shape(opts: dict[str, Any]) -> SeedShape:
    """The scenario's shape from the command's options (checked)."""
    _check_profiles(opts["model"], opts["gpu"], opts["storage"])
    if opts["prompt_tokens"] <= opts["prefix_tokens"]:
        raise click.BadParameter("must exceed --prefix-tokens", param_hint="--prompt-tokens")
    if opts["warmup_iterations"] >= opts["iterations"]:
        raise click.BadParameter("must be below --iterations", param_hint="--warmup-iterations")
    # the lengths --scale gives, by the same rule as the workload presets of kvops ab-test
    lengths = WorkloadSpec(
        num_prefixes=1,
        prefix_tokens=opts["prefix_tokens"],
        prompt_tokens=opts["prompt_tokens"],
        output_tokens=opts["output_tokens"],
    ).scaled(opts["scale"])
    return SeedShape(
        prefix_tokens=lengths.prefix_tokens,
        suffix_tokens=lengths.prompt_tokens - lengths.prefix_tokens,
        num_prefixes=opts["num_prefixes"],
        batch_size=opts["batch_size"],
        iterations=opts["iterations"],
        output_tokens=lengths.output_tokens,
        vocab_size=load_model(opts["model"]).vocab_size,
        seed=opts["seed"],
        request_order=opts["request_order"],
        send_interval_s=opts["send_interval_ms"] / 1e3,
    )


def _arm_settings(opts: dict[str, Any]) -> Callable[[bool], EngineSettings]:
    """Engine settings per arm: offload with an LMCache GDS tier (--gds-buffer-mib of GPU
    memory), behind a CPU DRAM tier of --cpu-tier-gb when given (LMCache reads the fastest
    tier holding a chunk and writes every chunk to every tier); both arms with the same KV
    memory (`shared_kv_memory_bytes`), shrunk by --scale as the embedded engines of
    `kvops ab-test --scale` shrink theirs. The same LMCache keys as
    those engines (`gds_offload_keys`), so the two agree on one configuration."""
    keys = gds_offload_keys(int(opts["gds_buffer_mib"]), float(opts["cpu_tier_gb"]))
    tp = opts["tensor_parallel_size"]
    kv = shared_kv_memory_bytes(opts["model"], opts["gpu"], int(opts["gds_buffer_mib"]), tp)

    def settings(offload: bool) -> EngineSettings:
        lm = LMCacheSettings(**keys, gds_path="(virtual)")  # type: ignore[arg-type]
        return EngineSettings(
            offload=offload,
            lmcache=lm,
            tensor_parallel_size=tp,
            kv_capacity_scale=float(opts["scale"]),
            kv_cache_memory_bytes=kv or None,
        )

    return settings


def _instances(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter("give N or N1,N2,... (whole numbers)") from None
    if not sizes or sizes[0] < 1:
        raise click.BadParameter("give one or more instance counts of 1 or more")
    return sizes


@sim.command()
@_shape_options
@click.option(
    "--instances",
    default="1",
    show_default=True,
    callback=_instances,
    help="Engine instances sharing the storage export (N, or N1,N2,... to sweep); each gets "
    "the load of one (--batch-size per instance). 1: the single engine, as always.",
)
@click.option(
    "--router",
    type=click.Choice(["round-robin", "prefix"]),
    default="round-robin",
    show_default=True,
    help="How requests are spread over the instances: in turn, or prefix-aware (vLLM's "
    "production router's cache-aware policy).",
)
@click.option(
    "--balance-abs-threshold",
    default=64,
    show_default=True,
    type=click.IntRange(0),
    help="--router prefix: route to the idlest instance once the busiest has this "
    "many more requests in flight (and 1.5 times as many), as vllm-router.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (a single instance always prints JSON)."
)
def run(
    instances: list[int], router: str, balance_abs_threshold: int, as_json: bool, **opts: Any
) -> None:
    """Run a seed scenario in virtual time, baseline and offload arms, and print JSON
    (throughput, mean TTFT and ITL, cache hits; the first --warmup-iterations left out, requests
    shuffled within an iteration: the protocol of `kvops ab-test`).

    With --instances N (or a list to sweep), N engines behind a router share one storage
    export: it prints each fleet size's throughput, the share of loaded chunks another instance
    had stored, how busy the export's nodes were, what the export's bandwidth cost (against the
    same fleet on an export without limits), the bottleneck, and where the export starts to
    limit. README "Predicting a fleet" says how to read it.

    \b
    Examples:
      kvops sim run --scenario multi-prefix --storage ontap-nfs-rdma-400g
      kvops sim run --num-prefixes 8 --output-tokens 256 --request-order cyclic
      kvops sim run --scenario multi-shared-prefix --instances 4
      kvops sim run --instances 1,2,4,8,16 --router prefix --json
    """
    from kvops.sim.seed_workloads import run_batches, seed_batches, summarize

    shape = _shape(opts)
    if instances != [1]:
        _run_fleet(opts, shape, instances, router, balance_abs_threshold, as_json)
        return
    model, gpu, storage, scenario = opts["model"], opts["gpu"], opts["storage"], opts["scenario"]
    out: dict[str, Any] = {"scenario": scenario, "model": model, "gpu": gpu, "storage": storage}
    out["shape"] = dataclasses.asdict(shape)
    skip = opts["warmup_iterations"] * shape.batch_size
    for arm, offload in (("baseline", False), ("offload", True)):
        settings = _arm_settings(opts)(offload)
        engine = build_engine(model, gpu, storage, settings)
        batches = seed_batches(scenario, shape)
        summary = summarize(run_batches(engine, batches, shape.send_interval_s), skip)
        out[arm] = {
            "num_gpu_blocks": engine.cache.num_blocks,
            "gds_buffer_mib": settings.lmcache.staging_buffer_mib if offload else 0,
            "cpu_tier_gb": settings.lmcache.max_local_cpu_size
            if offload and settings.lmcache.local_cpu else 0.0,
            **dataclasses.asdict(summary),
        }  # fmt: skip
    json.dump(out, sys.stdout, indent=2)
    click.echo()


def _run_fleet(
    opts: dict[str, Any],
    shape: SeedShape,
    sizes: list[int],
    router: str,
    balance_abs_threshold: int,
    as_json: bool,
) -> None:
    from kvops.sim.export import ExportError, SharedExport
    from kvops.sim.fleet import FleetSetup, probe_export_limit, run_points
    from kvops.sim.fleet_report import fleet_doc, fleet_lines
    from kvops.sim.router import PrefixPolicy

    storage = load_storage(opts["storage"])
    try:
        SharedExport(storage, 1)
    except ExportError as exc:
        raise click.BadParameter(str(exc), param_hint="--storage") from None
    if opts["cpu_tier_gb"] > 0:
        raise click.BadParameter(
            "a CPU tier in front of a shared export is not modelled for several instances",
            param_hint="--cpu-tier-gb",
        )
    setup = FleetSetup(
        load_model(opts["model"]), load_gpu(opts["gpu"]), storage, _arm_settings(opts),
        router, PrefixPolicy(balance_abs_threshold=balance_abs_threshold), opts["seed"],
    )  # fmt: skip
    points = run_points(setup, opts["scenario"], shape, sizes, opts["warmup_iterations"])
    probes = probe_export_limit(setup, opts["scenario"], shape, points, opts["warmup_iterations"])
    header: dict[str, Any] = {
        "scenario": opts["scenario"], "model": opts["model"], "gpu": opts["gpu"],
        "storage": opts["storage"], "router": router, "shape": dataclasses.asdict(shape),
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(fleet_doc(points, storage, header, probes), indent=2))
        return
    title = (
        f"{opts['scenario']} on a fleet of {opts['gpu']} x {opts['model']}, {router} router, "
        f"one export ({storage.name}: {storage.export_nodes} nodes x "
        f"{storage.node_read_bandwidth_gb_s:g} GB/s read, {storage.node_write_bandwidth_gb_s:g} "
        f"GB/s write; each host's link {storage.read_bandwidth_gb_s:g} GB/s read); "
        f"{shape.batch_size} requests per instance per batch"
    )
    click.echo("\n".join(fleet_lines(points, storage, title, probes)))


@sim.command()
@click.argument("sweep_spec", metavar="PARAM=V1,V2,...")
@_shape_options
@click.option("--json", "as_json", is_flag=True, help="Print the points as JSON.")
def sweep(sweep_spec: str, as_json: bool, **opts: Any) -> None:
    """Sweep one parameter through both arms: where does offload flip from hurting to helping?

    PARAM is one of num_prefixes, prefix_tokens, output_tokens, batch_size (the scenario's
    shape) or read_bandwidth_gb_s (the storage profile's). Prints each point's throughput, mean
    TTFT and ITL deltas, the closed-form break-even read bandwidth for the prefix length (reads
    faster than this beat recomputing), and the interpolated flip point.

    \b
    Examples:
      kvops sim sweep read_bandwidth_gb_s=1,2,4,8,16,32,64,128
      kvops sim sweep num_prefixes=1,2,4,8,12,16,20,24
      kvops sim sweep output_tokens=16,64,256,1024 --json
    """
    from kvops.sim.sweep import SweepError, find_flip, parse_sweep, run_sweep

    try:
        param, values = parse_sweep(sweep_spec)
    except SweepError as exc:
        raise click.BadParameter(str(exc), param_hint="PARAM=V1,V2,...") from None
    shape = _shape(opts)
    points = run_sweep(
        param, values, scenario=opts["scenario"], shape=shape,
        model=load_model(opts["model"]), gpu=load_gpu(opts["gpu"]),
        storage=load_storage(opts["storage"]), settings=_arm_settings(opts),
        skip_iterations=opts["warmup_iterations"],
    )  # fmt: skip
    flip = find_flip(points)
    metrics = ("total_token_throughput_tok_s", "mean_ttft_ms", "mean_itl_ms")
    if as_json:
        doc = {
            "param": param,
            "points": [
                {"value": p.value, "break_even_read_gb_s": p.break_even_read_gb_s,
                 **{f"{m}_delta_pct": p.delta_pct(m) for m in metrics},
                 "baseline": dataclasses.asdict(p.baseline),
                 "offload": dataclasses.asdict(p.offload)}
                for p in points
            ],
            "flip": dataclasses.asdict(flip) if flip else None,
        }  # fmt: skip
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(
        f"{param:>22} {'tok/s Δ':>9} {'TTFT Δ':>8} {'ITL Δ':>8} {'break-even read GB/s':>21}"
    )
    for p in points:
        d = [p.delta_pct(m) for m in metrics]
        click.echo(
            f"{p.value:>22g} {d[0]:>+8.1f}% {d[1]:>+7.1f}% {d[2]:>+7.1f}% "
            f"{p.break_even_read_gb_s:>21.2f}"
        )
    if flip is None:
        sign = "helps" if points[0].delta_pct(metrics[0]) >= 0 else "hurts"
        click.echo(f"offload {sign} throughout: no flip between {values[0]:g} and {values[-1]:g}")
    else:
        way = "hurting to helping" if flip.helps_above else "helping to hurting"
        click.echo(
            f"offload flips from {way} between {param}={flip.low:g} and {flip.high:g} "
            f"(about {flip.at:.3g}); break-even read bandwidth for "
            f"{shape.prefix_tokens}-token prefixes: {points[0].break_even_read_gb_s:.2f} GB/s"
        )
