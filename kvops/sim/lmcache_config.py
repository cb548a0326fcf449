"""LMCache settings, read exactly as LMCache's in-process connector reads them.

Order (lmcache/v1/config.py, lmcache_vllm.md section 1.1): the YAML file named by
`LMCACHE_CONFIG_FILE`, then `LMCACHE_<KEY>` environment variables, then vLLM's
`kv_connector_extra_config` keys prefixed `lmcache.`. Unknown keys are warnings, not errors, as in
LMCache, so the same systemd unit and config file can drive the simulator or the real engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from kvops.errors import KvopsError


class LMCacheConfigError(KvopsError, ValueError):
    """A setting LMCache itself would refuse at startup."""


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _to_opt_str(value: Any) -> str | None:
    return None if value is None or str(value).strip() in ("", "None", "null") else str(value)


def _to_opt_int(value: Any) -> int | None:
    return None if _to_opt_str(value) is None else int(value)


@dataclass
class LMCacheSettings:
    """The LMCache keys the simulator models; defaults are LMCache 0.5.6's."""

    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0  # GB
    local_disk: str | None = None
    max_local_disk_size: float = 0.0  # GB
    gds_path: str | None = None
    gds_buffer_size: int | None = None  # MiB of GPU VRAM (0.4.4+)
    cufile_buffer_size: int | None = None  # MiB, the same buffer under its <=0.4.3 name
    use_gds: bool = True
    save_unfull_chunk: bool = False
    save_decode_cache: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def staging_buffer_mib(self) -> int:
        """VRAM LMCache's GDS backend registers as its buffer (either key name)."""
        if self.gds_buffer_size is not None:
            return self.gds_buffer_size
        return self.cufile_buffer_size or 0

    @property
    def disk_io_threads(self) -> int:
        """Concurrent chunk-file I/Os (GdsBackend `extra_config.disk_io_threads`, default 4)."""
        return max(1, int(self.extra_config.get("disk_io_threads", 4)))

    def validate(self) -> None:
        if self.chunk_size <= 0:
            raise LMCacheConfigError(f"chunk_size must be positive, got {self.chunk_size}")
        if self.gds_path and self.gds_buffer_size is None and self.cufile_buffer_size is None:
            raise LMCacheConfigError(
                "gds_path is set but gds_buffer_size is not: LMCache's GDS backend asserts "
                "it (use cufile_buffer_size for lmcache <= 0.4.3)"
            )


_CONVERTERS: dict[str, Any] = {
    "chunk_size": int,
    "local_cpu": _to_bool,
    "max_local_cpu_size": float,
    "local_disk": _to_opt_str,
    "max_local_disk_size": float,
    "gds_path": _to_opt_str,
    "gds_buffer_size": _to_opt_int,
    "cufile_buffer_size": _to_opt_int,
    "use_gds": _to_bool,
    "save_unfull_chunk": _to_bool,
    "save_decode_cache": _to_bool,
}


def _apply(settings: LMCacheSettings, key: str, value: Any, source: str) -> None:
    if key == "extra_config":
        extra = json.loads(value) if isinstance(value, str) else value
        if not isinstance(extra, dict):
            raise LMCacheConfigError(f"extra_config from {source} must be a mapping")
        settings.extra_config = dict(extra)
        return
    converter = _CONVERTERS.get(key)
    if converter is None:
        settings.warnings.append(f"Unknown configuration key: {key} (source: {source})")
        return
    try:
        setattr(settings, key, converter(value))
    except (TypeError, ValueError) as exc:
        raise LMCacheConfigError(f"{key} from {source}: bad value {value!r}") from exc


# Keys LMCache knows but the simulator does not model: accepted silently, as LMCache would.
_KNOWN_UNMODELLED = {
    "remote_url", "remote_serde", "gds_path_sharding", "gds_backend", "blocking_timeout_secs",
    "enable_async_loading", "use_layerwise", "pre_caching_hash_algorithm", "lmcache_instance_id",
    "internal_api_server_enabled", "internal_api_server_port_start", "log_level",
}  # fmt: skip


def load_lmcache_settings(
    env: Mapping[str, str] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> LMCacheSettings:
    """Settings from `LMCACHE_CONFIG_FILE`, `LMCACHE_*` env and `lmcache.*` connector keys."""
    env = os.environ if env is None else env
    settings = LMCacheSettings()
    names = {f.name for f in fields(LMCacheSettings)} - {"warnings"}
    config_file = env.get("LMCACHE_CONFIG_FILE")
    if config_file:
        try:
            data = yaml.safe_load(Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise LMCacheConfigError(
                f"cannot read LMCACHE_CONFIG_FILE {config_file}: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise LMCacheConfigError(f"{config_file}: LMCache config must be a YAML mapping")
        for key, value in data.items():
            if key in _KNOWN_UNMODELLED:
                continue
            _apply(settings, str(key), value, f"file: {config_file}")
    else:
        settings.warnings.append(
            "No LMCache configuration file is set. Trying to read configurations "
            "from the environment variables."
        )
    for key in sorted(names):
        env_name = f"LMCACHE_{key.upper()}"
        if env_name in env:
            _apply(settings, key, env[env_name], f"env: {env_name}")
    for raw_key, value in (extra_config or {}).items():
        if raw_key.startswith("lmcache."):
            key = raw_key.removeprefix("lmcache.")
            if key not in _KNOWN_UNMODELLED:
                _apply(settings, key, value, "kv_connector_extra_config")
    settings.validate()
    return settings
