"""`kvops advise`: will KV-cache offload pay for this traffic on this hardware? (no GPU needed)

`kvops advise sizing ...` is the closed form; `kvops advise TRACE ...` replays a trace through
both arms of the simulator. The group routes any first argument that is not a subcommand to the
trace command, so both read naturally on the command line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvops.advise.render_sizing import sizing_lines
from kvops.advise.sizing import SizingInputs, compute_sizing
from kvops.cli.advise_calibrate import calibrate_command
from kvops.cli.group import KvopsGroup
from kvops.cli.spec_help import workload_reference
from kvops.errors import KvopsError
from kvops.sim.profiles import (
    GpuProfile,
    ModelProfile,
    ProfileError,
    StorageProfile,
    load_gpu,
    load_model,
    load_storage,
)

if TYPE_CHECKING:
    from rich.progress import Progress

    from kvops.advise.analysis import Stage

F = TypeVar("F", bound=Callable[..., Any])


def profile_options(func: F) -> F:
    """--model/--gpu/--storage/--tp/--gpu-memory-utilization, shared by every advise command."""
    options = [
        click.option(
            "--model", default="llama-3.1-8b", show_default=True, help="Model profile or YAML."
        ),
        click.option(
            "--gpu", default="h100-sxm-80gb", show_default=True, help="GPU profile or YAML."
        ),
        click.option(
            "--storage",
            default="ontap-nfs-rdma-200g",
            show_default=True,
            help="Storage profile (the LMCache GDS path) or YAML.",
        ),
        click.option(
            "--tp",
            "--tensor-parallel-size",
            "tp",
            default=1,
            show_default=True,
            type=click.IntRange(min=1),
            help="Tensor-parallel ranks (KV and weights split over them).",
        ),
        click.option(
            "--gpu-memory-utilization",
            default=0.9,
            show_default=True,
            type=click.FloatRange(0.0, 1.0, min_open=True),
            help="Share of GPU memory vLLM may use (as vllm serve).",
        ),
        click.option(
            "--storage-from-evidence",
            "evidence_dir",
            default=None,
            type=click.Path(path_type=Path),
            help="Use the storage measured by gdsio in a `kvops validate --storage-bench "
            "--save-evidence DIR` bundle instead of --storage.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_profiles(
    model: str, gpu: str, storage: str, evidence_dir: Path | None = None
) -> tuple[ModelProfile, GpuProfile, StorageProfile, list[str]]:
    """Profiles by name or path (an unknown name is a usage error listing the known ones),
    the storage measured in an evidence bundle when one is given, and notes about it."""
    loaded: list[Any] = []
    for hint, loader, value in (
        ("--model", load_model, model),
        ("--gpu", load_gpu, gpu),
        ("--storage", load_storage, storage),
    ):
        try:
            loaded.append(loader(value))
        except ProfileError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from exc
    notes: list[str] = []
    if evidence_dir is not None:
        from kvops.advise.storage_evidence import storage_from_evidence

        measured = storage_from_evidence(evidence_dir)  # StorageEvidenceError: exit 2
        loaded[2] = measured.profile
        notes = measured.notes
    return loaded[0], loaded[1], loaded[2], notes


class _AdviseGroup(KvopsGroup):
    """`kvops advise TRACE ...` is `kvops advise trace TRACE ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] == "--calibrate":  # `kvops advise --calibrate RUNDIR...`
            args = ["calibrate", *args[1:]]
        help_names = ctx.help_option_names
        routed = "trace" in self.commands and args and args[0] not in self.commands
        if routed and args[0] not in help_names:
            args = ["trace", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_AdviseGroup)
def advise() -> None:
    """Will KV-cache offload pay for your traffic on your hardware? Answered from physics.

    \b
    Closed form, instant (how many prefixes fit, load vs recompute, break-even bandwidth):
      kvops advise sizing --model llama-3.1-8b --gpu h100-sxm-80gb \\
          --prefix-tokens 28000 --num-prefixes 20 --storage ontap-nfs-rdma-200g
    Both arms simulated over your own traffic (a JSONL trace, an ab-test records.jsonl, a
    workload YAML or a preset name), with ranges, flip points and recommended settings:
      kvops advise trace.jsonl --gpu h100-sxm-80gb --storage ontap-nfs-rdma-400g
      kvops advise multi-shared-prefix --json
    (`kvops advise trace --help` lists the trace formats and the workload spec's keys.)
    Refit the site's uncertain figures from measured ab-test runs or campaigns, scored on
    points held back from the fit:
      kvops advise --calibrate runs/campaign1 --out site-profiles
    """


advise.add_command(calibrate_command)


@advise.command()
@profile_options
@click.option(
    "--prefix-tokens", required=True, type=click.IntRange(min=1), help="Tokens per shared prefix."
)
@click.option(
    "--num-prefixes", required=True, type=click.IntRange(min=1), help="Distinct shared prefixes."
)
@click.option(
    "--chunk-size", default=256, show_default=True, type=click.IntRange(min=1),
    help="LMCache chunk_size (tokens per stored chunk).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON (names as documented).")
def sizing(
    model: str,
    gpu: str,
    storage: str,
    tp: int,
    gpu_memory_utilization: float,
    evidence_dir: Path | None,
    prefix_tokens: int,
    num_prefixes: int,
    chunk_size: int,
    as_json: bool,
) -> None:
    """Closed-form sizing: KV bytes, GPU capacity, prefill vs load time, break-even bandwidth.

    \b
    JSON names: kv_bytes_per_token, gpu_kv_capacity_tokens, prefixes_fit_in_gpu,
    storage_bytes_needed, prefill_seconds_per_prefix, load_seconds_per_prefix,
    break_even_read_gb_s (below it, recomputing a prefix beats loading it).
    """
    model_p, gpu_p, storage_p, notes = load_profiles(model, gpu, storage, evidence_dir)
    inputs = SizingInputs(
        prefix_tokens=prefix_tokens,
        num_prefixes=num_prefixes,
        tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        chunk_size=chunk_size,
    )
    result = compute_sizing(model_p, gpu_p, storage_p, inputs)  # SizingError: exit 2
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "notes": notes}, indent=2))
        return
    click.echo("\n".join([*sizing_lines(result), *notes]))


def _progress_stage(enabled: bool) -> tuple[Progress | None, Stage | None]:
    """A rich progress display on stderr (one bar per replay), or nothing when disabled."""
    if not enabled:
        return None, None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )

    def stage(description: str, total: int) -> Callable[[int], None] | None:
        task = progress.add_task(description, total=total or None)
        if not total:
            return None

        def advance(n: int) -> None:
            progress.advance(task, n)

        return advance

    return progress, stage


@advise.command(name="trace", epilog=workload_reference("TRACE as a workload file"))
@click.argument("trace", metavar="TRACE")
@profile_options
@click.option(
    "--chunk-size", default=256, show_default=True, type=click.IntRange(min=16),
    help="LMCache chunk_size of the offload arm.",
)  # fmt: skip
@click.option(
    "--gds-buffer-mib", default=8192, show_default=True, type=click.IntRange(min=0),
    help="LMCache gds_buffer_size (VRAM taken from the offload arm's KV pool).",
)  # fmt: skip
@click.option(
    "--hash-block-tokens", default=512, show_default=True, type=click.IntRange(min=1),
    help="Tokens per hash_ids block in the trace (Mooncake traces: 512).",
)  # fmt: skip
@click.option(
    "--output-tokens", default=None, type=click.IntRange(min=1),
    help="Output length for trace lines that give none (else such lines are malformed).",
)  # fmt: skip
@click.option("--strict", is_flag=True, help="Fail on the first malformed line (default: skip it).")
@click.option(
    "--sample-requests", default=2000, show_default=True, type=click.IntRange(min=1),
    help="A longer trace is sampled: this many requests in windows of 250 (ranges and "
    "flip search on 2 of the windows); a longer spec runs ranges on its first this many.",
)  # fmt: skip
@click.option("--quick", is_flag=True, help="Nominal arms only: no ranges, no flip-point search.")
@click.option(
    "--instances", default=1, show_default=True, type=click.IntRange(min=1),
    help="Also replay the traffic over this many instances sharing the --storage export "
    "(cross-instance hits, export load, bottleneck).",
)  # fmt: skip
@click.option(
    "--router", type=click.Choice(["round-robin", "prefix"]), default="round-robin",
    show_default=True, help="With --instances: how requests are spread over them.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the report as Markdown.")
def trace_command(
    trace: str,
    model: str,
    gpu: str,
    storage: str,
    tp: int,
    gpu_memory_utilization: float,
    evidence_dir: Path | None,
    chunk_size: int,
    gds_buffer_mib: int,
    hash_block_tokens: int,
    output_tokens: int | None,
    strict: bool,
    sample_requests: int,
    quick: bool,
    instances: int,
    router: str,
    as_json: bool,
    as_markdown: bool,
) -> None:
    """Replay TRACE through both arms (baseline, LMCache GDS offload) and advise.

    \b
    TRACE is one of:
      a JSONL trace, one request per line: arrival_s (or timestamp in ms), output_tokens
        (or output_length / max_tokens), and prompt_token_ids, or prompt/text, or
        hash_ids + input_length (the Mooncake trace format);
      an ab-test records.jsonl (its run directory's workloads/ give prefix lengths);
      a workload YAML, or a preset: unique-one-shot, single-shared-prefix, multi-shared-prefix.
    \b
    Examples:
      kvops advise multi-shared-prefix
      kvops advise trace.jsonl --storage ontap-nfs-rdma-400g --json
      kvops advise runs/ab1/records.jsonl --markdown > advice.md
      kvops advise multi-shared-prefix --instances 4 --router prefix
    """
    from kvops.advise.analysis import AdviseOptions, analyse
    from kvops.advise.arms import Profiles
    from kvops.advise.recommend import advise as make_advice
    from kvops.advise.render import markdown, report_dict, terminal_lines
    from kvops.advise.trace import ReadOptions, load_workload
    from kvops.advise.workload import PromptBuilder
    from kvops.sim.model import EngineError

    if as_json and as_markdown:
        raise click.UsageError("choose one of --json and --markdown")
    model_p, gpu_p, storage_p, storage_notes = load_profiles(model, gpu, storage, evidence_dir)
    if instances > 1 and evidence_dir is not None:
        from kvops.advise.fleet import with_export

        storage_p = with_export(storage_p, load_storage(storage))
        storage_notes.append(f"fleet: the export's nodes from --storage {storage}")
    if instances > 1 and storage_p.export_nodes is None:
        raise click.BadParameter(
            f"storage '{storage_p.name}' is no shared export (export_nodes unset): "
            "--instances needs one",
            param_hint="--instances",
        )
    read = ReadOptions(strict, hash_block_tokens, output_tokens)
    workload = load_workload(trace, read, model_p.vocab_size, model_p.hf_name)  # TraceError
    workload.notes.extend(storage_notes)
    for line in workload.skipped_lines[:20]:
        click.echo(f"warning: skipped {line}", err=True)
    options = AdviseOptions(
        tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        chunk_size=chunk_size,
        gds_buffer_mib=gds_buffer_mib,
        sample_requests=sample_requests,
        corners=not quick,
        flips=not quick,
    )
    builder = PromptBuilder(model_p.vocab_size, workload.hash_block_tokens)
    progress, stage = _progress_stage(sys.stderr.isatty())
    profiles = Profiles(model_p, gpu_p, storage_p)
    try:
        if progress is not None:
            with progress:
                analysis = analyse(workload, profiles, options, builder, stage)
        else:
            analysis = analyse(workload, profiles, options, builder)
    except EngineError as exc:  # also a KvopsError: say which part could not run
        raise KvopsError(f"cannot simulate this setup: {exc}") from exc
    result = make_advice(analysis)
    fleet = None
    if instances > 1:
        from kvops.advise.fleet import fleet_advice, fleet_dict, fleet_lines

        fleet = fleet_advice(workload, builder, profiles, options, instances, router)
    if as_json:
        doc = report_dict(analysis, result)
        if fleet is not None:
            doc["fleet"] = fleet_dict(fleet)
        click.echo(json.dumps(doc, indent=2, default=str))
    elif as_markdown:
        click.echo(markdown(analysis, result), nl=False)
        if fleet is not None:
            click.echo("\n## Fleet\n\n" + "\n".join(f"    {ln}" for ln in fleet_lines(fleet)))
    else:
        click.echo("\n".join(terminal_lines(analysis, result)))
        if fleet is not None:
            click.echo("\n" + "\n".join(fleet_lines(fleet)))
