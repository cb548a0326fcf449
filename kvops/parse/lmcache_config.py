"""The one reader of LMCache's configuration, with LMCache's own precedence and value parsing.

Order (lmcache 0.5.6 `lmcache/v1/config.py`, `integration/vllm/utils.py`; public docs:
https://docs.lmcache.ai/api_reference/configurations.html): the YAML file named by
`LMCACHE_CONFIG_FILE`, then `LMCACHE_<KEY>` environment variables, then vLLM's
`kv_connector_extra_config` keys prefixed `lmcache.`.

Value parsing follows LMCache, not intuition, because a value LMCache reads differently from
what the operator meant is exactly the silent misconfiguration validate must catch:
- booleans: a real bool, else the string `true` or `1` (any case); everything else — `yes`,
  `on`, `enabled` — is False (`_to_bool` in `lmcache/v1/config.py`);
- a value that does not convert to the key's type is logged ("Failed to convert value") and
  becomes None, it does not keep the default;
- unknown file keys and unknown `lmcache.*` connector keys are warned about and ignored;
  misspelled `LMCACHE_*` variables are silently ignored by LMCache (kvops still says so).

Keys differ by version (e.g. `cufile_buffer_size` up to 0.4.3, `gds_buffer_size` from 0.4.4,
with no alias), so the reader keeps where every value came from and which keys were ignored.
Both `kvops validate` (on recorded evidence) and the simulator (`kvops.sim.lmcache_config`) use
this module, so the two never disagree on what a config means.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvops.parse._common import clip, clip_repr, version_tuple
from kvops.parse.host_yaml import HostYamlError, load_host_yaml

# key → type, identical across 0.3.9 … 0.5.6
_COMMON_KEYS: dict[str, type] = {
    "chunk_size": int,
    "local_cpu": bool,
    "max_local_cpu_size": float,
    "local_disk": str,
    "max_local_disk_size": float,
    "remote_url": str,
    "remote_serde": str,
    "save_decode_cache": bool,
    "save_unfull_chunk": bool,
    "gds_path": str,
    "extra_config": dict,
    "blocking_timeout_secs": int,
    "enable_async_loading": bool,
    "use_layerwise": bool,
    "pre_caching_hash_algorithm": str,
    "lmcache_instance_id": str,
    "internal_api_server_enabled": bool,
    "internal_api_server_port_start": int,
    "log_level": str,
}
_OLD_KEYS: dict[str, type] = {"cufile_buffer_size": int}  # <= 0.4.3
_NEW_KEYS: dict[str, type] = {  # >= 0.4.4
    "gds_buffer_size": int,
    "use_gds": bool,
    "gds_backend": str,
}
_GDS_PATH_SHARDING: dict[str, type] = {"gds_path_sharding": str}  # >= 0.4.3
RENAMED_IN = (0, 4, 4)

# LMCache 0.5.6 defaults (`_CONFIG_DEFINITIONS`) of the keys kvops judges or simulates.
DEFAULTS: dict[str, Any] = {
    "chunk_size": 256,
    "local_cpu": True,
    "max_local_cpu_size": 5.0,
    "local_disk": None,
    "max_local_disk_size": 0.0,
    "save_unfull_chunk": False,
    "save_decode_cache": False,
    "gds_path": None,
    "gds_buffer_size": None,
    "cufile_buffer_size": None,
    "use_gds": True,
    "gds_backend": "cufile",
    "extra_config": None,
    "pre_caching_hash_algorithm": "builtin",
    "blocking_timeout_secs": 10,
}

# LMCACHE_* variables that are not config keys.
NON_CONFIG_ENV = frozenset(
    {"LMCACHE_CONFIG_FILE", "LMCACHE_LOG_LEVEL", "LMCACHE_USE_EXPERIMENTAL", "LMCACHE_TRACK_USAGE"}
)
SOURCE_FILE = "file"
SOURCE_EXTRA = "kv_connector_extra_config"


def buffer_key_for(version: str | None) -> str | None:
    """`cufile_buffer_size` up to 0.4.3, `gds_buffer_size` from 0.4.4; None if unknown."""
    parsed = version_tuple(version)
    if parsed is None:
        return None
    return "gds_buffer_size" if parsed >= RENAMED_IN else "cufile_buffer_size"


def known_keys(version: str | None) -> dict[str, type]:
    """Keys the given LMCache version reads; both generations when the version is unknown."""
    parsed = version_tuple(version)
    keys = dict(_COMMON_KEYS)
    if parsed is None:
        return keys | _OLD_KEYS | _NEW_KEYS | _GDS_PATH_SHARDING
    if parsed >= (0, 4, 3):
        keys |= _GDS_PATH_SHARDING
    return keys | (_NEW_KEYS if parsed >= RENAMED_IN else _OLD_KEYS)


def to_bool(value: Any) -> bool:
    """LMCache's boolean: a bool as is, else only the strings `true`/`1` (any case) are True."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


