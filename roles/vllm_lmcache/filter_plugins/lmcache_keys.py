"""Filters of the vllm_lmcache role: check an LMCache config dict against the keys and value types
the chosen LMCache version reads.

LMCache only logs an unknown key ("Unknown configuration key", lmcache/v1/config_base.py) and
carries on, and a value it cannot convert becomes None ("Failed to convert value"): a typo or a
key renamed between versions (``cufile_buffer_size`` up to 0.4.3, ``gds_buffer_size`` from 0.4.4)
turns into a slower or failing service without an error. The role therefore refuses such a
config before it changes anything. The key list is ``files/lmcache_keys.json``; a unit test keeps
it equal to ``kvops/parse/lmcache_config.py``, which ``kvops validate`` judges hosts with.
"""

from __future__ import annotations

import difflib
import re
from typing import Any


def _version(text: Any) -> tuple[int, ...]:
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not match:
        raise ValueError(f"not an LMCache version: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def lmcache_known_keys(key_doc: dict[str, Any], version: str) -> dict[str, str]:
    """{key: type name} for the keys LMCache ``version`` reads (``since``/``until`` inclusive)."""
    wanted = _version(version)
    known: dict[str, str] = {}
    for key, spec in key_doc["keys"].items():
        if "since" in spec and wanted < _version(spec["since"]):
            continue
        if "until" in spec and wanted > _version(spec["until"]):
            continue
        known[key] = spec["type"]
    return known


def lmcache_unknown_keys(
    config: dict[str, Any], key_doc: dict[str, Any], version: str, extra_known: list[str]
) -> list[dict[str, str]]:
    """[{"key", "closest"}] for top-level keys LMCache ``version`` would ignore.

    ``closest`` is the known rename (key_doc ``hints``, e.g. ``gds_io_threads`` is
    ``extra_config.disk_io_threads``) when one applies to this version, else the nearest spelling.
    """
    known = set(lmcache_known_keys(key_doc, version)) | set(extra_known)
    hints = key_doc.get("hints", {})
    result = []
    for key in config:
        if key in known:
            continue
        hint = hints.get(key, "")
        if hint and hint.split(".")[0] in known:
            closest = hint
        else:
            near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            closest = near[0] if near else ""
        result.append({"key": str(key), "closest": closest})
    return result


def _type_ok(value: Any, kind: str) -> bool:
    if value is None:
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    return isinstance(value, str)


def lmcache_type_errors(config: dict[str, Any], key_doc: dict[str, Any], version: str) -> list[str]:
    """Messages 'KEY must be TYPE (got VALUE)' for known keys whose value LMCache would fail to
    convert or misread (a quoted "false" is a non-empty string, not a boolean)."""
    known = lmcache_known_keys(key_doc, version)
    return [
        f"{key} must be {known[key]} (got {value!r})"
        for key, value in config.items()
        if key in known and not _type_ok(value, known[key])
    ]


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "lmcache_known_keys": lmcache_known_keys,
            "lmcache_unknown_keys": lmcache_unknown_keys,
            "lmcache_type_errors": lmcache_type_errors,
        }
