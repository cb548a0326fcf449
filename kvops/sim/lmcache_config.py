"""LMCache settings, read exactly as LMCache's in-process connector reads them.

Order (https://github.com/LMCache/LMCache/blob/dev/lmcache/v1/config.py): the YAML file named by
`LMCACHE_CONFIG_FILE`, then `LMCACHE_<KEY>` environment variables, then vLLM's
`kv_connector_extra_config` keys prefixed `lmcache.`. Unknown keys are warnings, not errors, as in
LMCache, so the same systemd unit and config file can drive the simulator or the real engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.errors import KvopsError
from kvops.parse.lmcache_config import DEFAULTS, effective_lmcache_config


class LMCacheConfigError(KvopsError, ValueError):
    """A setting LMCache itself would refuse at startup."""


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


# kvops' GDS offload engine (the embedded engines of `kvops ab-test`, `kvops sim run/sweep`):
# LMCache's GDS staging buffer, MiB of GPU memory (`gds_buffer_size`), taken from the KV cache.
DEFAULT_GDS_BUFFER_MIB = 8192


def gds_offload_keys(gds_buffer_mib: int, cpu_tier_gb: float) -> dict[str, object]:
    """LMCache keys (besides gds_path) of kvops' GDS offload engine: 256-token chunks, the GDS
    buffer, and a CPU DRAM tier in front of GDS only when `cpu_tier_gb` > 0 (LMCache's GDS
    docs configure none, so reused prefixes really come from storage)."""
    return {
        "chunk_size": 256,
        "local_cpu": cpu_tier_gb > 0,
        "max_local_cpu_size": cpu_tier_gb,
        "gds_buffer_size": gds_buffer_mib,
    }


# The LMCacheSettings fields the simulator models; every other key LMCache knows is accepted
# silently, as LMCache would, and unknown keys are LMCache's own warnings.
_MODELLED = (
    "chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size",
    "gds_path", "gds_buffer_size", "cufile_buffer_size", "use_gds", "save_unfull_chunk",
    "save_decode_cache", "extra_config",
)  # fmt: skip


# LMCache switches that change when loads happen (overlapped with compute, layer by layer); the
# model loads a whole prefix before the step that needs it, so it refuses them rather than
# pretend (https://docs.lmcache.ai/api_reference/configurations.html).
UNMODELLED_SWITCHES = ("enable_async_loading", "use_layerwise")


def load_lmcache_settings(
    env: Mapping[str, str] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> LMCacheSettings:
    """Settings from `LMCACHE_CONFIG_FILE`, `LMCACHE_*` env and `lmcache.*` connector keys,
    read by `kvops.parse.lmcache_config` (the reader `kvops validate` judges hosts with)."""
    env = os.environ if env is None else env
    settings = LMCacheSettings()
    config_file = env.get("LMCACHE_CONFIG_FILE")
    text: str | None = None
    if config_file:
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            raise LMCacheConfigError(
                f"cannot read LMCACHE_CONFIG_FILE {config_file}: {exc}"
            ) from exc
    else:
        settings.warnings.append(
            "No LMCache configuration file is set. Trying to read configurations "
            "from the environment variables."
        )
    config = effective_lmcache_config(text, env, extra_config)
    if config.error:
        raise LMCacheConfigError(f"{config_file}: LMCache config: {config.error}")
    settings.warnings += [w.replace("(source: file)", f"(source: file: {config_file})")
                          for w in config.warnings]  # fmt: skip
    for key in UNMODELLED_SWITCHES:
        if config.effective.get(key):
            raise LMCacheConfigError(
                f"{key}: true (from {config.sources.get(key, 'config')}) is not modelled by kvops "
                "sim: it would silently treat the overlapped loads as blocking and overstate "
                f"offload's latency; unset {key} (or set it false) to simulate this engine"
            )
    for key in _MODELLED:
        if key in config.unconverted:
            raise LMCacheConfigError(f"{key} from {config.unconverted[key]}: bad value")
        if key in config.effective:
            value = config.effective[key]
            if key == "extra_config":
                value = dict(value or {})
            elif value is None and DEFAULTS.get(key) is not None:
                raise LMCacheConfigError(f"{key} from {config.sources[key]}: empty value")
            setattr(settings, key, value)
    settings.validate()
    return settings
