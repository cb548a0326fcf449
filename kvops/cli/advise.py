"""`kvops advise`: will KV-cache offload pay for this traffic on this hardware? (no GPU needed)

`kvops advise sizing ...` is the closed form; `kvops advise TRACE ...` replays a trace through
both arms of the simulator. The group routes any first argument that is not a subcommand to the
trace command, so both read naturally on the command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvops.advise.render_sizing import sizing_lines
from kvops.advise.sizing import SizingError, SizingInputs, compute_sizing
from kvops.sim.profiles import (
    GpuProfile,
    ModelProfile,
    ProfileError,
    StorageProfile,
    load_gpu,
    load_model,
    load_storage,
)

F = TypeVar("F", bound=Callable[..., Any])


class CannotRun(click.ClickException):
    """Exit 2: the inputs cannot be analysed (bad trace, unusable evidence, impossible setup)."""

    exit_code = 2


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
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_profiles(
    model: str, gpu: str, storage: str
) -> tuple[ModelProfile, GpuProfile, StorageProfile]:
    """Profiles by name or path; an unknown name is a usage error listing the known ones."""
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
    return loaded[0], loaded[1], loaded[2]


class _AdviseGroup(click.Group):
    """`kvops advise TRACE ...` is `kvops advise trace TRACE ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
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
    """


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
    model_p, gpu_p, storage_p = load_profiles(model, gpu, storage)
    inputs = SizingInputs(
        prefix_tokens=prefix_tokens,
        num_prefixes=num_prefixes,
        tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        chunk_size=chunk_size,
    )
    try:
        result = compute_sizing(model_p, gpu_p, storage_p, inputs)
    except SizingError as exc:
        raise CannotRun(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo("\n".join(sizing_lines(result)))