def _to_dict(value: Any) -> dict[str, Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, dict):
        raise ValueError("expected a mapping")
    return dict(parsed)


def _to_str(value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise ValueError("expected a string")
    return str(value)


_CONVERTERS: dict[type, Callable[[Any], Any]] = {
    bool: to_bool,
    int: int,
    float: float,
    str: _to_str,
    dict: _to_dict,
}


def convert(value: Any, kind: type) -> Any:
    """Value as LMCache stores it for a key of this type; raises ValueError/TypeError when
    LMCache would log "Failed to convert value" (the caller then stores None)."""
    if value is None:
        return None
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return _CONVERTERS[kind](value)


@dataclass
class LmcacheConfig:
    """What LMCache will run with: explicitly set keys (`effective`) and where each came from."""

    effective: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    file_keys: list[str] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)
    # key → "<source>: <raw value>" for values LMCache fails to convert and sets to None
    unconverted: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def value(self, key: str) -> Any:
        """The effective value, LMCache's default when nothing set it."""
        return self.effective[key] if key in self.effective else DEFAULTS.get(key)

    def is_set(self, key: str) -> bool:
        """Whether the operator set the key (LMCache's `_user_set_keys`: auto-detection of
        tmpfs/overlay only disables GDS when `use_gds` was not set)."""
        return key in self.effective

    def to_dict(self) -> dict[str, Any]:
        return {
            "effective": self.effective,
            "sources": self.sources,
            "file_keys": self.file_keys,
            "unknown_keys": self.unknown_keys,
            "unconverted": self.unconverted,
            "error": self.error,
            "warnings": self.warnings,
        }


def _apply(
    result: LmcacheConfig, key: str, value: Any, source: str, known: dict[str, type]
) -> None:
    if key not in known:
        if key not in result.unknown_keys:
            result.unknown_keys.append(key)
        result.warnings.append(f"Unknown configuration key: {clip(key)} (source: {source})")
        return
    try:
        converted = convert(value, known[key])
    except (ValueError, TypeError) as exc:
        converted = None
        result.unconverted[key] = f"{source}: {clip_repr(value)}"
        result.warnings.append(
            f"Failed to convert value {clip_repr(value)} of {key} ({source}) to "
            f"{known[key].__name__}: {clip(str(exc))}; LMCache uses None"
        )
    else:
        result.unconverted.pop(key, None)
    result.effective[key] = converted
    result.sources[key] = source


def _load_yaml(result: LmcacheConfig, yaml_text: str) -> dict[Any, Any]:
    try:
        loaded = load_host_yaml(yaml_text)
    except HostYamlError as exc:
        result.error = str(exc)
        return {}
    if loaded is not None and not isinstance(loaded, dict):
        result.error = f"top level is {type(loaded).__name__}, expected a mapping"
        return {}
    return loaded or {}


def effective_lmcache_config(
    yaml_text: str | None,
    env: Mapping[str, str] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    version: str | None = None,
) -> LmcacheConfig:
    """Merge file < env < kv_connector_extra_config as LMCache does. Never raises."""
    result = LmcacheConfig()
    known = known_keys(version)
    if yaml_text is not None:
        for key, value in _load_yaml(result, yaml_text).items():
            result.file_keys.append(str(key))
            _apply(result, str(key), value, SOURCE_FILE, known)
    for name, raw in sorted((env or {}).items()):
        if not name.startswith("LMCACHE_") or name in NON_CONFIG_ENV:
            continue
        key = name[len("LMCACHE_") :].lower()
        if key not in known:
            result.warnings.append(f"env {name} is not a config key of this LMCache: ignored")
            continue
        _apply(result, key, raw, f"env {name}", known)
    for name, value in (extra_config or {}).items():
        if name.startswith("lmcache."):
            _apply(result, name[len("lmcache.") :], value, SOURCE_EXTRA, known)
    return result
