"""Hardware and model profiles: YAML data files under `kvops/sim/profiles/`, one per profile.

Each file carries `kind` (`gpu`, `model` or `storage`) and the fields of that kind; its name is
the file stem. A profile may also be given by path to a YAML file of the same shape, so users can
describe their own hardware without touching the package. Every number in the shipped files has
its public source in a comment: the simulator's costs come from these numbers and nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from kvops.errors import KvopsError

PROFILE_DIR = Path(__file__).parent / "profiles"
Kind = Literal["gpu", "model", "storage"]


class ProfileError(KvopsError, ValueError):
    """A profile name that is not known, or a profile file that is malformed."""


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_mib: float
    hbm_bandwidth_gb_s: float
    bf16_dense_tflops: float
    prefill_mfu: float
    hbm_efficiency: float
    step_overhead_ms: float
    runtime_overhead_gib: float


@dataclass(frozen=True)
class ModelProfile:
    name: str
    hf_name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    params_b: float
    vocab_size: int
    max_position: int
    dtype: str
    dtype_bytes: int

    def kv_bytes_per_token(self) -> int:
        """K and V for every layer and KV head, whole model (all tensor-parallel ranks)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class StorageProfile:
    name: str
    read_bandwidth_gb_s: float
    write_bandwidth_gb_s: float
    io_latency_us: float
    capacity_gb: float | None


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
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "name":
            values["name"] = str(data.get("name", path.stem))
            continue
        if f.name not in data:
            raise ProfileError(f"{path}: missing field '{f.name}'")
        value = data[f.name]
        want = str(f.type)
        try:
            if value is None and "None" in want:
                values[f.name] = None
            elif want.startswith("int"):
                values[f.name] = int(value)
            elif want.startswith("float"):
                values[f.name] = float(value)
            else:
                values[f.name] = str(value)
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"{path}: field '{f.name}' has a bad value {value!r}") from exc
    return cls(**values)


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
