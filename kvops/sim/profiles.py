"""Hardware and model profiles: YAML data files under `kvops/sim/profiles/`, one per profile.

Each file carries `kind` (`gpu`, `model` or `storage`) and the fields of that kind; its name is
the file stem. A profile may also be given by path to a YAML file of the same shape, so users can
describe their own hardware without touching the package. Every number in the shipped files has
its public source in a comment: the simulator's costs come from these numbers and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from kvops.errors import KvopsError
from kvops.schema import load_strict, reference, spec_field

PROFILE_DIR = Path(__file__).parent / "profiles"
Kind = Literal["gpu", "model", "storage"]


class ProfileError(KvopsError, ValueError):
    """A profile name that is not known, or a profile file that is malformed."""


def _positive(text: str) -> Any:
    return spec_field(above=0, help=text)


def _count(text: str) -> Any:
    return spec_field(minimum=1, help=text)


def _share(text: str) -> Any:
    return spec_field(above=0, maximum=1, help=text)


_NAME = "Profile name [default: the file name without .yaml]."


@dataclass(frozen=True)
class GpuProfile:
    name: str = spec_field(help=_NAME)
    memory_mib: float = _positive("GPU memory, MiB (as nvidia-smi reports the total).")
    hbm_bandwidth_gb_s: float = _positive("HBM bandwidth, GB/s (datasheet).")
    bf16_dense_tflops: float = _positive("Dense bf16 tensor throughput, TFLOP/s (datasheet).")
    prefill_mfu: float = _share("Share of that peak prefill reaches end to end.")
    hbm_efficiency: float = _share("Share of HBM bandwidth decode reaches.")
    step_overhead_ms: float = spec_field(minimum=0, help="Fixed CPU time per engine step, ms.")
    runtime_overhead_gib: float = spec_field(
        minimum=0, help="Memory the KV cache cannot use beyond weights, GiB."
    )


@dataclass(frozen=True)
class ModelProfile:
    name: str = spec_field(help=_NAME)
    hf_name: str = spec_field(help="Hugging Face model id (the served model name).")
    num_layers: int = _count("num_hidden_layers of config.json.")
    hidden_size: int = _count("hidden_size of config.json.")
    num_attention_heads: int = _count("num_attention_heads of config.json.")
    num_kv_heads: int = _count("num_key_value_heads of config.json.")
    head_dim: int = _count("Head dimension (hidden_size / num_attention_heads).")
    intermediate_size: int = _count("intermediate_size of config.json.")
    params_b: float = _positive("Parameters, billions (model card).")
    vocab_size: int = _count("vocab_size of config.json.")
    max_position: int = _count("max_position_embeddings of config.json.")
    dtype: str = spec_field(help="Weights and KV dtype, e.g. bfloat16.")
    dtype_bytes: int = _count("Bytes per element of that dtype.")

    def kv_bytes_per_token(self) -> int:
        """K and V for every layer and KV head, whole model (all tensor-parallel ranks)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class StorageProfile:
    name: str = spec_field(help=_NAME)
    read_bandwidth_gb_s: float = _positive("Usable read bandwidth of the GDS path, GB/s.")
    write_bandwidth_gb_s: float = _positive("Usable write bandwidth, GB/s.")
    io_latency_us: float = spec_field(minimum=0, help="Round trip added per chunk I/O, us.")
    capacity_gb: float | None = spec_field(above=0, help="Capacity, GB (null: no cap).")
    # The export's own side, shared by every host mounting it (`kvops sim run --instances N`);
    # the figures above are one host's link. Null: not a shared export (e.g. a local drive).
    export_nodes: int | None = spec_field(
        None, minimum=1, help="Storage nodes serving the shared export's files (null: not shared)."
    )
    node_read_bandwidth_gb_s: float | None = spec_field(
        None, above=0, help="Read bandwidth one storage node serves to all hosts, GB/s."
    )
    node_write_bandwidth_gb_s: float | None = spec_field(
        None, above=0, help="Write bandwidth one storage node takes from all hosts, GB/s."
    )


P = TypeVar("P", GpuProfile, ModelProfile, StorageProfile)
_CLASSES: dict[str, type[Any]] = {
    "gpu": GpuProfile,
    "model": ModelProfile,
    "storage": StorageProfile,
}


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a YAML mapping")
    return data


def known_names(kind: Kind) -> list[str]:
    """Names of the shipped profiles of one kind, sorted."""
    names = []
    for path in sorted(PROFILE_DIR.glob("*.yaml")):
        if _read_yaml(path).get("kind") == kind:
            names.append(path.stem)
    return names


def _build(cls: type[P], path: Path, data: dict[str, Any]) -> P:
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", path.stem)
    try:
        return cls(**load_strict(cls, fields, str(path)))
    except ValueError as exc:
        raise ProfileError(str(exc)) from None


def profile_reference() -> str:
    """The keys of a profile file of each kind (`kind: gpu|model|storage` first)."""
    return "\n".join(
        f"kind: {kind}\n" + "\n".join("  " + ln for ln in reference(cls).splitlines())
        for kind, cls in _CLASSES.items()
    )


def load_profile(kind: Kind, name_or_path: str) -> Any:
    """A profile by shipped name or by path to a YAML file; ProfileError lists known names."""
    cls = _CLASSES[kind]
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        path = candidate
    else:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists() or _read_yaml(path).get("kind") != kind:
            known = ", ".join(known_names(kind))
            raise ProfileError(f"unknown {kind} profile '{name_or_path}'; known: {known}")
    data = _read_yaml(path)
    if data.get("kind", kind) != kind:
        raise ProfileError(f"{path}: kind is '{data.get('kind')}', expected '{kind}'")
    return _build(cls, path, data)


def load_gpu(name_or_path: str) -> GpuProfile:
    profile: GpuProfile = load_profile("gpu", name_or_path)
    return profile


def load_model(name_or_path: str) -> ModelProfile:
    profile: ModelProfile = load_profile("model", name_or_path)
    return profile


def load_storage(name_or_path: str) -> StorageProfile:
    profile: StorageProfile = load_profile("storage", name_or_path)
    return profile
