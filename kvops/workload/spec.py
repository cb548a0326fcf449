"""Workload specs: a strict YAML schema (unknown keys are errors) and the built-in presets.

Why strict: a misspelt key (`prefix_token: 28000`) silently falling back to a default would run
a different experiment than the one the operator believes they ran. Every field declares its
type, range and help (`kvops.schema`); they are checked here, once, so the generator and runner
can trust the spec, and the same rules print as the spec reference in `kvops ab-test --help`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvops.errors import KvopsError
from kvops.schema import load_strict, reference, spec_field

PRESET_NAMES = ("unique-one-shot", "single-shared-prefix", "multi-shared-prefix")
REQUEST_ORDERS = ("shuffled", "cyclic")
TRACE_KEYS = ("trace", "hash_block_tokens", "trace_scale")


class WorkloadSpecError(KvopsError, ValueError):
    """A workload spec that cannot be run as written; the message names the key and the fix."""


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload. Lengths are in tokens and exact.

    Each iteration sends `requests_per_iteration` prompts (default: `batch_size`). Request j of
    an iteration starts with prefix j mod `num_prefixes` (none when 0), followed by a unique
    random suffix up to `prompt_tokens`. `request_order` says how an iteration's requests are
    sent: `shuffled` (default, seeded, as `vllm bench serve` shuffles its prefix-repetition
    dataset) or `cyclic` (prefix 0, 1, ..., N-1, 0, 1, ...: LRU then evicts each prefix just
    before its next use, which is the worst case for a GPU cache, not typical traffic).
    Batch mode (no `rate`): requests go out in groups of
    `batch_size` released together, each group after the previous one completed. Rate mode:
    arrivals at `rate` requests/s (gamma gaps, shape `burstiness`; `inf` = all at once), at most
    `max_concurrency` in flight. Prefixes repeat across iterations; that reuse is what offload
    may accelerate."""

    name: str = spec_field("custom", help="Shown in reports and the run directory.")
    description: str = spec_field("", help="Free text for the reader of the report.")
    num_prefixes: int = spec_field(0, minimum=0, help="Shared prefixes (0: every prompt unique).")
    prefix_tokens: int = spec_field(0, minimum=0, help="Length of each shared prefix, tokens.")
    prompt_tokens: int = spec_field(
        1024, minimum=1, help="Whole prompt length, tokens (prefix + unique suffix)."
    )
    output_tokens: int = spec_field(128, minimum=1, help="Tokens generated per request (exact).")
    batch_size: int = spec_field(1, minimum=1, help="Requests released together (batch mode).")
    requests_per_iteration: int | None = spec_field(
        None, minimum=1, help="Requests per iteration (null: batch_size)."
    )
    iterations: int = spec_field(1, minimum=1, help="Passes over the prefixes (reuse).")
    rate: float | None = spec_field(
        None, above=0, inf_ok=True, help="Rate mode: arrivals per second (inf: all at once)."
    )
    burstiness: float = spec_field(
        1.0, above=0, help="Rate mode: gamma shape of the gaps (1: Poisson)."
    )
    max_concurrency: int | None = spec_field(
        None, minimum=1, help="Rate mode: most requests in flight."
    )
    seed: int = spec_field(0, minimum=0, help="Seed of every random draw (prompts, arrivals).")
    request_order: str = spec_field(
        "shuffled", choices=REQUEST_ORDERS, help="Order of an iteration's requests."
    )
    trace: str | None = spec_field(
        None,
        help="A JSONL trace to replay instead (kvops ab-test --trace; a path relative to this "
        "file): its arrivals, prefixes and sessions; lengths and counts above are then read "
        "from it.",
    )
    hash_block_tokens: int = spec_field(
        512, minimum=1, help="Trace: tokens per hash_ids block (512 in Mooncake traces)."
    )
    trace_scale: float = spec_field(
        1.0, above=0, maximum=1, help="Trace: factor on its token counts (set by --scale)."
    )

    @property
    def per_iteration(self) -> int:
        return self.requests_per_iteration or self.batch_size

    @property
    def suffix_tokens(self) -> int:
        return self.prompt_tokens - (self.prefix_tokens if self.num_prefixes else 0)

    @property
    def total_requests(self) -> int:
        return self.per_iteration * self.iterations

    def scaled(self, scale: float) -> WorkloadSpec:
        """Every length times `scale` (rounded, at least 1 token; output at least 2 so TPOT and
        ITL exist). Counts (prefixes, batch size, iterations) are unchanged: the shape of the
        experiment stays, only its size shrinks."""
        if scale == 1.0:
            return self
        if not 0 < scale <= 1.0:
            raise WorkloadSpecError(f"--scale must be in (0, 1], got {scale}")
        if self.trace is not None:
            raise WorkloadSpecError(
                f"{self.name}: a trace is scaled when it is read (kvops.workload.replay)"
            )

        def s(n: int, floor: int) -> int:
            return max(floor, round(n * scale)) if n else 0

        prefix = s(self.prefix_tokens, 1)
        prompt = max(s(self.prompt_tokens, 1), prefix + 1 if self.num_prefixes else 1)
        return dataclasses.replace(
            self,
            prefix_tokens=prefix,
            prompt_tokens=prompt,
            output_tokens=s(self.output_tokens, 2),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["trace"] is None:  # a generated workload's spec reads (and records) as before
            for key in TRACE_KEYS:
                del d[key]
        if d["rate"] is not None and math.isinf(d["rate"]):
            d["rate"] = "inf"
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def spec_from_dict(data: Any, source: str = "spec") -> WorkloadSpec:
    """Validate a mapping into a WorkloadSpec; each problem is a WorkloadSpecError naming a key."""
    try:
        spec = WorkloadSpec(**load_strict(WorkloadSpec, data, source))
    except ValueError as exc:
        raise WorkloadSpecError(str(exc)) from None
    _check_spec(spec, source)
    return spec


def spec_reference() -> str:
    """The keys of a workload spec file, for `--help` and the README."""
    return reference(WorkloadSpec)


def _check_spec(spec: WorkloadSpec, source: str) -> None:
    if spec.num_prefixes and spec.prefix_tokens < 1:
        raise WorkloadSpecError(f"{source}: num_prefixes > 0 needs prefix_tokens >= 1")
    if spec.num_prefixes and spec.prompt_tokens <= spec.prefix_tokens:
        raise WorkloadSpecError(
            f"{source}: prompt_tokens ({spec.prompt_tokens}) must exceed prefix_tokens "
            f"({spec.prefix_tokens}) so every prompt has a unique suffix"
        )
    if not spec.num_prefixes and spec.prefix_tokens:
        raise WorkloadSpecError(f"{source}: prefix_tokens is set but num_prefixes is 0")
    if spec.rate is None and spec.max_concurrency is not None:
        raise WorkloadSpecError(
            f"{source}: max_concurrency applies to rate mode; set rate (or inf)"
        )


def load_spec_file(path: Path) -> WorkloadSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadSpecError(f"cannot read workload file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WorkloadSpecError(f"{path}: not valid YAML ({exc})") from None
    spec = spec_from_dict(data, str(path))
    if "name" not in data:
        spec = dataclasses.replace(spec, name="custom")
    if spec.trace is not None and not Path(spec.trace).is_absolute():
        spec = dataclasses.replace(spec, trace=str(path.parent / spec.trace))
    return spec


def load_preset(name: str) -> WorkloadSpec:
    """A built-in preset, read from the packaged data file `presets/<name>.yaml`."""
    if name not in PRESET_NAMES:
        raise WorkloadSpecError(
            f"unknown scenario {name!r}; choose one of {', '.join(PRESET_NAMES)}, all"
        )
    text = resources.files("kvops.workload").joinpath(f"presets/{name}.yaml").read_text("utf-8")
    return spec_from_dict(yaml.safe_load(text), f"preset {name}")
