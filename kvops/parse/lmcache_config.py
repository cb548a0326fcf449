"""LMCache config as LMCache itself reads it: YAML file, then `LMCACHE_*` env overrides, then
vLLM `kv_connector_extra_config` keys prefixed `lmcache.` (shared/reference/lmcache_vllm.md §1.1).

LMCache only logs unknown keys and ignores them, so a key spelled for another version (e.g.
`cufile_buffer_size` on >= 0.4.4, renamed to `gds_buffer_size` without alias) is silently lost
and startup then fails an assertion. The parser therefore keeps *where* each key came from and
which keys the given version does not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvops.parse._common import version_tuple

# key → type, identical across 0.3.9 … 0.5.6 (lmcache_vllm.md §1.2)
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
}
_OLD_KEYS: dict[str, type] = {"cufile_buffer_size": int}  # <= 0.4.3
_NEW_KEYS: dict[str, type] = {  # >= 0.4.4
    "gds_buffer_size": int,
    "use_gds": bool,
    "gds_backend": str,
}
_GDS_PATH_SHARDING: dict[str, type] = {"gds_path_sharding": str}  # >= 0.4.3
RENAMED_IN = (0, 4, 4)
# LMCACHE_* variables that are not config keys.
NON_CONFIG_ENV = frozenset(
    {"LMCACHE_CONFIG_FILE", "LMCACHE_LOG_LEVEL", "LMCACHE_USE_EXPERIMENTAL", "LMCACHE_TRACK_USAGE"}
)


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


@dataclass
class LmcacheConfig:
    effective: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    file_keys: list[str] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "effective": self.effective,
            "sources": self.sources,
            "file_keys": self.file_keys,
            "unknown_keys": self.unknown_keys,
            "error": self.error,
            "warnings": self.warnings,
        }


def _coerce(raw: str, kind: type) -> Any:
    """Env values are strings; LMCache converts them by the key's declared type."""
    if kind is bool:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if kind is dict:
        return json.loads(raw)
    return kind(raw)


def _apply(
    result: LmcacheConfig, key: str, value: Any, source: str, known: dict[str, type]
) -> None:
    if key not in known:
        if key not in result.unknown_keys:
            result.unknown_keys.append(key)
        result.warnings.append(f"unknown key {key!r} from {source}: LMCache ignores it")
        return
    result.effective[key] = value
    result.sources[key] = source


def effective_lmcache_config(
    yaml_text: str | None,
    env: dict[str, str] | None = None,
    extra_config: dict[str, Any] | None = None,
    version: str | None = None,
) -> LmcacheConfig:
    """Merge file < env < kv_connector_extra_config as LMCache does. Never raises."""
    result = LmcacheConfig()
    known = known_keys(version)
    if yaml_text is not None:
        try:
            loaded = yaml.safe_load(yaml_text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
            result.error = f"{where}{getattr(exc, 'problem', None) or exc}"
            loaded = None
        if loaded is not None and not isinstance(loaded, dict):
            result.error = f"top level is {type(loaded).__name__}, expected a mapping"
            loaded = None
        for key, value in (loaded or {}).items():
            result.file_keys.append(str(key))
            _apply(result, str(key), value, "file", known)
    for name, raw in sorted((env or {}).items()):
        if not name.startswith("LMCACHE_") or name in NON_CONFIG_ENV:
            continue
        key = name[len("LMCACHE_") :].lower()
        if key not in known:
            result.warnings.append(f"env {name} is not a config key of this LMCache: ignored")
            continue
        try:
            _apply(result, key, _coerce(raw, known[key]), f"env {name}", known)
        except (ValueError, TypeError) as exc:
            result.warnings.append(f"env {name}={raw!r} not a valid {known[key].__name__}: {exc}")
    for name, value in (extra_config or {}).items():
        if name.startswith("lmcache."):
            _apply(result, name[len("lmcache.") :], value, "kv_connector_extra_config", known)
    return result
